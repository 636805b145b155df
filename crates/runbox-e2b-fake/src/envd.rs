//! envd (§2), under `/49983/{sandbox_id}`: Connect RPC (unary JSON and server
//! streams), scripted processes, the in-memory filesystem, `/files`, `/health`.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use base64::Engine as _;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::CommandReply;
use crate::body::{self, CONNECT_JSON, OCTET, StreamTx};
use crate::fs::{self, FsError};
use crate::golden::{Kind, classify};
use crate::proto::{self, Rpc};
use crate::server::{Ck, Req, Target, sandbox_prelude, user_of};
use crate::state::{EndKind, Inner, Life, Proc};

/// How a 401 is worded on this endpoint.
#[derive(Clone, Copy)]
enum AuthStyle {
    Connect,
    Json,
}

/// After the gate: the proxy's 502 for a gone/paused sandbox, then envd's 401.
fn unavailable(inner: &Inner, t: &Target, style: AuthStyle) -> Option<Response> {
    if t.life != Life::Running {
        return Some(inner.proxy_unavailable(&t.id, t.life));
    }
    if !t.token_ok {
        let msg = "invalid or missing X-Access-Token";
        return Some(match style {
            AuthStyle::Connect => inner.connect_error("unauthenticated", msg),
            AuthStyle::Json => inner.api_error(StatusCode::UNAUTHORIZED, msg),
        });
    }
    None
}

fn gross_answer(inner: &Inner, req: &Req, ck: &mut Ck<'_>) -> Response {
    match ck.gate(req) {
        Err(resp) => resp,
        Ok(_) => inner.connect_error("not_found", "not found"),
    }
}

pub(crate) async fn handle(inner: &Arc<Inner>, req: &Req, ck: &mut Ck<'_>) -> Response {
    let Some(t) = sandbox_prelude(inner, req, ck) else {
        return gross_answer(inner, req, ck);
    };
    let path = req.path.as_str();
    if path == "/health" && req.method == Method::GET {
        let cut = match ck.gate(req) {
            Ok(cut) => cut,
            Err(resp) => return resp,
        };
        if t.life != Life::Running {
            return inner.proxy_unavailable(&t.id, t.life);
        }
        return inner.plain(StatusCode::NO_CONTENT, None, &[], Vec::new(), cut);
    }
    if path == "/files" {
        return files(inner, req, ck, &t);
    }
    if let Some(rpc) = Rpc::from_path(path) {
        if req.method != Method::POST {
            ck.gross(format!(
                "Connect RPC {path} must be POST, got {}",
                req.method
            ));
            return gross_answer(inner, req, ck);
        }
        return call(inner, req, ck, &t, rpc);
    }
    if req.method == Method::POST && Rpc::known_unimplemented(path) {
        if let Err(resp) = ck.gate(req) {
            return resp;
        }
        return inner.connect_error(
            "unimplemented",
            format!("{path} is not implemented by the fake"),
        );
    }
    ck.gross(format!("{} {path} is not an envd route (§2)", req.method));
    gross_answer(inner, req, ck)
}

/// Parse and check a Connect request, then answer it.
fn call(inner: &Arc<Inner>, req: &Req, ck: &mut Ck<'_>, t: &Target, rpc: Rpc) -> Response {
    match req.header("connect-protocol-version") {
        Some("1") => {}
        other => ck.v(format!(
            "Connect-Protocol-Version must be \"1\", got {other:?}"
        )),
    }
    let ct = req.content_type();
    let msg: Option<Value> = if rpc.streaming() {
        if ct.as_deref() != Some(CONNECT_JSON) {
            ck.gross(format!(
                "streaming RPC needs Content-Type application/connect+json, got {:?}",
                req.header("content-type")
            ));
        }
        if let Some(enc) = req.header("connect-content-encoding")
            && enc != "identity"
        {
            ck.gross(format!(
                "Connect-Content-Encoding {enc:?}: only identity is used"
            ));
        }
        envelope_message(&req.body, ck)
    } else {
        if ct.as_deref() != Some("application/json") {
            ck.gross(format!(
                "unary RPC needs Content-Type application/json, got {:?}",
                req.header("content-type")
            ));
        }
        if let Some(enc) = req.header("content-encoding")
            && enc != "identity"
        {
            ck.gross(format!("Content-Encoding {enc:?}: only identity is used"));
        }
        if req.body.is_empty() {
            ck.gross(
                "unary RPC with an empty body: send the request message as JSON ({} at least)",
            );
            None
        } else if req.body.first() == Some(&0) {
            ck.gross("unary RPC body is enveloped; unary Connect bodies are bare JSON");
            None
        } else {
            match serde_json::from_slice::<Value>(&req.body) {
                Ok(v) => Some(v),
                Err(e) => {
                    ck.gross(format!("unary RPC body is not JSON: {e}"));
                    None
                }
            }
        }
    };
    if let Some(m) = &msg {
        let mut problems = Vec::new();
        proto::check(m, rpc.request(), "message", &mut problems);
        ck.problems(problems);
    }
    if let Some(kind) = classify(false, "POST", &req.path) {
        inner.check_golden(kind, req, ck);
    }
    let cut = match ck.gate(req) {
        Ok(cut) => cut,
        Err(resp) => return resp,
    };
    if let Some(resp) = unavailable(inner, t, AuthStyle::Connect) {
        return resp;
    }
    let msg = msg.unwrap_or_else(|| json!({}));
    match rpc {
        Rpc::Start => start(inner, req, t, &msg, cut),
        Rpc::Connect => reattach(inner, t, &msg, cut),
        _ => match unary(inner, req, t, rpc, &msg) {
            Ok(v) => inner.json(StatusCode::OK, &v, cut),
            Err(e) => inner.connect_error(e.code, e.message),
        },
    }
}

/// The one envelope of a streaming request: flags 0, length == the remaining bytes.
fn envelope_message(body: &[u8], ck: &mut Ck<'_>) -> Option<Value> {
    if body.len() < 5 {
        ck.gross(format!(
            "streaming request body is {} bytes; it must be one envelope (5-byte header + JSON)",
            body.len()
        ));
        return None;
    }
    let flags = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let rest = body.len() - 5;
    if flags != 0 {
        ck.gross(format!(
            "request envelope flags are {flags:#04x}; they must be 0x00"
        ));
    }
    if len != rest {
        ck.gross(format!(
            "request envelope length is {len} but {rest} bytes follow the header (exactly one envelope is sent)"
        ));
        return None;
    }
    match serde_json::from_slice::<Value>(&body[5..]) {
        Ok(v) => Some(v),
        Err(e) => {
            ck.gross(format!("request envelope does not hold JSON: {e}"));
            None
        }
    }
}

fn path_arg(msg: &Value, key: &str) -> Result<String, FsError> {
    fs::resolve(msg.get(key).and_then(Value::as_str).unwrap_or(""))
}

fn not_found_process(sel: &Value) -> FsError {
    FsError {
        code: "not_found",
        message: format!("process {sel} not found"),
    }
}

/// The unary methods, answered under the state lock.
fn unary(inner: &Inner, req: &Req, t: &Target, rpc: Rpc, msg: &Value) -> Result<Value, FsError> {
    let _user = user_of(req);
    let mut st = inner.lock();
    let sb = &mut st.sandboxes[t.idx];
    let sel = msg.get("process").cloned().unwrap_or(Value::Null);
    match rpc {
        Rpc::List => {
            let processes: Vec<Value> = sb
                .processes
                .iter()
                .map(|(pid, p)| {
                    let mut v = json!({"config": p.config, "pid": pid});
                    if let Some(tag) = &p.tag {
                        v["tag"] = json!(tag);
                    }
                    v
                })
                .collect();
            Ok(json!({ "processes": processes }))
        }
        Rpc::SendInput | Rpc::CloseStdin | Rpc::Update => {
            sb.find_process(&sel)
                .ok_or_else(|| not_found_process(&sel))?;
            Ok(json!({}))
        }
        Rpc::SendSignal => {
            let pid = sb
                .find_process(&sel)
                .ok_or_else(|| not_found_process(&sel))?;
            let signal = proto::signal_of(msg.get("signal").unwrap_or(&Value::Null));
            if (signal == 9 || signal == 15)
                && let Some(p) = sb.processes.remove(&pid)
            {
                p.end.send_replace(Some(EndKind::Killed));
            }
            Ok(json!({}))
        }
        Rpc::Stat => Ok(json!({"entry": sb.fs.stat(&path_arg(msg, "path")?)?})),
        Rpc::ListDir => {
            let depth = msg.get("depth").and_then(Value::as_u64).unwrap_or(1);
            Ok(json!({"entries": sb.fs.list(&path_arg(msg, "path")?, depth)?}))
        }
        Rpc::MakeDir => Ok(json!({"entry": sb.fs.make_dir(&path_arg(msg, "path")?)?})),
        Rpc::Move => {
            let (src, dst) = (path_arg(msg, "source")?, path_arg(msg, "destination")?);
            Ok(json!({"entry": sb.fs.rename(&src, &dst)?}))
        }
        Rpc::Remove => {
            sb.fs.remove(&path_arg(msg, "path")?)?;
            Ok(json!({}))
        }
        Rpc::Start | Rpc::Connect => Err(FsError {
            code: "internal",
            message: "streaming method called as unary".into(),
        }),
    }
}

fn event(e: Value) -> bytes::Bytes {
    body::envelope(0, &json!({ "event": e }))
}

fn keepalive() -> bytes::Bytes {
    event(json!({"keepalive": {}}))
}

fn killed_end() -> bytes::Bytes {
    event(json!({"end": {"exitCode": -1, "status": "signal: killed"}}))
}

fn end_stream_ok() -> bytes::Bytes {
    body::envelope(2, &json!({}))
}

fn end_stream_error(code: &str, message: &str) -> bytes::Bytes {
    body::envelope(2, &json!({"error": {"code": code, "message": message}}))
}

/// process.Process/Start: run the scripted reply for the command.
fn no_script(key: &str) -> CommandReply {
    CommandReply::exit(127, Vec::new(), format!("fake: no script for {key}\n"))
}

/// `ln -s TARGET LINK`, optionally guarded by `[ -e LINK ] ||`: the one command the fake
/// runs itself, on its file system (a link to a directory, as runbox makes `/workspace`).
#[derive(Debug, PartialEq)]
struct Ln {
    target: String,
    link: String,
    guarded: bool,
}

fn ln_builtin(command: &str) -> Option<Ln> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let (guard, rest) = match words.as_slice() {
        ["[", "-e", l, "]", "||", rest @ ..] => (Some(*l), rest),
        rest => (None, rest),
    };
    match rest {
        ["ln", "-s", target, link] if guard.is_none_or(|g| g == *link) => Some(Ln {
            target: (*target).to_owned(),
            link: (*link).to_owned(),
            guarded: guard.is_some(),
        }),
        _ => None,
    }
}

impl Ln {
    fn run(&self, fs: &mut crate::fs::Fs, user: &str) -> CommandReply {
        let in_home = self.link.starts_with("/home/user/") || self.link.starts_with("/tmp/");
        if user != "root" && !in_home {
            return CommandReply::exit(
                1,
                Vec::new(),
                format!(
                    "ln: failed to create symbolic link '{}': Permission denied\n",
                    self.link
                ),
            );
        }
        match fs.symlink(&self.target, &self.link) {
            Ok(()) => CommandReply::ok(Vec::new()),
            Err(_) if self.guarded => CommandReply::ok(Vec::new()),
            Err(_) => CommandReply::exit(
                1,
                Vec::new(),
                format!(
                    "ln: failed to create symbolic link '{}': File exists\n",
                    self.link
                ),
            ),
        }
    }
}

fn start(inner: &Arc<Inner>, req: &Req, t: &Target, msg: &Value, cut: bool) -> Response {
    let process = msg.get("process").cloned().unwrap_or_else(|| json!({}));
    let cmd = process.get("cmd").and_then(Value::as_str).unwrap_or("");
    let args: Vec<&str> = process
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let key = match args.as_slice() {
        ["-l", "-c", command] if cmd == "/bin/bash" => (*command).to_owned(),
        _ => std::iter::once(cmd)
            .chain(args.iter().copied())
            .collect::<Vec<_>>()
            .join(" "),
    };
    let deadline = req
        .header("connect-timeout-ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));

    let mut st = inner.lock();
    let scripted = st.cmd_scripts.get(&key).cloned();
    let reply = match scripted {
        Some(r) => r,
        None => match args.as_slice() {
            [.., "-c", command] if cmd == "/bin/bash" => match ln_builtin(command) {
                Some(link) => link.run(&mut st.sandboxes[t.idx].fs, crate::server::user_of(req)),
                None => no_script(&key),
            },
            _ => no_script(&key),
        },
    };
    let sb = &mut st.sandboxes[t.idx];
    let pid = sb.next_pid;
    sb.next_pid += 1;
    let end_rx = if reply.hang {
        let (tx, rx) = watch::channel(None);
        sb.processes.insert(
            pid,
            Proc {
                config: process,
                tag: msg.get("tag").and_then(Value::as_str).map(str::to_owned),
                end: tx,
            },
        );
        Some(rx)
    } else {
        None
    };
    drop(st);

    let (resp, tx) = body::streaming(inner.config.chunking, CONNECT_JSON, cut);
    tokio::spawn(run_process(
        inner.clone(),
        t.idx,
        pid,
        reply,
        end_rx,
        deadline,
        tx,
    ));
    resp
}

async fn run_process(
    inner: Arc<Inner>,
    idx: usize,
    pid: u32,
    reply: CommandReply,
    end_rx: Option<watch::Receiver<Option<EndKind>>>,
    deadline: Option<Instant>,
    mut tx: StreamTx,
) {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut data = Vec::new();
    if !reply.stdout.is_empty() {
        data.push(event(json!({"data": {"stdout": b64(&reply.stdout)}})));
    }
    if !reply.stderr.is_empty() {
        data.push(event(json!({"data": {"stderr": b64(&reply.stderr)}})));
    }
    let mut keepalives = reply.keepalives;
    tx.send(event(json!({"start": {"pid": pid}}))).await;
    for d in data {
        if keepalives > 0 {
            keepalives -= 1;
            tx.send(keepalive()).await;
        }
        tx.send(d).await;
    }
    for _ in 0..keepalives {
        tx.send(keepalive()).await;
    }
    if let Some(mut rx) = end_rx {
        match wait_end(&inner, idx, pid, &mut rx, deadline, &mut tx).await {
            None => {}
            Some(EndKind::Vanished) => tx.abort().await,
            Some(EndKind::Killed) => {
                tx.send(killed_end()).await;
                tx.send(end_stream_ok()).await;
            }
            Some(EndKind::Deadline) => {
                tx.send(killed_end()).await;
                tx.send(end_stream_error(
                    "deadline_exceeded",
                    "context deadline exceeded (Connect-Timeout-Ms elapsed; the process was killed)",
                ))
                .await;
            }
        }
        return;
    }
    let code = reply.exit_code;
    let mut end = json!({"exited": true, "status": format!("exit status {code}")});
    if code != 0 {
        end["exitCode"] = json!(code);
        end["error"] = json!(format!("exit status {code}"));
    }
    tx.send(event(json!({ "end": end }))).await;
    match &reply.end_error {
        Some((code, message)) => tx.send(end_stream_error(code, message)).await,
        None => tx.send(end_stream_ok()).await,
    };
}

/// Keep a hanging process's stream alive (a keepalive every 200 ms) until it is
/// killed, its deadline passes, or its sandbox vanishes. `None`: the fake is stopping.
async fn wait_end(
    inner: &Inner,
    idx: usize,
    pid: u32,
    rx: &mut watch::Receiver<Option<EndKind>>,
    deadline: Option<Instant>,
    tx: &mut StreamTx,
) -> Option<EndKind> {
    let mut tick = tokio::time::interval_at(
        Instant::now() + Duration::from_millis(200),
        Duration::from_millis(200),
    );
    loop {
        if let Some(kind) = *rx.borrow() {
            return Some(kind);
        }
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = inner.cancel.cancelled() => return None,
            changed = rx.changed() => {
                if changed.is_err() {
                    return Some((*rx.borrow()).unwrap_or(EndKind::Vanished));
                }
            }
            _ = until_deadline => {
                let mut st = inner.lock();
                if let Some(p) = st.sandboxes.get_mut(idx).and_then(|s| s.processes.remove(&pid)) {
                    p.end.send_replace(Some(EndKind::Deadline));
                }
                drop(st);
                return Some((*rx.borrow()).unwrap_or(EndKind::Deadline));
            }
            _ = tick.tick() => {
                tx.send(keepalive()).await;
            }
        }
    }
}

/// process.Process/Connect: re-attach to a running process.
fn reattach(inner: &Arc<Inner>, t: &Target, msg: &Value, cut: bool) -> Response {
    let sel = msg.get("process").cloned().unwrap_or(Value::Null);
    let st = inner.lock();
    let sb = &st.sandboxes[t.idx];
    let found = sb
        .find_process(&sel)
        .and_then(|pid| sb.processes.get(&pid).map(|p| (pid, p.end.subscribe())));
    drop(st);
    let (resp, mut tx) = body::streaming(inner.config.chunking, CONNECT_JSON, cut);
    let inner = inner.clone();
    let idx = t.idx;
    tokio::spawn(async move {
        let Some((pid, mut rx)) = found else {
            tx.send(end_stream_error(
                "not_found",
                &format!("process {sel} not found"),
            ))
            .await;
            return;
        };
        tx.send(event(json!({"start": {"pid": pid}}))).await;
        match wait_end(&inner, idx, pid, &mut rx, None, &mut tx).await {
            None => {}
            Some(EndKind::Vanished) => tx.abort().await,
            Some(EndKind::Killed | EndKind::Deadline) => {
                tx.send(killed_end()).await;
                tx.send(end_stream_ok()).await;
            }
        }
    });
    resp
}

/// One part of a multipart body.
struct Part {
    name: Option<String>,
    filename: Option<String>,
    data: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header_param(value: &str, key: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(key)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn parse_multipart(content_type: &str, body: &[u8]) -> Result<Vec<Part>, String> {
    let boundary = header_param(content_type, "boundary")
        .ok_or("multipart Content-Type without a boundary")?;
    let delim = format!("--{boundary}").into_bytes();
    let mut pos = find(body, &delim).ok_or("multipart body without its boundary")? + delim.len();
    let mut parts = Vec::new();
    loop {
        let rest = &body[pos..];
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        let rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("multipart boundary not followed by CRLF")?;
        let head_len = find(rest, b"\r\n\r\n").ok_or("multipart part without a header block")?;
        let head = String::from_utf8_lossy(&rest[..head_len]).into_owned();
        let data_start = head_len + 4;
        let mut closing = b"\r\n".to_vec();
        closing.extend_from_slice(&delim);
        let data_len = find(&rest[data_start..], &closing)
            .ok_or("multipart part not closed by the boundary")?;
        let mut part = Part {
            name: None,
            filename: None,
            data: rest[data_start..data_start + data_len].to_vec(),
        };
        for line in head.split("\r\n") {
            if let Some((k, v)) = line.split_once(':')
                && k.trim().eq_ignore_ascii_case("content-disposition")
            {
                part.name = header_param(v, "name");
                part.filename = header_param(v, "filename");
            }
        }
        parts.push(part);
        pos = body.len() - rest.len() + data_start + data_len + closing.len();
    }
}

/// `/files`: download (GET) and upload (POST multipart or octet-stream).
fn files(inner: &Inner, req: &Req, ck: &mut Ck<'_>, t: &Target) -> Response {
    if let Some(u) = req.query_param("username")
        && u != "root"
        && u != "user"
    {
        ck.v(format!("/files username {u:?} is neither root nor user"));
    }
    let path_q = req.query_param("path");
    let kind = match req.method {
        Method::GET => Kind::FilesDownload,
        Method::POST => Kind::FilesUpload,
        _ => {
            ck.gross(format!("{} /files: only GET and POST", req.method));
            return gross_answer(inner, req, ck);
        }
    };
    inner.check_golden(kind, req, ck);

    if kind == Kind::FilesDownload {
        if path_q.is_none() {
            ck.v("GET /files without a `path` query parameter");
        }
        let cut = match ck.gate(req) {
            Ok(cut) => cut,
            Err(resp) => return resp,
        };
        if let Some(resp) = unavailable(inner, t, AuthStyle::Json) {
            return resp;
        }
        let Some(p) = path_q else {
            return inner.api_error(StatusCode::BAD_REQUEST, "path is required");
        };
        let st = inner.lock();
        let result =
            fs::resolve(&p).and_then(|p| st.sandboxes[t.idx].fs.read(&p).map(<[u8]>::to_vec));
        drop(st);
        return match result {
            Ok(bytes) => inner.plain(StatusCode::OK, Some(OCTET), &[], bytes, cut),
            Err(e) if e.code == "not_found" => {
                inner.api_error(StatusCode::NOT_FOUND, format!("path '{p}' does not exist"))
            }
            Err(e) => inner.api_error(StatusCode::BAD_REQUEST, e.message),
        };
    }

    // Upload.
    let ct = req.content_type().unwrap_or_default();
    let mut uploads: Vec<(String, Vec<u8>)> = Vec::new();
    if ct == "multipart/form-data" {
        match parse_multipart(req.header("content-type").unwrap_or(""), &req.body) {
            Err(e) => ck.gross(format!("upload: {e}")),
            Ok(parts) => {
                if parts.is_empty() {
                    ck.gross("upload: multipart body without parts");
                }
                if path_q.is_some() && parts.len() > 1 {
                    ck.v("upload: several parts with a `path` query (the SDK omits `path` then)");
                }
                for part in parts {
                    if part.name.as_deref() != Some("file") {
                        ck.v(format!(
                            "upload: part named {:?}; parts are named \"file\"",
                            part.name
                        ));
                    }
                    let dest = match (&path_q, &part.filename) {
                        (Some(p), Some(f)) => {
                            if fs::resolve(f).ok() != fs::resolve(p).ok() {
                                ck.v(format!(
                                    "upload: part filename {f:?} is not the destination path {p:?}"
                                ));
                            }
                            p.clone()
                        }
                        (Some(p), None) => {
                            ck.v(
                                "upload: part without a filename (it must be the destination path)",
                            );
                            p.clone()
                        }
                        (None, Some(f)) => f.clone(),
                        (None, None) => {
                            ck.gross("upload: part without a filename and no `path` query: no destination");
                            continue;
                        }
                    };
                    uploads.push((dest, part.data));
                }
            }
        }
    } else if ct == OCTET {
        if let Some(enc) = req.header("content-encoding")
            && enc != "identity"
        {
            ck.gross(format!(
                "upload: Content-Encoding {enc:?} is not supported by the fake"
            ));
        }
        match &path_q {
            Some(p) => uploads.push((p.clone(), req.body.to_vec())),
            None => ck.gross("upload: application/octet-stream needs the `path` query parameter"),
        }
    } else {
        ck.gross(format!(
            "upload Content-Type {:?} is neither multipart/form-data nor application/octet-stream",
            req.header("content-type")
        ));
    }
    let cut = match ck.gate(req) {
        Ok(cut) => cut,
        Err(resp) => return resp,
    };
    if let Some(resp) = unavailable(inner, t, AuthStyle::Json) {
        return resp;
    }
    let mut st = inner.lock();
    let sb = &mut st.sandboxes[t.idx];
    let mut written = Vec::new();
    for (dest, data) in uploads {
        match fs::resolve(&dest).and_then(|p| sb.fs.write(&p, data).map(|_| p)) {
            Ok(p) => {
                let name = p.rsplit('/').next().unwrap_or("").to_owned();
                written.push(json!({"path": p, "name": name, "type": "file"}));
            }
            Err(e) => {
                drop(st);
                return inner.api_error(StatusCode::BAD_REQUEST, e.message);
            }
        }
    }
    drop(st);
    inner.json(StatusCode::OK, &Value::Array(written), cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_parses_the_recorded_body() {
        let body = b"--91a8\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\nContent-Type: text/plain\r\n\r\nabc\r\n--91a8\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n\r\n\r\n--91a8--\r\n";
        let parts = parse_multipart("multipart/form-data; boundary=91a8", body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name.as_deref(), Some("file"));
        assert_eq!(parts[0].filename.as_deref(), Some("/home/user/a.txt"));
        assert_eq!(parts[0].data, b"abc");
        assert_eq!(parts[1].filename.as_deref(), Some("b"));
        assert!(parts[1].data.is_empty());
    }
}

#[cfg(test)]
mod ln_tests {
    use super::*;

    #[test]
    fn the_link_command_is_understood_and_nothing_else() {
        assert_eq!(
            ln_builtin("[ -e /workspace ] || ln -s /home/user /workspace"),
            Some(Ln {
                target: "/home/user".into(),
                link: "/workspace".into(),
                guarded: true
            })
        );
        assert!(ln_builtin("ln -s /a /b").is_some());
        assert_eq!(ln_builtin("[ -e /x ] || ln -s /a /b"), None);
        assert_eq!(ln_builtin("ln /a /b"), None);
        assert_eq!(ln_builtin("echo hi"), None);
    }
}
