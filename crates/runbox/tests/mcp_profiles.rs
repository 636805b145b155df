//! Compatibility profiles through a real MCP client (`runbox serve --profile NAME`): each
//! profile's exact tool list, arguments and answer shapes, a full flow where the profile
//! keeps state, failures in the seed server's shapes and, as there, in ordinary content
//! (never `isError`), the data resources and the prompt of `novita-tutorial`, the
//! `sandbox://environments` resource of `code-sandbox-mcp`, and `--pass-through-env` (the
//! one way host variables enter a sandbox).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::collections::BTreeSet;
use std::process::Stdio;

use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams, ResourceContents};
use rmcp::service::ClientServiceExt;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use util::mcp::*;

/// The tools a client sees, by name.
async fn tool_names(client: &Client) -> BTreeSet<String> {
    client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

fn names(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// Each tool's argument names and which are required.
async fn arguments(client: &Client) -> Vec<(String, BTreeSet<String>, BTreeSet<String>)> {
    let mut out: Vec<_> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| {
            let props = t
                .input_schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let required = t
                .input_schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            (t.name.to_string(), props, required)
        })
        .collect();
    out.sort();
    out
}

/// The JSON object an answer's single text block holds; `structuredContent`, when there is
/// one, is the same object.
fn object(r: &rmcp::model::CallToolResult) -> Value {
    let texts: Vec<_> = r.content.iter().filter_map(|c| c.as_text()).collect();
    assert_eq!(texts.len(), 1, "{:?}", r.content);
    let v: Value = serde_json::from_str(&texts[0].text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", texts[0].text));
    if let Some(s) = &r.structured_content {
        assert_eq!(s, &v, "structuredContent differs from the text");
    }
    v
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

/// A stdio client of `runbox serve --stdio ARGS` whose environment also holds `env`.
async fn stdio_client_with_env(args: &[&str], env: &[(&str, &str)]) -> Client {
    let mut all = vec!["--stdio"];
    all.extend_from_slice(args);
    let mut command = serve_command(&all);
    for (k, v) in env {
        command.env(k, v);
    }
    let transport = TokioChildProcess::builder(command)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
        .0;
    Recorder::default()
        .serve_with_lifecycle(transport, lifecycle(Revision::Stateless))
        .await
        .unwrap()
}

/// The operator's data directory of the tutorial: the user's portfolio.
fn portfolio_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.path().join("user_stock_portfolio.json"),
        r#"{"holdings": [{"ticker": "SPY", "quantity": 4, "avg_purchase_price": 670.13}]}"#,
    )
    .unwrap();
    dir
}

async fn novita_flow(client: &Client, revision: Revision) {
    assert_eq!(
        tool_names(client).await,
        names(&[
            "create_sandbox_session",
            "run_on_command_line",
            "run_python_code",
            "stop_sandbox_session",
        ])
    );
    let args = arguments(client).await;
    let expect = |name: &str, props: &[&str], required: &[&str]| {
        (name.to_owned(), names(props), names(required))
    };
    assert_eq!(
        args,
        [
            expect("create_sandbox_session", &[], &[]),
            expect(
                "run_on_command_line",
                &["command_line", "sandbox_id"],
                &["command_line", "sandbox_id"]
            ),
            expect(
                "run_python_code",
                &["python_code", "sandbox_id"],
                &["python_code", "sandbox_id"]
            ),
            expect("stop_sandbox_session", &["sandbox_id"], &["sandbox_id"]),
        ]
    );
    if revision == Revision::Legacy {
        let info = client.peer_info().unwrap();
        let instructions = info.instructions.clone().unwrap_or_default();
        assert!(
            instructions.contains("create_sandbox_session"),
            "{instructions}"
        );
    }

    // Create: text with the id, and FastMCP's {"result": text} for a tool returning str.
    let tools = client.list_all_tools().await.unwrap();
    for name in ["create_sandbox_session", "stop_sandbox_session"] {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        let schema = Value::Object((**tool.output_schema.as_ref().unwrap()).clone());
        assert_eq!(schema["properties"]["result"]["type"], "string", "{schema}");
        assert_eq!(schema["required"], json!(["result"]));
    }
    for name in ["run_python_code", "run_on_command_line"] {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        assert!(tool.output_schema.is_none(), "a dict answer has no schema");
    }
    let r = call(client, "create_sandbox_session", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let t = text(&r);
    assert_eq!(r.structured_content, Some(json!({ "result": t })));
    let id = t
        .strip_prefix("Successfully created sandbox. Sandbox ID: ")
        .unwrap_or_else(|| panic!("{t}"))
        .to_owned();
    assert!(id.starts_with("sbx_"), "{id}");

    // Python keeps state between calls; outputs, logs and error as the tutorial shows them.
    let r = call(
        client,
        "run_python_code",
        json!({"sandbox_id": id, "python_code": "import math\nx = math.factorial(5)\nprint('x is', x)\nprint('two lines')"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        object(&r),
        json!({
            "outputs": [],
            "logs": {"stdout": ["x is 120\n", "two lines\n"], "stderr": []},
            "error": null,
        })
    );
    assert!(r.structured_content.is_none(), "as FastMCP answers a dict");
    let t = text(&r);
    assert!(
        t.find("\"outputs\"").unwrap() < t.find("\"logs\"").unwrap()
            && t.find("\"logs\"").unwrap() < t.find("\"error\"").unwrap(),
        "the tutorial's order: {t}"
    );
    let r = call(
        client,
        "run_python_code",
        json!({"sandbox_id": id, "python_code": "import sys\nprint('warn', file=sys.stderr)\nx * 2"}),
    )
    .await;
    assert_eq!(
        object(&r),
        json!({
            "outputs": [{"text": "240", "is_main_result": true}],
            "logs": {"stdout": [], "stderr": ["warn\n"]},
            "error": null,
        })
    );
    // Rich results keep their formats; results with an image are left out, as in the seed.
    let r = call(
        client,
        "run_python_code",
        json!({"sandbox_id": id, "python_code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nimport pandas as pd\npd.DataFrame({'a': [1]})"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let v = object(&r);
    let outputs = v["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{v}");
    assert!(
        outputs[0]["html"].as_str().unwrap().contains("<table"),
        "{v}"
    );
    assert!(outputs[0]["text"].as_str().unwrap().contains('a'), "{v}");
    assert!(r.content.iter().all(|c| c.as_image().is_none()));
    // An exception: the error object, in ordinary content as the tutorial answered it.
    let r = call(
        client,
        "run_python_code",
        json!({"sandbox_id": id, "python_code": "print('before')\n1 / 0"}),
    )
    .await;
    assert!(!is_error(&r));
    let v = object(&r);
    assert_eq!(keys(&v), ["error", "logs", "outputs"]);
    assert_eq!(v["logs"]["stdout"], json!(["before\n"]));
    assert_eq!(v["error"]["name"], "ZeroDivisionError");
    assert_eq!(v["error"]["value"], "division by zero");
    assert!(
        v["error"]["traceback"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{v}"
    );

    // The command line: output and "execution error".
    let r = call(
        client,
        "run_on_command_line",
        json!({"sandbox_id": id, "command_line": "echo hi; echo oops >&2; pwd; head -c 13 /data/user_stock_portfolio.json"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        object(&r),
        json!({
            "output": {
                "stdout": "hi\n/workspace\n{\"holdings\": ",
                "stderr": "oops\n",
                "exit_code": 0,
                "error": null,
            },
            "execution error": null,
        })
    );
    // A non-zero exit: the SDK raised, and the tutorial answered with the exception's text.
    let r = call(
        client,
        "run_on_command_line",
        json!({"sandbox_id": id, "command_line": "echo partial; echo bad >&2; exit 3"}),
    )
    .await;
    assert!(!is_error(&r));
    assert_eq!(
        object(&r),
        json!({"output": null, "execution error": "Command exited with code 3 and error:\nbad\n"})
    );

    // Stop, then every tool says the sandbox is gone, in its own shape.
    let r = call(client, "stop_sandbox_session", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r));
    assert_eq!(text(&r), format!("Successfully killed Sandbox ID: {id}"));
    let r = call(
        client,
        "run_python_code",
        json!({"sandbox_id": id, "python_code": "1"}),
    )
    .await;
    assert!(!is_error(&r));
    let v = object(&r);
    assert_eq!(keys(&v), ["error"], "the tutorial's {{\"error\": str(e)}}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains(&id) && e.contains("create_sandbox_session"),
        "{v}"
    );
    let r = call(
        client,
        "run_on_command_line",
        json!({"sandbox_id": id, "command_line": "true"}),
    )
    .await;
    assert!(!is_error(&r));
    let v = object(&r);
    assert_eq!(v["output"], Value::Null);
    assert!(v["execution error"].as_str().unwrap().contains(&id), "{v}");
    let r = call(client, "stop_sandbox_session", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r));
    let t = text(&r);
    assert!(
        t.starts_with(&format!("Failed to kill Sandbox ID: {id}\n ")) && t.contains("not found"),
        "{t}"
    );

    // The data resources of the tutorial, by file name without the extension.
    let resources = client.list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, ["data://user_stock_portfolio"]);
    let mut read = client
        .read_resource(ReadResourceRequestParams::new(
            "data://user_stock_portfolio",
        ))
        .await
        .unwrap();
    match read.contents.remove(0) {
        ResourceContents::TextResourceContents { text, .. } => {
            assert!(text.contains("\"SPY\""), "{text}");
        }
        other => panic!("not text: {other:?}"),
    }

    // The prompt: create first, then run, stop when done; packages; the data files.
    let prompts = client.list_all_prompts().await.unwrap();
    let prompt_names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(prompt_names, ["instructions_for_sandbox_use"]);
    let p = client
        .get_prompt(GetPromptRequestParams::new("instructions_for_sandbox_use"))
        .await
        .unwrap();
    let body = p.messages[0].content.as_text().unwrap().text.clone();
    for needle in [
        "create_sandbox_session()",
        "run_python_code()",
        "run_on_command_line()",
        "stop_sandbox_session()",
        "pip install",
        "900 seconds",
        "/data/user_stock_portfolio.json",
        "data://user_stock_portfolio",
    ] {
        assert!(body.contains(needle), "{needle} missing from: {body}");
    }
    assert!(
        client
            .get_prompt(GetPromptRequestParams::new("sandbox_instructions"))
            .await
            .is_err(),
        "runbox's own prompt is not offered"
    );
}

#[tokio::test]
async fn novita_tutorial_over_http_with_a_bearer_key() {
    let data = portfolio_dir();
    let dir = data.path().to_str().unwrap();
    let server = HttpServer::start(&[
        "--profile",
        "novita-tutorial",
        "--pool",
        "0",
        "--data-dir",
        dir,
    ])
    .await;
    // The tutorial's client sends its key as a bearer token; the server takes it.
    let config = StreamableHttpClientTransportConfig::with_uri(server.url.clone())
        .auth_header("novita-api-key");
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = Recorder::default()
        .serve_with_lifecycle(transport, lifecycle(Revision::Legacy))
        .await
        .unwrap();
    novita_flow(&client, Revision::Legacy).await;
    client.cancel().await.unwrap();
    // And the stateless revision.
    let (client, _) = server.client(Revision::Stateless).await;
    let r = call(&client, "create_sandbox_session", json!({})).await;
    assert!(text(&r).starts_with("Successfully created sandbox."));
    client.cancel().await.unwrap();
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn novita_tutorial_over_stdio() {
    let data = portfolio_dir();
    let dir = data.path().to_str().unwrap();
    let (client, _) = stdio_client(
        &[
            "--profile",
            "novita-tutorial",
            "--pool",
            "0",
            "--data-dir",
            dir,
        ],
        Revision::Stateless,
    )
    .await;
    novita_flow(&client, Revision::Stateless).await;
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn code_sandbox_mcp_runs_each_call_in_a_fresh_sandbox() {
    let client = stdio_client_with_env(
        &[
            "--profile",
            "code-sandbox-mcp",
            "--pool",
            "1",
            "--run-timeout",
            "5",
            "--pass-through-env",
            "RUNBOX_TEST_PASSED",
        ],
        &[
            ("RUNBOX_TEST_PASSED", "passed-value-123"),
            ("RUNBOX_TEST_HIDDEN", "hidden-value-456"),
        ],
    )
    .await;
    assert_eq!(
        tool_names(&client).await,
        names(&["run_javascript_code", "run_python_code"])
    );
    for (_, props, required) in arguments(&client).await {
        assert_eq!((props, required), (names(&["code"]), names(&["code"])));
    }
    assert!(client.list_all_prompts().await.unwrap().is_empty());

    // Both tools declare FastMCP's schema of a TextContent, as the original's did.
    for tool in client.list_all_tools().await.unwrap() {
        let schema = Value::Object((**tool.output_schema.as_ref().unwrap()).clone());
        assert_eq!(schema["title"], "TextContent", "{schema}");
    }
    // Success: the trimmed stdout, and the TextContent as structuredContent.
    let r = call(
        &client,
        "run_python_code",
        json!({"code": "print('  hello  ')\nprint()"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(text(&r), "hello");
    assert_eq!(r.content.len(), 1);
    assert_eq!(
        r.structured_content,
        Some(json!({"type": "text", "text": "hello", "annotations": null, "_meta": null}))
    );
    // No output: the original's ExecutionResult, as it wrote it.
    let r = call(&client, "run_python_code", json!({"code": "x = 1"})).await;
    assert!(!is_error(&r));
    assert_eq!(
        text(&r),
        "{\n  \"exit_code\": 1,\n  \"stderr\": \"No output, forgot print()?\",\n  \"stdout\": \"\"\n}"
    );
    // A fresh sandbox each call: x is gone, and the failure is {exit_code, stderr, stdout}
    // in ordinary content, never isError (fastmcp would raise ToolError).
    let r = call(&client, "run_python_code", json!({"code": "print(x)"})).await;
    assert!(!is_error(&r));
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(keys(&v), ["exit_code", "stderr", "stdout"]);
    assert_eq!(v["exit_code"], 1);
    assert!(v["stderr"].as_str().unwrap().contains("NameError"), "{v}");

    // JavaScript alike.
    let r = call(
        &client,
        "run_javascript_code",
        json!({"code": "console.log(6 * 7)"}),
    )
    .await;
    assert_eq!((text(&r).as_str(), is_error(&r)), ("42", false));
    let r = call(&client, "run_javascript_code", json!({"code": "1 + 1"})).await;
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(
        v["stderr"], "No output, forgot console.logs?",
        "the original's words"
    );
    let r = call(
        &client,
        "run_javascript_code",
        json!({"code": "throw new Error('boom')"}),
    )
    .await;
    assert!(!is_error(&r));
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(v["exit_code"], 1);
    assert!(v["stderr"].as_str().unwrap().contains("boom"), "{v}");

    // A run past the timeout is stopped, and says so.
    let r = call(
        &client,
        "run_python_code",
        json!({"code": "import time\ntime.sleep(60)"}),
    )
    .await;
    assert!(!is_error(&r));
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(v["exit_code"], 1, "{v}");
    assert!(v["stderr"].as_str().unwrap().contains("timeout"), "{v}");

    // The passed variable is in every sandbox (pooled ones too); no other host variable is.
    let code = "import os\nprint(os.environ.get('RUNBOX_TEST_PASSED'), os.environ.get('RUNBOX_TEST_HIDDEN'), os.environ.get('RUNBOX_PASS_THROUGH_ENV'))";
    for _ in 0..2 {
        let r = call(&client, "run_python_code", json!({"code": code})).await;
        assert_eq!(text(&r), "passed-value-123 None None");
    }
    let r = call(
        &client,
        "run_javascript_code",
        json!({"code": "console.log(process.env.RUNBOX_TEST_PASSED, process.env.RUNBOX_TEST_HIDDEN)"}),
    )
    .await;
    assert_eq!(text(&r), "passed-value-123 undefined");
    client.cancel().await.unwrap();
}

/// The original's containers had a network, and its resource `sandbox://environments`
/// described the languages: so do the profile's sandboxes and resource.
#[tokio::test]
async fn code_sandbox_mcp_has_a_network_and_describes_its_environments() {
    let (client, _) = stdio_client(
        &[
            "--profile",
            "code-sandbox-mcp",
            "--pool",
            "0",
            "--allow-host",
            "example.org",
        ],
        Revision::Legacy,
    )
    .await;
    // The proxy is in the sandbox's environment and lets through only the allowed host.
    let code = "import os, socket\nproxy = os.environ['HTTPS_PROXY'].rsplit(':', 1)\n\
                s = socket.create_connection((proxy[0].split('//')[1], int(proxy[1])), timeout=20)\n\
                s.sendall(b'CONNECT elsewhere.invalid:443 HTTP/1.1\\r\\nHost: elsewhere.invalid:443\\r\\n\\r\\n')\n\
                print(s.recv(4096).split(b' ')[1].decode())";
    let r = call(&client, "run_python_code", json!({ "code": code })).await;
    assert_eq!(text(&r), "403", "a proxy that refuses hosts off the list");

    let resources = client.list_all_resources().await.unwrap();
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert_eq!(
        (
            resources[0].uri.as_str(),
            resources[0].name.as_str(),
            resources[0].mime_type.as_deref()
        ),
        (
            "sandbox://environments",
            "environment_details",
            Some("text/plain")
        )
    );
    let mut read = client
        .read_resource(ReadResourceRequestParams::new("sandbox://environments"))
        .await
        .unwrap();
    let ResourceContents::TextResourceContents { text: body, .. } = read.contents.remove(0) else {
        panic!("not text")
    };
    assert!(
        body.starts_with("{\n  \"python\": {\n    \"image\": "),
        "{body}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(keys(&v), ["javascript", "python"]);
    assert!(
        v["python"]["image"].as_str().unwrap().contains("Python 3."),
        "{v}"
    );
    let libraries = v["python"]["installed_libraries"].as_str().unwrap();
    assert!(
        libraries.contains("matplotlib") && libraries.contains("pandas"),
        "{libraries}"
    );
    assert!(
        v["javascript"]["image"]
            .as_str()
            .unwrap()
            .contains("Node.js v"),
        "{v}"
    );
    assert_eq!(keys(&v["javascript"]), ["image", "installed_libraries"]);
    client.cancel().await.unwrap();

    // Without allowed hosts there is no network, as for every sandbox then.
    let (client, _) = stdio_client(
        &[
            "--profile",
            "code-sandbox-mcp",
            "--pool",
            "0",
            "--allow-host",
            "none",
        ],
        Revision::Legacy,
    )
    .await;
    let r = call(
        &client,
        "run_python_code",
        json!({"code": "import os\nprint(os.environ.get('HTTPS_PROXY'))"}),
    )
    .await;
    assert_eq!(text(&r), "None");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn mcp_code_sandbox_sessions_are_named_by_the_caller() {
    let client = stdio_client_with_env(
        &[
            "--profile",
            "mcp-code-sandbox",
            "--pool",
            "0",
            "--pass-through-env",
            "RUNBOX_TEST_PASSED",
        ],
        &[
            ("RUNBOX_TEST_PASSED", "passed-value-789"),
            ("RUNBOX_TEST_HIDDEN", "hidden"),
        ],
    )
    .await;
    assert_eq!(
        tool_names(&client).await,
        names(&[
            "close_sandbox",
            "create_run_close",
            "create_sandbox",
            "execute_code",
            "get_sandbox_status",
            "install_package",
            "list_files",
            "read_file",
            "upload_file",
            "write_file",
        ])
    );
    let args = arguments(&client).await;
    let expect = |name: &str, props: &[&str], required: &[&str]| {
        (name.to_owned(), names(props), names(required))
    };
    assert_eq!(
        args,
        [
            expect("close_sandbox", &["session_id"], &["session_id"]),
            expect("create_run_close", &["code"], &["code"]),
            expect("create_sandbox", &["session_id"], &["session_id"]),
            expect(
                "execute_code",
                &["code", "session_id"],
                &["code", "session_id"]
            ),
            expect("get_sandbox_status", &["session_id"], &[]),
            expect(
                "install_package",
                &["package_name", "session_id"],
                &["package_name", "session_id"]
            ),
            expect("list_files", &["path", "session_id"], &["session_id"]),
            expect(
                "read_file",
                &["file_path", "session_id"],
                &["file_path", "session_id"]
            ),
            expect(
                "upload_file",
                &[
                    "destination_path",
                    "file_content",
                    "file_name",
                    "session_id"
                ],
                &["file_content", "file_name", "session_id"]
            ),
            expect(
                "write_file",
                &["content", "file_path", "session_id"],
                &["content", "file_path", "session_id"]
            ),
        ]
    );
    assert!(client.list_all_prompts().await.unwrap().is_empty());

    // No sessions yet.
    let r = call(&client, "get_sandbox_status", json!({})).await;
    assert_eq!(
        object(&r),
        json!({"active_sandbox_count": 0, "active_sessions": [], "interpreter_type": "local"})
    );
    assert!(r.structured_content.is_some());

    // Create, once per name.
    let r = call(&client, "create_sandbox", json!({"session_id": "s1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(text(&r), "Sandbox created successfully with session ID: s1");
    let r = call(&client, "create_sandbox", json!({"session_id": "s1"})).await;
    assert!(!is_error(&r));
    assert_eq!(text(&r), "Sandbox with session ID s1 already exists.");
    let r = call(&client, "get_sandbox_status", json!({})).await;
    assert_eq!(
        object(&r),
        json!({"active_sandbox_count": 1, "active_sessions": ["s1"], "interpreter_type": "local"})
    );
    let r = call(&client, "get_sandbox_status", json!({"session_id": "s1"})).await;
    assert_eq!(
        object(&r),
        json!({"status": "active", "session_id": "s1", "interpreter_type": "local"})
    );
    let r = call(&client, "get_sandbox_status", json!({"session_id": "s9"})).await;
    assert!(!is_error(&r));
    assert_eq!(
        object(&r),
        json!({"error": "No sandbox found with session ID: s9"})
    );

    // Code keeps state within the session.
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "s1", "code": "import math, os\nv = math.factorial(5)\nprint(v)\nprint(os.environ.get('RUNBOX_TEST_PASSED'), os.environ.get('RUNBOX_TEST_HIDDEN'))"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        object(&r),
        json!({
            "logs": {"stdout": ["120\n", "passed-value-789 None\n"], "stderr": []},
            "error": null,
        })
    );
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "s1", "code": "print(v * 2)"}),
    )
    .await;
    assert_eq!(object(&r)["logs"]["stdout"], json!(["240\n"]));
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "s1", "code": "1 / 0"}),
    )
    .await;
    assert!(!is_error(&r));
    let v = object(&r);
    assert_eq!(keys(&v), ["error", "logs"]);
    assert_eq!(v["error"]["name"], "ZeroDivisionError");
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "nope", "code": "1"}),
    )
    .await;
    assert!(!is_error(&r));
    assert_eq!(
        object(&r),
        json!({"error": "No sandbox found with session ID: nope. Create a sandbox first."})
    );

    // Files: / is the sandbox's home, /workspace, and every path answered is one code
    // opens as it is.
    let r = call(
        &client,
        "write_file",
        json!({"session_id": "s1", "file_path": "/notes/a.txt", "content": "hello"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        object(&r),
        json!({"path": "/workspace/notes/a.txt", "message": "File written successfully"})
    );
    let r = call(
        &client,
        "upload_file",
        json!({"session_id": "s1", "file_name": "b.csv", "file_content": "x,y\n1,2\n"}),
    )
    .await;
    assert_eq!(
        object(&r),
        json!({"path": "/workspace/b.csv", "message": "File uploaded successfully"})
    );
    let r = call(
        &client,
        "upload_file",
        json!({"session_id": "s1", "file_name": "c.txt", "file_content": "c", "destination_path": "/sub"}),
    )
    .await;
    let c_path = object(&r)["path"].as_str().unwrap().to_owned();
    assert_eq!(c_path, "/workspace/sub/c.txt");
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "s1", "code": format!("print(open('/workspace/notes/a.txt').read(), open('{c_path}').read(), open('/workspace/b.csv').read().split()[0])")}),
    )
    .await;
    assert_eq!(object(&r)["logs"]["stdout"], json!(["hello c x,y\n"]));
    let r = call(&client, "list_files", json!({"session_id": "s1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let v = object(&r);
    assert_eq!(
        v["path"], "/workspace",
        "the listed directory, as the entries' paths say"
    );
    // Hidden entries (a network sandbox's package folder) aside.
    let files: Vec<&Value> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| !f["name"].as_str().unwrap().starts_with('.'))
        .collect();
    let listed: Vec<(&str, &str, &str)> = files
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap(),
                f["type"].as_str().unwrap(),
                f["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("b.csv", "file", "/workspace/b.csv"),
            ("notes", "dir", "/workspace/notes"),
            ("sub", "dir", "/workspace/sub"),
        ]
    );
    assert_eq!(files[0]["size"], 8);
    assert!(files[0]["modified_time"].is_string());
    let r = call(
        &client,
        "list_files",
        json!({"session_id": "s1", "path": "/notes"}),
    )
    .await;
    let v = object(&r);
    assert_eq!(
        (v["path"].as_str(), v["files"][0]["path"].as_str()),
        (Some("/workspace/notes"), Some("/workspace/notes/a.txt"))
    );
    // Paths answered are taken back as they are.
    let r = call(
        &client,
        "list_files",
        json!({"session_id": "s1", "path": "/workspace/notes"}),
    )
    .await;
    assert_eq!(object(&r)["files"][0]["name"], "a.txt");
    let r = call(
        &client,
        "read_file",
        json!({"session_id": "s1", "file_path": "/b.csv"}),
    )
    .await;
    assert_eq!(
        object(&r),
        json!({"path": "/workspace/b.csv", "content": "x,y\n1,2\n"})
    );
    // Host paths stay out of reach: /etc is the sandbox home's, `..` cannot climb out.
    for path in ["/etc/passwd", "/../../etc/passwd", "../etc/passwd"] {
        let r = call(
            &client,
            "read_file",
            json!({"session_id": "s1", "file_path": path}),
        )
        .await;
        assert!(!is_error(&r), "{path}: {}", text(&r));
        let v = object(&r);
        assert_eq!(keys(&v), ["error"]);
        assert!(!text(&r).contains("root:x"), "{path}: {}", text(&r));
    }

    // Packages: the name is one argument of pip, never an option or shell text.
    let r = call(
        &client,
        "install_package",
        json!({"session_id": "s1", "package_name": "--index-url=http://example.com/"}),
    )
    .await;
    assert!(!is_error(&r));
    let v = object(&r);
    assert_eq!(keys(&v), ["error"]);
    let e = v["error"].as_str().unwrap();
    assert!(
        e.starts_with("Error installing package: ") && e.contains("option"),
        "{v}"
    );
    let r = call(
        &client,
        "install_package",
        json!({"session_id": "s1", "package_name": "six"}),
    )
    .await;
    let v = object(&r);
    assert_eq!(keys(&v), ["error", "output", "package"]);
    assert_eq!(v["package"], "six");
    assert_eq!(keys(&v["output"]), ["stderr", "stdout"]);
    assert!(!is_error(&r), "{v}");

    // One-off runs leave the sessions alone.
    let r = call(
        &client,
        "create_run_close",
        json!({"code": "print('once')"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        object(&r),
        json!({
            "logs": {"stdout": ["once\n"], "stderr": []},
            "error": null,
            "sandbox_status": "created and will be closed automatically",
            "sandbox_closed": true,
            "sandbox_removed": true,
        })
    );
    let r = call(&client, "get_sandbox_status", json!({})).await;
    assert_eq!(object(&r)["active_sessions"], json!(["s1"]));

    // Close forgets the name; closing again is not an error, as in the seed.
    let r = call(&client, "close_sandbox", json!({"session_id": "s1"})).await;
    assert!(!is_error(&r));
    assert_eq!(
        text(&r),
        "Sandbox with session ID s1 has been successfully closed and all resources freed."
    );
    let r = call(&client, "close_sandbox", json!({"session_id": "s1"})).await;
    assert!(!is_error(&r));
    assert_eq!(
        text(&r),
        "Sandbox with session ID s1 is not active or has already been closed."
    );
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "s1", "code": "print(v)"}),
    )
    .await;
    assert_eq!(
        object(&r),
        json!({"error": "No sandbox found with session ID: s1. Create a sandbox first."})
    );
    let r = call(&client, "create_sandbox", json!({"session_id": "s1"})).await;
    assert!(!is_error(&r), "the name is free again: {}", text(&r));
    let r = call(
        &client,
        "execute_code",
        json!({"session_id": "s1", "code": "print('v' in globals())"}),
    )
    .await;
    assert_eq!(object(&r)["logs"]["stdout"], json!(["False\n"]));
    call(&client, "close_sandbox", json!({"session_id": "s1"})).await;
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn runbox_own_tools_pass_the_environment_through_too() {
    let client = stdio_client_with_env(
        &["--pool", "1", "--pass-through-env", "RUNBOX_TEST_PASSED"],
        &[
            ("RUNBOX_TEST_PASSED", "passed"),
            ("RUNBOX_TEST_HIDDEN", "hidden"),
        ],
    )
    .await;
    let r = call(&client, "create_sandbox", json!({})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "echo \"${RUNBOX_TEST_PASSED:-unset} ${RUNBOX_TEST_HIDDEN:-unset}\""}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "passed unset\n");
    // A caller's own variables still work beside it.
    let r = call(&client, "create_sandbox", json!({"env": {"MINE": "1"}})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "echo $MINE $RUNBOX_TEST_PASSED"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "1 passed\n");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn bad_profiles_and_missing_variables_stop_the_server() {
    for (args, needles) in [
        (
            vec!["--stdio", "--profile", "e2b"],
            vec![
                "e2b",
                "novita-tutorial",
                "code-sandbox-mcp",
                "mcp-code-sandbox",
            ],
        ),
        (
            vec![
                "--stdio",
                "--pass-through-env",
                "RUNBOX_TEST_SURELY_UNSET_VARIABLE",
            ],
            vec!["RUNBOX_TEST_SURELY_UNSET_VARIABLE", "not set"],
        ),
    ] {
        let out = serve_command(&args).output().await.unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        for needle in needles {
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
    // RUNBOX_PROFILE chooses a profile too.
    let mut command = serve_command(&["--stdio", "--pool", "0"]);
    command.env("RUNBOX_PROFILE", "code-sandbox-mcp");
    let transport = TokioChildProcess::builder(command)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
        .0;
    let client = Recorder::default()
        .serve_with_lifecycle(transport, lifecycle(Revision::Legacy))
        .await
        .unwrap();
    assert_eq!(
        tool_names(&client).await,
        names(&["run_javascript_code", "run_python_code"])
    );
    let instructions = client
        .peer_info()
        .unwrap()
        .instructions
        .clone()
        .unwrap_or_default();
    assert!(instructions.contains("fresh sandbox"), "{instructions}");
    client.cancel().await.unwrap();
}
