//! Answers every client can take, through a real MCP client: no message over the message
//! limit (big reads in parts, an image's bytes once, what is still too big as a link read
//! in pieces), arguments taken liberally while the schemas stay exact, an unknown tool's
//! error listing the tools, and errors that read as sentences fitting the error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use base64::Engine;
use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, ErrorCode, ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};
use util::mcp::*;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// The default message limit.
const LIMIT: usize = 512 << 10;

async fn create(client: &Client) -> String {
    let r = call(client, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["sandbox_id"].as_str().unwrap().to_owned()
}

/// How many bytes an answer takes on the wire.
fn wire_size(r: &rmcp::model::CallToolResult) -> usize {
    serde_json::to_vec(r).unwrap().len()
}

/// An 800x800 figure of noise: megabytes of PNG.
const NOISY_FIGURE: &str = "import numpy as np\nimport matplotlib.pyplot as plt\n\
fig = plt.figure(figsize=(8, 8), dpi=100)\nax = fig.add_axes([0, 0, 1, 1])\n\
ax.imshow(np.random.default_rng(1).random((800, 800, 3)), interpolation='nearest')\n\
ax.axis('off')\nplt.show()";

/// A resource's bytes, read in pieces of at most `piece` bytes, each answer under the limit.
async fn read_in_pieces(client: &Client, uri: &str, size: u64, piece: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    while (bytes.len() as u64) < size {
        let at = bytes.len();
        let r = client
            .read_resource(ReadResourceRequestParams::new(format!(
                "{uri}?offset={at}&length={piece}"
            )))
            .await
            .unwrap();
        assert!(serde_json::to_vec(&r).unwrap().len() < LIMIT);
        let ResourceContents::BlobResourceContents { blob, .. } = &r.contents[0] else {
            panic!("a piece is a blob: {:?}", r.contents[0]);
        };
        let part = B64.decode(blob).unwrap();
        assert!(
            !part.is_empty() && part.len() as u64 <= piece,
            "{}",
            part.len()
        );
        bytes.extend(part);
    }
    bytes
}

fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    (w, h)
}

/// A 2 MB file comes in parts, each answer under the limit, and reassembles exactly; an
/// 800x800 noisy figure, too big for one message, comes as a link whose pieces reassemble
/// the PNG; a small figure travels once; and the session goes on.
#[tokio::test]
async fn big_reads_and_big_figures_fit_in_messages_and_arrive_whole() {
    let server = HttpServer::start(&["--pool", "0"]).await;
    let (client, _) = server.client(Revision::Legacy).await;
    let id = create(&client).await;

    // 2 MB of text whose every line says where it is.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "with open('big.txt', 'w') as f:\n    for i in range(40000):\n        f.write(f'{i:08d} ' + 'x' * 40 + '\\n')"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let mut got = String::new();
    let mut calls = 0;
    loop {
        let r = call(
            &client,
            "read_file",
            json!({"sandbox_id": id, "path": "big.txt", "offset": got.len()}),
        )
        .await;
        assert!(!is_error(&r), "{}", text(&r));
        assert!(
            wire_size(&r) < LIMIT,
            "an answer of {} bytes",
            wire_size(&r)
        );
        let s = structured(&r);
        got.push_str(s["content"].as_str().unwrap());
        calls += 1;
        if !s["more"].as_bool().unwrap() {
            assert_eq!(s["size"], 2_000_000);
            break;
        }
    }
    assert_eq!(got.len(), 2_000_000);
    assert!(
        got.lines()
            .enumerate()
            .all(|(i, l)| l.starts_with(&format!("{i:08} ")))
    );
    assert!(calls >= 4, "read in {calls} calls");

    // An 800x800 figure of noise.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": NOISY_FIGURE}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(
        wire_size(&r) < LIMIT,
        "an answer of {} bytes",
        wire_size(&r)
    );
    assert!(
        r.content.iter().all(|c| c.as_image().is_none()),
        "too big to go inline"
    );
    let link = r
        .content
        .iter()
        .find_map(|c| c.as_resource_link())
        .expect("a link to the figure")
        .clone();
    assert_eq!(link.mime_type.as_deref(), Some("image/png"));
    let size = link.size.unwrap();
    assert!(size > LIMIT as u64, "{size}");
    let reference = &structured(&r)["results"][0]["data"]["image/png"];
    assert_eq!(
        (reference["uri"].as_str(), reference["size"].as_u64()),
        (Some(link.uri.as_str()), Some(size))
    );
    assert!(text(&r).contains(&link.uri), "{}", text(&r));
    // Read whole, it is refused with the way to read it.
    let e = client
        .read_resource(ReadResourceRequestParams::new(link.uri.clone()))
        .await
        .unwrap_err();
    let ServiceError::McpError(e) = e else {
        panic!("{e}")
    };
    assert!(e.message.contains("?offset=0&length="), "{}", e.message);
    let png = read_in_pieces(&client, &link.uri, size, 300_000).await;
    assert_eq!(png.len() as u64, size);
    let (w, h) = png_size(&png);
    assert!(w >= 800 && h >= 800, "{w}x{h}");

    // A small figure comes inline, its bytes once, with a reference.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2))\nplt.plot([1, 2, 3])\nplt.show()"}),
    )
    .await;
    let image = r.content.iter().find_map(|c| c.as_image()).expect("inline");
    let wire = String::from_utf8(serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!(
        wire.matches(&image.data).count(),
        1,
        "the bytes travel once"
    );
    let reference = &structured(&r)["results"][0]["data"]["image/png"];
    let uri = reference["uri"].as_str().unwrap();
    let whole = client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    let ResourceContents::BlobResourceContents { blob, .. } = &whole.contents[0] else {
        panic!("{:?}", whole.contents)
    };
    assert_eq!(blob, &image.data);

    // The session goes on.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "6 * 7"}),
    )
    .await;
    assert_eq!(structured(&r)["results"][0]["data"]["text/plain"], "42");
    client.cancel().await.unwrap();
    server.stop().await;
}

/// An answer still too big (here: output over a raised output cap) is kept whole and
/// answered with a link, so it reaches the client in pieces and nothing is lost.
#[tokio::test]
async fn an_answer_too_big_for_one_message_is_a_link_to_it_whole() {
    let (client, _) = stdio_client(
        &[
            "--pool",
            "0",
            "--output-limit",
            "2000000",
            "--message-limit",
            "262144",
        ],
        Revision::Stateless,
    )
    .await;
    let r = call(
        &client,
        "run_command",
        json!({"command": "head -c 600000 /dev/zero | tr '\\0' 'y'; echo; echo done"}),
    )
    .await;
    assert!(wire_size(&r) < 262144, "{}", wire_size(&r));
    assert!(is_error(&r), "the answer asked for could not be sent");
    assert!(text(&r).contains("262144"), "{}", text(&r));
    let link = r
        .content
        .iter()
        .find_map(|c| c.as_resource_link())
        .expect("a link to the answer")
        .clone();
    assert_eq!(link.mime_type.as_deref(), Some("application/json"));
    let json = read_in_pieces(&client, &link.uri, link.size.unwrap(), 100_000).await;
    let answer: Value = serde_json::from_slice(&json).unwrap();
    let stdout = answer["structuredContent"]["stdout"].as_str().unwrap();
    assert_eq!(stdout.len(), 600_000 + "\ndone\n".len());
    assert!(stdout.ends_with("y\ndone\n"));
    client.cancel().await.unwrap();
}

/// Numbers, booleans and maps as strings, and languages in any case or by alias, are
/// taken; the schemas stay exact.
#[tokio::test]
async fn arguments_are_taken_liberally_and_schemas_stay_exact() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Legacy).await;
    let tools = client.list_all_tools().await.unwrap();
    let schema = |tool: &str, arg: &str| -> Value {
        let t = tools.iter().find(|t| t.name == tool).unwrap();
        let whole = Value::Object((*t.input_schema).clone());
        let mut s = whole["properties"][arg].clone();
        if let Some(r) = s["$ref"].as_str() {
            s = whole["$defs"][r.trim_start_matches("#/$defs/")].clone();
        }
        s
    };
    let types = |v: &Value| v["type"].clone();
    assert_eq!(
        types(&schema("run_code", "timeout_seconds")),
        json!(["number", "null"])
    );
    assert_eq!(
        types(&schema("read_file", "offset")),
        json!(["integer", "null"])
    );
    assert_eq!(types(&schema("list_files", "recursive")), json!("boolean"));
    assert_eq!(
        types(&schema("set_sandbox_timeout", "timeout_seconds")),
        json!("number")
    );
    let language = schema("run_code", "language");
    let names: Vec<&str> = language["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["const"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["python", "javascript", "typescript", "bash"],
        "{language}"
    );

    for (language, code, out) in [
        ("Python", "print(1 + 1)", "2\n"),
        ("py", "print('py')", "py\n"),
        ("JS", "console.log('js')", "js\n"),
        ("node", "console.log(typeof process)", "object\n"),
        ("ts", "const n: number = 3; console.log(n)", "3\n"),
        ("SH", "echo sh", "sh\n"),
    ] {
        let r = call(
            &client,
            "run_code",
            json!({"code": code, "language": language, "timeout_seconds": "30"}),
        )
        .await;
        assert!(!is_error(&r), "{language}: {}", text(&r));
        assert_eq!(structured(&r)["stdout"], out, "{language}");
    }
    // A timeout given as text is a timeout.
    let r = call(
        &client,
        "run_code",
        json!({"code": "import time; time.sleep(30)", "timeout_seconds": "1"}),
    )
    .await;
    assert!(
        structured(&r)["timed_out"].as_bool().unwrap(),
        "{}",
        text(&r)
    );

    let r = call(
        &client,
        "create_sandbox",
        json!({"timeout_seconds": "120", "metadata": "{\"by\": \"inspector\"}", "network": "None"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    assert_eq!(structured(&r)["timeout_seconds"], 120.0);
    assert_eq!(structured(&r)["metadata"]["by"], "inspector");
    let r = call(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "d/a.txt", "content": "abcdef", "append": "false", "encoding": "UTF-8"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "d/a.txt", "offset": "2", "length": "3"}),
    )
    .await;
    assert_eq!(structured(&r)["content"], "cde", "{}", text(&r));
    let r = call(
        &client,
        "list_files",
        json!({"sandbox_id": id, "recursive": "true"}),
    )
    .await;
    let listing = structured(&r);
    let paths: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/workspace/d/a.txt"), "{paths:?}");
    let r = call(
        &client,
        "set_sandbox_timeout",
        json!({"sandbox_id": id, "timeout_seconds": "60"}),
    )
    .await;
    assert_eq!(structured(&r)["timeout_seconds"], 60.0, "{}", text(&r));

    // What still makes no sense is refused, naming what was expected.
    let r = call(
        &client,
        "run_code",
        json!({"code": "1", "language": "cobol"}),
    )
    .await;
    assert!(is_error(&r));
    assert!(
        text(&r).contains("python, javascript, typescript, bash"),
        "{}",
        text(&r)
    );
    let r = call(
        &client,
        "run_code",
        json!({"code": "1", "timeout_seconds": "soon"}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("number"), "{}", text(&r));
    client.cancel().await.unwrap();
}

/// Calling a tool that does not exist names it and lists the tools there are.
#[tokio::test]
async fn an_unknown_tool_is_named_with_the_tools_there_are() {
    for profile in [None, Some("novita-tutorial")] {
        let mut args = vec!["--pool", "0"];
        if let Some(p) = profile {
            args.extend(["--profile", p]);
        }
        let (client, _) = stdio_client(&args, Revision::Legacy).await;
        let e = client
            .call_tool(CallToolRequestParams::new("run_python"))
            .await
            .unwrap_err();
        let ServiceError::McpError(e) = e else {
            panic!("{e}")
        };
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert!(e.message.contains("\"run_python\""), "{}", e.message);
        let listed = if profile.is_some() {
            [
                "create_sandbox_session",
                "run_python_code",
                "run_on_command_line",
            ]
        } else {
            ["run_code", "create_sandbox", "read_file"]
        };
        for tool in listed {
            assert!(e.message.contains(tool), "{}", e.message);
        }
        assert_eq!(e.data.unwrap()["tool"], "run_python");
        client.cancel().await.unwrap();
    }
}

/// Errors read as sentences, with advice only where it fits: a closed sandbox says to
/// create one; a full disk and a too-large write do not say to close sandboxes.
#[tokio::test]
async fn errors_read_as_sentences_that_fit_the_error() {
    let (client, _) = stdio_client(&["--pool", "0", "--workspace-mb", "8"], Revision::Legacy).await;
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": "sbx_gone", "code": "1"}),
    )
    .await;
    let t = text(&r);
    assert!(is_error(&r));
    assert!(
        t.starts_with("Sandbox sbx_gone not found: it never existed, was closed, or expired. Call create_sandbox"),
        "{t}"
    );
    let id = create(&client).await;
    let r = call(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "fill.bin", "content": B64.encode(vec![0u8; 12 << 20]), "encoding": "base64"}),
    )
    .await;
    let t = text(&r);
    assert!(is_error(&r) && t.contains("no space left"), "{t}");
    assert!(
        !t.to_lowercase().contains("close sandboxes") && !t.contains("close_sandbox"),
        "{t}"
    );
    assert!(t.starts_with("Limit reached: ") && t.ends_with('.'), "{t}");
    let r = call(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "huge.bin", "content": B64.encode(vec![1u8; 17 << 20]), "encoding": "base64"}),
    )
    .await;
    let t = text(&r);
    assert!(is_error(&r) && t.contains("append"), "{t}");
    assert!(!t.contains("close_sandbox"), "{t}");
    client.cancel().await.unwrap();
}

/// A background process's backlog (up to 1 MiB unread, both streams) comes in answers that
/// fit, and running stays true until all of it has been read.
#[tokio::test]
async fn a_background_backlog_comes_in_answers_that_fit() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Legacy).await;
    let id = create(&client).await;
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "background": true, "command": "head -c 900000 /dev/zero | tr '\\0' o; echo; head -c 50000 /dev/zero | tr '\\0' e >&2; echo end"}),
    )
    .await;
    let process = structured(&r)["process_id"].as_str().unwrap().to_owned();
    // Once it has ended, all of it waits unread.
    loop {
        let r = call(&client, "get_sandbox_status", json!({"sandbox_id": id})).await;
        let ended = structured(&r)["background_processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["process_id"] == process.as_str() && p["running"] == false);
        if ended {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (mut stdout, mut stderr, mut reads) = (String::new(), String::new(), 0);
    loop {
        let r = call(
            &client,
            "read_process_output",
            json!({"sandbox_id": id, "process_id": process}),
        )
        .await;
        assert!(!is_error(&r), "{}", text(&r));
        assert!(
            wire_size(&r) < LIMIT,
            "an answer of {} bytes",
            wire_size(&r)
        );
        let s = structured(&r);
        stdout.push_str(s["stdout"].as_str().unwrap());
        stderr.push_str(s["stderr"].as_str().unwrap());
        assert_eq!(s["dropped_bytes"], 0);
        reads += 1;
        if s["running"] == false {
            assert_eq!(s["exit_code"], 0);
            break;
        }
        assert_eq!(
            s["exit_code"],
            Value::Null,
            "no end before all output is read"
        );
    }
    assert!(reads >= 3, "{reads} reads");
    assert_eq!(stdout.len(), 900_000 + "\nend\n".len());
    assert!(stdout.ends_with("o\nend\n"));
    assert_eq!(stderr, "e".repeat(50_000));
    client.cancel().await.unwrap();
}
