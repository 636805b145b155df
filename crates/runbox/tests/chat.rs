//! `runbox chat` against a stand-in for an OpenAI-compatible model API served here on
//! loopback: it follows a script (tool calls streamed as server-sent events cut at awkward
//! places, the JSON arguments spread over several deltas) and records every request, while
//! the chat drives a real `runbox serve` (started by the chat over stdio, or over HTTP with
//! a token) with real sandboxes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::convert::Infallible;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

/// What the stand-in answers to request number `n` (counted from 0), given its body.
type Script = Arc<dyn Fn(usize, &Value) -> Answer + Send + Sync>;

enum Answer {
    /// A streamed completion: the SSE text, sent in these pieces.
    Stream(Vec<Vec<u8>>),
    /// An error status with a JSON body.
    Status(u16, Value),
}

#[derive(Clone)]
struct StandIn {
    script: Script,
    /// Each request's body and `Authorization` header.
    requests: Arc<Mutex<Vec<(Value, String)>>>,
}

impl StandIn {
    /// Serves the script on a free loopback port; returns the stand-in and its base URL.
    async fn start(
        script: impl Fn(usize, &Value) -> Answer + Send + Sync + 'static,
    ) -> (Self, String) {
        let stand_in = Self {
            script: Arc::new(script),
            requests: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(completions))
            .with_state(stand_in.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (stand_in, base)
    }

    fn bodies(&self) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|(b, _)| b.clone())
            .collect()
    }
}

async fn completions(State(s): State<StandIn>, headers: HeaderMap, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap();
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let n = {
        let mut requests = s.requests.lock().unwrap();
        requests.push((body.clone(), auth));
        requests.len() - 1
    };
    match (s.script)(n, &body) {
        Answer::Stream(pieces) => {
            // Each piece goes out on its own, a moment apart, so the client really sees
            // events and lines cut in the middle.
            let stream = futures_util::stream::unfold(pieces.into_iter(), |mut rest| async move {
                let piece = rest.next()?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                Some((Ok::<_, Infallible>(piece), rest))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        Answer::Status(status, body) => Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
    }
}

/// A streamed completion with `text` (in the given pieces) and tool calls, each
/// `(id, name, argument pieces)`, cut into byte pieces of awkward, varying sizes.
fn stream(text: &[&str], calls: &[(&str, &str, Vec<String>)]) -> Answer {
    let chunk = |delta: Value| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}))];
    for t in text {
        events.push(chunk(json!({"content": t})));
    }
    for (index, (id, name, args)) in calls.iter().enumerate() {
        events.push(chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
        ));
        for a in args {
            events.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": a}}]}),
            ));
        }
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    let mut sse: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    sse.push_str("data: [DONE]\n\n");
    let bytes = sse.into_bytes();
    let mut pieces = Vec::new();
    let mut at = 0;
    for size in [1usize, 7, 3, 29, 2, 61, 5].iter().cycle() {
        if at >= bytes.len() {
            break;
        }
        let end = (at + size).min(bytes.len());
        pieces.push(bytes[at..end].to_vec());
        at = end;
    }
    Answer::Stream(pieces)
}

/// JSON arguments split across deltas, mid-key and mid-value.
fn split_args(args: &Value) -> Vec<String> {
    let s = args.to_string();
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(6).map(|c| c.iter().collect()).collect()
}

/// The tool messages of a request, `(tool_call_id, content)`.
fn tool_messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The first sandbox id (`sbx_` and hex digits) in `text`.
fn sandbox_id(text: &str) -> Option<String> {
    let at = text.find("sbx_")?;
    Some(
        text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect(),
    )
}

/// The scripted agent: create a sandbox (and, in the same response, ask about one that
/// does not exist), run `x = 21`, then `x * 2`, then answer. It never closes the sandbox.
fn forty_two(n: usize, body: &Value) -> Answer {
    let id = || {
        tool_messages(body)
            .iter()
            .find_map(|(_, content)| sandbox_id(content).filter(|i| i != "sbx_nope"))
            .expect("the created sandbox's id in a tool message")
    };
    match n {
        0 => stream(
            &["I will use ", "a sandbox."],
            &[
                (
                    "call_status",
                    "get_sandbox_status",
                    split_args(&json!({"sandbox_id": "sbx_nope"})),
                ),
                (
                    "call_create",
                    "create_sandbox",
                    vec!["{".into(), "}".into()],
                ),
            ],
        ),
        1 => stream(
            &[],
            &[(
                "call_set",
                "run_code",
                split_args(&json!({"sandbox_id": id(), "code": "x = 21"})),
            )],
        ),
        2 => stream(
            &[],
            &[(
                "call_get",
                "run_code",
                split_args(&json!({"sandbox_id": id(), "code": "x * 2"})),
            )],
        ),
        _ => stream(&["The answer ", "is 4", "2."], &[]),
    }
}

/// `runbox chat ARGS` with the model at `base_url`; its output, after at most a minute.
async fn chat(base_url: &str, args: &[&str]) -> Output {
    let mut c = tokio::process::Command::new(util::runbox_exe());
    c.arg("chat")
        .args([
            "--base-url",
            base_url,
            "--model",
            "stand-in",
            "--api-key",
            "test-key",
        ])
        .args(args)
        .env("RUNBOX_INIT_EXE", util::runbox_exe())
        .env("RUNBOX_LOG", "warn")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .env_remove("NOVITA_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("RUNBOX_CHAT_MODEL")
        .env_remove("RUNBOX_TOKEN")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(p) = std::env::var_os("RUNBOX_CGROUP_PARENT") {
        c.env("RUNBOX_CGROUP_PARENT", p);
    }
    tokio::time::timeout(Duration::from_secs(60), c.output())
        .await
        .expect("runbox chat did not finish within a minute")
        .unwrap()
}

const STDIO: &[&str] = &["--stdio", "--serve-arg", "--pool", "--serve-arg", "0"];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Checks the requests of the [`forty_two`] script; returns the sandbox id.
fn check_forty_two(stand_in: &StandIn, out: &Output) -> String {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout, "The answer is 42.\n", "stderr: {stderr}");

    let requests = stand_in.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 4, "{stderr}");
    assert!(requests.iter().all(|(_, auth)| auth == "Bearer test-key"));
    let first = &requests[0].0;
    assert_eq!(first["model"], "stand-in");
    assert_eq!(first["stream"], true);
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert_eq!(first["messages"][0]["role"], "system");
    // The server's sandbox_instructions prompt, and the close tool named.
    assert!(system.contains("call create_sandbox once"), "{system}");
    assert!(system.contains("call close_sandbox"), "{system}");
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    for t in ["create_sandbox", "run_code", "close_sandbox"] {
        assert!(tools.contains(&t), "{tools:?}");
    }

    // Both calls of the first response were answered, the failing one too.
    let results = tool_messages(&requests[1].0);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0].0, "call_status");
    assert!(
        results[0].1.starts_with("The tool reported an error"),
        "{results:?}"
    );
    assert!(results[0].1.contains("sbx_nope"), "{results:?}");
    assert_eq!(results[1].0, "call_create");
    let id = sandbox_id(&results[1].1).unwrap();
    // The model's own text stays in the conversation with its calls.
    let assistant = &requests[1].0["messages"][2];
    assert_eq!(assistant["content"], "I will use a sandbox.");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        r#"{"sandbox_id":"sbx_nope"}"#
    );

    // State kept between the two runs: the real result reached the model.
    let last = tool_messages(&requests[3].0);
    assert_eq!(last.len(), 4);
    assert_eq!(last[3].0, "call_get");
    assert!(last[3].1.contains("42"), "{last:?}");
    assert!(!last[2].1.contains("error"), "{last:?}");

    // The traces went to stderr, the code shown; the forgotten sandbox was closed.
    assert!(
        stderr.contains("run_code") && stderr.contains("x * 2"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("closed sandbox {id}")), "{stderr}");
    id
}

#[tokio::test(flavor = "multi_thread")]
async fn stdio_chat_creates_a_sandbox_keeps_state_answers_and_closes_it() {
    let (stand_in, base) = StandIn::start(forty_two).await;
    let out = chat(
        &base,
        &[STDIO, &["--prompt", "What is 21 * 2? Use Python."]].concat(),
    )
    .await;
    check_forty_two(&stand_in, &out);
    assert_eq!(
        stand_in.bodies()[0]["messages"][1]["content"],
        "What is 21 * 2? Use Python."
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http_chat_with_a_token_leaves_no_sandbox_behind() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let token = util::mcp::add_token(&tokens, "chat", &[]);
    let server =
        util::mcp::HttpServer::start(&["--pool", "0", "--tokens", tokens.to_str().unwrap()]).await;

    // A wrong token is refused, plainly.
    let (refused, base) = StandIn::start(forty_two).await;
    let out = chat(
        &base,
        &[
            "--url",
            &server.url,
            "--token",
            "rbx_wrong",
            "--prompt",
            "hi",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the MCP server at {} refused the token",
            server.url
        )),
        "{stderr}"
    );
    assert!(refused.bodies().is_empty());

    let (stand_in, base) = StandIn::start(forty_two).await;
    let out = chat(
        &base,
        &[
            "--url",
            &server.url,
            "--token",
            &token,
            "--prompt",
            "21 * 2?",
        ],
    )
    .await;
    check_forty_two(&stand_in, &out);
    let health = server.health().await;
    assert_eq!(health["sandboxes"], 0, "{health}");
    assert!(server.stop().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_stops_at_the_step_limit() {
    let (stand_in, base) = StandIn::start(|n, _| {
        stream(
            &[],
            &[(&format!("call_{n}"), "list_sandboxes", vec!["{}".into()])],
        )
    })
    .await;
    let out = chat(
        &base,
        &[STDIO, &["--max-steps", "3", "--prompt", "loop"]].concat(),
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(text(&out.stdout), "");
    assert!(
        stderr.contains("step limit reached: 3 model responses"),
        "{stderr}"
    );
    let bodies = stand_in.bodies();
    assert_eq!(bodies.len(), 3, "{stderr}");
    // The calls of the first two responses ran; the third's did not.
    let results = tool_messages(&bodies[2]);
    assert_eq!(results.len(), 2);
    assert!(
        results.iter().all(|(_, c)| c.contains("sandboxes")),
        "{results:?}"
    );
    assert_eq!(stderr.matches("list_sandboxes").count(), 2, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn model_and_server_errors_are_said_plainly() {
    // Nothing listens on the model's port.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let nowhere = format!("http://127.0.0.1:{closed}/v1");
    let (refuses_key, key_base) = StandIn::start(|_, _| {
        Answer::Status(
            401,
            json!({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}),
        )
    })
    .await;
    let (no_tools, tools_base) = StandIn::start(|_, _| {
        Answer::Status(400, json!({"error": {"message": "tools not supported by this model", "type": "invalid_request_error"}}))
    })
    .await;
    let (unused, unused_base) = StandIn::start(forty_two).await;
    let mcp_nowhere = format!("http://127.0.0.1:{closed}/mcp");
    let over_stdio = [STDIO, &["--prompt", "hi"]].concat();
    let over_http = ["--url", mcp_nowhere.as_str(), "--prompt", "hi"];
    let (a, b, c, d) = tokio::join!(
        chat(&nowhere, &over_stdio),
        chat(&key_base, &over_stdio),
        chat(&tools_base, &over_stdio),
        chat(&unused_base, &over_http),
    );
    let expect = |out: &Output, wanted: &[&str]| {
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
        for w in wanted {
            assert!(stderr.contains(w), "{w:?} not in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    expect(
        &a,
        &[
            &format!("cannot reach the model API at {nowhere}"),
            "refused",
        ],
    );
    expect(
        &b,
        &[&format!(
            "the model API at {key_base} refused the API key (HTTP 401): Incorrect API key provided"
        )],
    );
    expect(
        &c,
        &[
            "HTTP 400: tools not supported by this model",
            "does not seem to take tool calls",
        ],
    );
    expect(
        &d,
        &[&format!(
            "cannot connect to the MCP server at {mcp_nowhere}"
        )],
    );
    assert_eq!(refuses_key.bodies().len(), 1);
    assert_eq!(no_tools.bodies().len(), 1);
    assert!(unused.bodies().is_empty());
}
