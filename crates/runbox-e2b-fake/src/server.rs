//! The listener, path routing, request recording, checks common to every surface, the
//! recorded-traffic header comparison, faults, and response helpers.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::body::{self, JSON, TEXT};
use crate::golden::Kind;
use crate::proto::Problem;
use crate::state::{Inner, Life, Lookup};
use crate::{FaultKind, Provider, Recorded, Surface};

pub(crate) const ENVD_PORT: u16 = 49983;
pub(crate) const INTERPRETER_PORT: u16 = 49999;
const MAX_BODY: usize = 256 << 20;

pub(crate) fn spawn(listener: TcpListener, inner: Arc<Inner>) {
    let cancel = inner.cancel.clone();
    let app = Router::new().fallback(handle).with_state(inner);
    // Small streamed chunks go out at once, as a provider's edge sends them (Nagle's
    // algorithm would hold each behind the client's delayed ACK).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::warn!("runbox-e2b-fake: server stopped: {e}");
        }
    });
}

/// A request, split by surface.
pub(crate) struct Req {
    pub surface: Surface,
    pub method: Method,
    /// Without the surface prefix and without the query.
    pub path: String,
    pub query: Option<String>,
    /// The (percent-decoded) id segment of a sandbox path.
    pub sandbox_id: Option<String>,
    pub port: Option<u16>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Req {
    /// The first value of a header; non-UTF-8 values read as empty.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap_or(""))
    }

    /// The content type without parameters, lower-cased.
    pub fn content_type(&self) -> Option<String> {
        self.header("content-type").map(essence)
    }

    /// Path and query, as recorded.
    pub fn full_path(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }

    /// Decoded query pairs (`+` is a space).
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        parse_query(self.query.as_deref().unwrap_or(""))
    }

    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query_pairs()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// The body as JSON; `None` when empty. A body that is not JSON is a gross
    /// violation (and reads as `None`).
    pub fn json_body(&self, ck: &mut Ck<'_>) -> Option<Value> {
        if self.body.is_empty() {
            return None;
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) => Some(v),
            Err(e) => {
                ck.gross(format!("body is not valid JSON: {e}"));
                None
            }
        }
    }
}

pub(crate) fn essence(ct: &str) -> String {
    ct.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

/// Collects the violations of one request.
pub(crate) struct Ck<'a> {
    inner: &'a Inner,
    label: String,
    gross: Vec<String>,
}

impl<'a> Ck<'a> {
    /// A violation; the request is still answered normally.
    pub fn v(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        self.inner
            .lock()
            .violations
            .push(format!("{}: {msg}", self.label));
    }

    /// A gross violation: the request is answered with 599.
    pub fn gross(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        self.v(msg.clone());
        self.gross.push(msg);
    }

    pub fn problems(&mut self, problems: Vec<Problem>) {
        for p in problems {
            if p.gross {
                self.gross(p.text);
            } else {
                self.v(p.text);
            }
        }
    }

    pub fn is_gross(&self) -> bool {
        !self.gross.is_empty()
    }

    /// 599 for a gross violation; a queued fault's answer; or go ahead (`Ok(cut)`).
    #[allow(clippy::result_large_err)] // the Err is the answer itself, returned at once
    pub fn gate(&self, req: &Req) -> Result<bool, Response> {
        if self.is_gross() {
            let text = format!(
                "runbox-e2b-fake: protocol violation: {}\n{}\n",
                self.label,
                self.gross.join("\n")
            );
            return Err(self.inner.plain(
                StatusCode::from_u16(599).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                Some(TEXT),
                &[],
                text,
                false,
            ));
        }
        match self.inner.take_fault(req) {
            None => Ok(false),
            Some(FaultKind::Cut) => Ok(true),
            Some(FaultKind::Status {
                status,
                body,
                retry_after,
            }) => {
                let status =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let ct = if serde_json::from_str::<Value>(&body).is_ok() {
                    JSON
                } else {
                    TEXT
                };
                let extra: Vec<(&str, String)> = retry_after
                    .map(|s| vec![("retry-after", s.to_string())])
                    .unwrap_or_default();
                Err(self.inner.plain(status, Some(ct), &extra, body, false))
            }
        }
    }
}

impl Inner {
    fn take_fault(&self, req: &Req) -> Option<FaultKind> {
        let mut st = self.lock();
        let full = req.full_path();
        let pos = st.faults.iter().position(|f| {
            f.surface == req.surface
                && f.method.as_ref().is_none_or(|m| *m == req.method)
                && (req.path.ends_with(&f.path_suffix) || full.ends_with(&f.path_suffix))
        })?;
        let f = &mut st.faults[pos];
        f.times = f.times.saturating_sub(1);
        let kind = f.kind.clone();
        if f.times == 0 {
            st.faults.remove(pos);
        }
        Some(kind)
    }

    pub fn plain(
        &self,
        status: StatusCode,
        content_type: Option<&str>,
        extra: &[(&str, String)],
        body: impl Into<Bytes>,
        cut: bool,
    ) -> Response {
        body::plain(self.config.chunking, status, content_type, extra, body, cut)
    }

    pub fn json(&self, status: StatusCode, v: &Value, cut: bool) -> Response {
        self.plain(status, Some(JSON), &[], v.to_string(), cut)
    }

    pub fn text(&self, status: StatusCode, text: impl Into<String>) -> Response {
        self.plain(status, Some(TEXT), &[], text.into(), false)
    }

    /// The control plane's (and `/files`') error shape.
    pub fn api_error(&self, status: StatusCode, message: impl Into<String>) -> Response {
        let v = json!({"code": status.as_u16(), "message": message.into()});
        self.json(status, &v, false)
    }

    /// A Connect unary error with the status connect-go maps `code` to.
    pub fn connect_error(&self, code: &str, message: impl Into<String>) -> Response {
        let status = match code {
            "invalid_argument" | "out_of_range" => 400,
            "unauthenticated" => 401,
            "permission_denied" => 403,
            "not_found" | "unimplemented" => 404,
            "canceled" | "deadline_exceeded" => 408,
            "already_exists" | "aborted" => 409,
            "failed_precondition" => 412,
            "resource_exhausted" => 429,
            "unavailable" => 503,
            _ => 500,
        };
        let v = json!({"code": code, "message": message.into()});
        self.json(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &v,
            false,
        )
    }

    /// The edge proxy's answer for a sandbox that is gone or paused.
    pub fn proxy_unavailable(&self, id: &str, life: Life) -> Response {
        let text = match life {
            Life::Paused => format!("The sandbox {id} is paused; resume it (connect) first"),
            _ => format!("The sandbox {id} was not found"),
        };
        self.text(StatusCode::BAD_GATEWAY, text)
    }

    pub fn has_golden(&self, kind: Kind) -> bool {
        self.golden.iter().any(|g| g.kind == kind)
    }

    /// Compare a request with the reference SDK's request of the same kind: every
    /// non-volatile header it sent must be there with the same value. Keys, tokens,
    /// routing, `Authorization` and `Connect-Timeout-Ms` are checked elsewhere.
    pub fn check_golden(&self, kind: Kind, req: &Req, ck: &mut Ck<'_>) {
        for g in self.golden.iter().filter(|g| g.kind == kind) {
            for (name, want) in &g.headers {
                let got = req.header(name);
                match name.as_str() {
                    "x-access-token"
                    | "e2b-sandbox-id"
                    | "e2b-sandbox-port"
                    | "novita-sandbox-id"
                    | "novita-sandbox-port"
                    | "authorization"
                    | "connect-timeout-ms"
                    | "e2b-traffic-access-token" => {}
                    "x-api-key" => {
                        if got.is_none() {
                            ck.v(format!(
                                "missing X-API-KEY header ({kind:?}; the reference SDK sends it)"
                            ));
                        }
                    }
                    "content-type" => {
                        let got = got.map(essence);
                        let want = essence(want);
                        let alt_ok =
                            kind == Kind::FilesUpload && got.as_deref() == Some(body::OCTET);
                        if got.as_deref() != Some(want.as_str()) && !alt_ok {
                            ck.v(format!(
                                "Content-Type {got:?} on {kind:?}; the reference SDK sends {want:?}"
                            ));
                        }
                    }
                    _ => {
                        if got != Some(want.as_str()) {
                            ck.v(format!(
                                "header {name}: {got:?} on {kind:?}; the reference SDK sends {want:?}"
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// What the sandbox-surface prelude found.
pub(crate) struct Target {
    pub idx: usize,
    pub id: String,
    pub life: Life,
    /// False when the request must be answered 401 (token missing or wrong).
    pub token_ok: bool,
}

/// Checks common to envd and interpreter requests: port, sandbox id and its form,
/// routing headers, access token, Basic user, Connect-Timeout-Ms, traffic token.
/// `None` when the request is grossly wrong (already recorded).
pub(crate) fn sandbox_prelude(inner: &Inner, req: &Req, ck: &mut Ck<'_>) -> Option<Target> {
    let port = req.port.unwrap_or(0);
    if port != ENVD_PORT && port != INTERPRETER_PORT {
        ck.gross(format!(
            "port segment {port} is neither {ENVD_PORT} (envd) nor {INTERPRETER_PORT} (code interpreter)"
        ));
        return None;
    }
    let id = req.sandbox_id.clone().unwrap_or_default();
    let st = inner.lock();
    let idx = match st.lookup(&id) {
        Lookup::Found(i) => i,
        Lookup::WrongForm { expected } => {
            drop(st);
            ck.gross(format!(
                "sandbox id {id:?} is not the form {:?} clients use: expected {expected:?}",
                inner.provider()
            ));
            return None;
        }
        Lookup::Unknown => {
            drop(st);
            ck.gross(format!(
                "sandbox id {id:?} names no sandbox the fake created"
            ));
            return None;
        }
    };
    let sb = &st.sandboxes[idx];
    let (life, token, sb_id) = (sb.life, sb.token.clone(), sb.id.clone());
    drop(st);

    // Routing headers: required where the provider's SDK sends them, correct if present.
    let required = match inner.provider() {
        Provider::E2b => Some("e2b"),
        Provider::Novita if port == ENVD_PORT => Some("novita"),
        Provider::Novita | Provider::NovitaLegacy => None,
    };
    for (family, title) in [("e2b", "E2b"), ("novita", "Novita")] {
        for (suffix, want) in [("id", sb_id.clone()), ("port", port.to_string())] {
            let name = format!("{family}-sandbox-{suffix}");
            let shown = format!(
                "{title}-Sandbox-{}",
                if suffix == "id" { "Id" } else { "Port" }
            );
            match req.header(&name) {
                None if required == Some(family) => ck.v(format!(
                    "missing routing header {shown} (the {:?} SDK sends {shown}: {want})",
                    inner.provider()
                )),
                Some(got) if got != want => ck.v(format!(
                    "routing header {shown} is {got:?}, expected {want:?}"
                )),
                _ => {}
            }
        }
    }

    let token_ok = match (token.as_deref(), req.header("x-access-token")) {
        (Some(t), Some(h)) if h == t => true,
        (Some(_), Some(_)) => {
            ck.v("X-Access-Token is not the envdAccessToken issued for this sandbox");
            false
        }
        (Some(_), None) => {
            ck.v("missing X-Access-Token (the sandbox was created with an envdAccessToken)");
            false
        }
        (None, Some(_)) => {
            ck.v("X-Access-Token sent, but no envdAccessToken was issued for this sandbox");
            true
        }
        (None, None) => true,
    };

    if let Some(auth) = req.header("authorization") {
        check_basic(auth, ck);
    }
    if let Some(t) = req.header("connect-timeout-ms")
        && t.trim().parse::<u64>().is_err()
    {
        ck.v(format!(
            "Connect-Timeout-Ms {t:?} is not a non-negative integer"
        ));
    }
    if req.header("e2b-traffic-access-token").is_some() {
        ck.v("E2B-Traffic-Access-Token sent, but no trafficAccessToken was issued (it is null)");
    }
    Some(Target {
        idx,
        id: sb_id,
        life,
        token_ok,
    })
}

/// `Authorization: Basic base64("{user}:")` with user root or user.
fn check_basic(auth: &str, ck: &mut Ck<'_>) {
    let Some(b64) = auth.strip_prefix("Basic ") else {
        ck.v(format!(
            "Authorization {auth:?} on a sandbox request: only `Basic base64(\"<user>:\")` is used"
        ));
        return;
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    match decoded.as_deref() {
        Some("root:" | "user:") => {}
        other => ck.v(format!(
            "Authorization Basic decodes to {other:?}; expected \"root:\" or \"user:\""
        )),
    }
}

/// The user a request runs as: from the Basic header, else the template default.
pub(crate) fn user_of(req: &Req) -> &'static str {
    let decoded = req
        .header("authorization")
        .and_then(|a| a.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        });
    match decoded.as_deref() {
        Some(b"root:") => "root",
        _ => "user",
    }
}

async fn handle(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (body, body_err) = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => (b, None),
        Err(e) => (Bytes::new(), Some(e.to_string())),
    };
    let raw_path = parts.uri.path().to_owned();
    let query = parts.uri.query().map(str::to_owned);
    let label = format!(
        "{} {}",
        parts.method,
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or(&raw_path)
    );

    let mut bad_prefix = false;
    let (surface, port, sandbox_id, path) = if raw_path == "/api" || raw_path.starts_with("/api/") {
        let rest = &raw_path[4..];
        (
            Surface::Api,
            None,
            None,
            if rest.is_empty() {
                "/".to_owned()
            } else {
                rest.to_owned()
            },
        )
    } else {
        let mut segs = raw_path.trim_start_matches('/').splitn(3, '/');
        let port = segs.next().and_then(|p| p.parse::<u16>().ok());
        let id = segs.next();
        match (port, id) {
            (Some(port), Some(id)) if !id.is_empty() => (
                if port == INTERPRETER_PORT {
                    Surface::Interpreter
                } else {
                    Surface::Envd
                },
                Some(port),
                Some(percent_decode_str(id).decode_utf8_lossy().into_owned()),
                format!("/{}", segs.next().unwrap_or("")),
            ),
            _ => {
                bad_prefix = true;
                (Surface::Api, None, None, raw_path.clone())
            }
        }
    };

    let req = Req {
        surface,
        method: parts.method,
        path,
        query,
        sandbox_id,
        port,
        headers: parts.headers,
        body,
    };
    inner.lock().requests.push(Recorded {
        surface,
        method: req.method.to_string(),
        path: req.full_path(),
        sandbox_id: req.sandbox_id.clone(),
        headers: req
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: req.body.to_vec(),
    });

    let mut ck = Ck {
        inner: &inner,
        label,
        gross: Vec::new(),
    };
    if let Some(e) = body_err {
        ck.gross(format!("could not read the request body: {e}"));
    }
    if bad_prefix {
        ck.gross("path is neither /api/... (control plane) nor /{port}/{sandbox_id}/... (sandbox)");
    }
    if ck.is_gross() {
        return match ck.gate(&req) {
            Err(resp) => resp,
            Ok(_) => inner.text(StatusCode::NOT_FOUND, "not found"),
        };
    }
    match surface {
        Surface::Api => crate::control::handle(&inner, &req, &mut ck),
        Surface::Envd => crate::envd::handle(&inner, &req, &mut ck).await,
        Surface::Interpreter => crate::interp::handle(&inner, &req, &mut ck),
    }
}
