//! The code interpreter (§3), under `/49999/{sandbox_id}`: `/execute` streams NDJSON,
//! `/contexts` manages kernels (one default per language, each with its own execution
//! counter).

use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Map, Value, json};

use crate::ExecReply;
use crate::body::{self, JSON};
use crate::golden::classify;
use crate::server::{Ck, Req, Target, sandbox_prelude};
use crate::state::{Context, Inner, Life};

const END_OF_EXECUTION: &[u8] = b"{\"type\": \"end_of_execution\"}\n";
const KEEPALIVE: &[u8] = b"{\"type\": \"keepalive\"}\n";

fn unavailable(inner: &Inner, t: &Target) -> Option<Response> {
    if t.life != Life::Running {
        return Some(inner.proxy_unavailable(&t.id, t.life));
    }
    if !t.token_ok {
        return Some(inner.text(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: invalid or missing X-Access-Token",
        ));
    }
    None
}

fn gross_answer(inner: &Inner, req: &Req, ck: &mut Ck<'_>) -> Response {
    match ck.gate(req) {
        Err(resp) => resp,
        Ok(_) => inner.text(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn normalise_language(l: &str) -> String {
    match l.trim().to_ascii_lowercase().as_str() {
        "" | "python" | "python3" => "python".into(),
        "js" | "javascript" => "javascript".into(),
        "ts" | "typescript" => "typescript".into(),
        other => other.into(),
    }
}

fn context_json(c: &Context) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd})
}

fn new_context(idx: usize, n: u32, language: String, cwd: String) -> Context {
    Context {
        id: format!("c0de{:04x}-0000-4000-8000-{:012x}", idx + 1, n),
        language,
        cwd,
        count: 0,
        default: false,
    }
}

/// Keys of an object body, each with its allowed JSON shapes checked.
fn object_body(
    req: &Req,
    ck: &mut Ck<'_>,
    what: &str,
    allowed: &[&str],
) -> Option<Map<String, Value>> {
    let v = req.json_body(ck)?;
    let Value::Object(obj) = v else {
        ck.gross(format!("{what}: body must be a JSON object, got {v}"));
        return None;
    };
    for k in obj.keys().filter(|k| !allowed.contains(&k.as_str())) {
        ck.v(format!(
            "{what}: unknown field `{k}` (allowed: {allowed:?})"
        ));
    }
    Some(obj)
}

fn opt_str(obj: &Map<String, Value>, key: &str, what: &str, ck: &mut Ck<'_>) -> Option<String> {
    match obj.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            ck.gross(format!("{what}: `{key}` must be a string or null, got {v}"));
            None
        }
    }
}

pub(crate) fn handle(inner: &Arc<Inner>, req: &Req, ck: &mut Ck<'_>) -> Response {
    let Some(t) = sandbox_prelude(inner, req, ck) else {
        return gross_answer(inner, req, ck);
    };
    if let Some(kind) = classify(false, req.method.as_str(), &req.path) {
        inner.check_golden(kind, req, ck);
        if !inner.has_golden(kind) && req.content_type().as_deref() != Some("application/json") {
            ck.v("Content-Type must be application/json");
        }
    }
    let segs: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    match (&req.method, segs.as_slice()) {
        (&Method::POST, ["execute"]) => execute(inner, req, ck, &t),
        (&Method::POST, ["contexts"]) => create_context(inner, req, ck, &t),
        (&Method::GET, ["contexts"]) => {
            let cut = match ck.gate(req) {
                Ok(cut) => cut,
                Err(resp) => return resp,
            };
            if let Some(resp) = unavailable(inner, &t) {
                return resp;
            }
            let st = inner.lock();
            let list: Vec<Value> = st.sandboxes[t.idx]
                .contexts
                .iter()
                .map(context_json)
                .collect();
            drop(st);
            inner.json(StatusCode::OK, &Value::Array(list), cut)
        }
        (&Method::POST, ["contexts", id, "restart"]) | (&Method::DELETE, ["contexts", id]) => {
            let cut = match ck.gate(req) {
                Ok(cut) => cut,
                Err(resp) => return resp,
            };
            if let Some(resp) = unavailable(inner, &t) {
                return resp;
            }
            let mut st = inner.lock();
            let contexts = &mut st.sandboxes[t.idx].contexts;
            let Some(pos) = contexts.iter().position(|c| c.id == *id) else {
                drop(st);
                return inner.text(StatusCode::NOT_FOUND, format!("Context {id} not found"));
            };
            if req.method == Method::DELETE {
                contexts.remove(pos);
            } else {
                contexts[pos].count = 0;
            }
            drop(st);
            inner.json(StatusCode::OK, &Value::Null, cut)
        }
        (&Method::GET, ["health"]) => {
            if let Err(resp) = ck.gate(req) {
                return resp;
            }
            if t.life != Life::Running {
                return inner.proxy_unavailable(&t.id, t.life);
            }
            inner.text(StatusCode::OK, "OK")
        }
        _ => {
            ck.gross(format!(
                "{} {} is not a code interpreter route (§3)",
                req.method, req.path
            ));
            gross_answer(inner, req, ck)
        }
    }
}

fn create_context(inner: &Inner, req: &Req, ck: &mut Ck<'_>, t: &Target) -> Response {
    let what = "POST /contexts";
    let obj = object_body(req, ck, what, &["language", "cwd"]).unwrap_or_default();
    let language = normalise_language(&opt_str(&obj, "language", what, ck).unwrap_or_default());
    let cwd = opt_str(&obj, "cwd", what, ck).unwrap_or_else(|| crate::fs::HOME.to_owned());
    let cut = match ck.gate(req) {
        Ok(cut) => cut,
        Err(resp) => return resp,
    };
    if let Some(resp) = unavailable(inner, t) {
        return resp;
    }
    let mut st = inner.lock();
    let sb = &mut st.sandboxes[t.idx];
    sb.next_ctx += 1;
    let ctx = new_context(t.idx, sb.next_ctx, language, cwd);
    let v = context_json(&ctx);
    sb.contexts.push(ctx);
    drop(st);
    inner.plain(StatusCode::OK, Some(JSON), &[], v.to_string(), cut)
}

fn execute(inner: &Arc<Inner>, req: &Req, ck: &mut Ck<'_>, t: &Target) -> Response {
    let what = "POST /execute";
    let obj = object_body(
        req,
        ck,
        what,
        &["code", "context_id", "language", "env_vars"],
    );
    if obj.is_none() && !ck.is_gross() {
        ck.gross("POST /execute: body required ({\"code\": ...})");
    }
    let obj = obj.unwrap_or_default();
    let code = match obj.get("code") {
        Some(Value::String(s)) => s.clone(),
        other => {
            ck.gross(format!("{what}: `code` must be a string, got {other:?}"));
            String::new()
        }
    };
    let context_id = opt_str(&obj, "context_id", what, ck);
    let language = opt_str(&obj, "language", what, ck);
    match obj.get("env_vars") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) if m.values().all(Value::is_string) => {}
        Some(v) => ck.gross(format!(
            "{what}: `env_vars` must be a map of string to string or null, got {v}"
        )),
    }
    let both = context_id.is_some() && language.is_some();
    if both {
        ck.v(format!("{what}: both context_id and language are set"));
    }
    let cut = match ck.gate(req) {
        Ok(cut) => cut,
        Err(resp) => return resp,
    };
    if let Some(resp) = unavailable(inner, t) {
        return resp;
    }
    if both {
        return inner.text(
            StatusCode::BAD_REQUEST,
            "Only one of context_id or language can be provided",
        );
    }

    let mut st = inner.lock();
    let reply = st.exec_scripts.get(&code).cloned();
    let sb = &mut st.sandboxes[t.idx];
    let pos = match &context_id {
        Some(id) => match sb.contexts.iter().position(|c| c.id == *id) {
            Some(p) => p,
            None => {
                drop(st);
                return inner.text(StatusCode::NOT_FOUND, format!("Context {id} not found"));
            }
        },
        None => {
            let lang = normalise_language(language.as_deref().unwrap_or("python"));
            // One default context per language, created on demand.
            match sb
                .contexts
                .iter()
                .position(|c| c.default && c.language == lang)
            {
                Some(p) => p,
                None => {
                    sb.next_ctx += 1;
                    let mut ctx = new_context(t.idx, sb.next_ctx, lang, crate::fs::HOME.to_owned());
                    ctx.default = true;
                    sb.contexts.push(ctx);
                    sb.contexts.len() - 1
                }
            }
        }
    };
    let ctx = &mut sb.contexts[pos];
    ctx.count += 1;
    let record = (
        sb.id.clone(),
        ctx.id.clone(),
        ctx.language.clone(),
        ctx.count,
    );
    let count = ctx.count;
    st.executions.push(record);
    drop(st);

    let reply = reply.unwrap_or_else(|| {
        ExecReply::lines(vec![json!({
            "type": "error",
            "name": "FakeError",
            "value": "no script for this code",
            "traceback": "\u{1b}[0;31mFakeError\u{1b}[0m: no script",
        })])
    });
    let (resp, mut tx) = body::streaming(inner.config.chunking, "application/x-ndjson", cut);
    let cancel = inner.cancel.clone();
    tokio::spawn(async move {
        let first =
            format!("{{\"type\": \"number_of_executions\", \"execution_count\": {count}}}\n");
        if !tx.send(first).await {
            return;
        }
        let mut keepalives = reply.keepalives;
        for line in &reply.lines {
            if keepalives > 0 {
                keepalives -= 1;
                if !tx.send(Bytes::from_static(KEEPALIVE)).await {
                    return;
                }
            }
            if !tx.send(body::py_line(line)).await {
                return;
            }
        }
        for _ in 0..keepalives {
            if !tx.send(Bytes::from_static(KEEPALIVE)).await {
                return;
            }
        }
        if !reply.delay.is_zero() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(reply.delay) => {}
            }
        }
        if reply.end {
            tx.send(Bytes::from_static(END_OF_EXECUTION)).await;
        }
    });
    resp
}
