//! The recorded reference-SDK traffic (`fixtures/*.jsonl`) and the per-kind header
//! expectations derived from it.

use base64::Engine as _;
use serde_json::Value;

use crate::Provider;

/// Requests recorded from the e2b Python SDK 2.63.0 (+ e2b-code-interpreter), one JSON
/// object per line: `port` (3000 = control plane), `method`, `path`, `headers`, `body`.
pub const RECORDED_E2B: &str = include_str!("../fixtures/recorded_e2b_py_2.63.0.jsonl");

/// Requests recorded from the novita-sandbox Python SDK 2.1.1; like [`RECORDED_E2B`],
/// with `body_b64` for the binary Start envelope.
pub const RECORDED_NOVITA: &str = include_str!("../fixtures/recorded_novita_py_2.1.1.jsonl");

/// One recorded reference-SDK request.
#[derive(Debug, Clone)]
pub struct SdkRequest {
    /// 3000 for the control plane, else the sandbox port the recorder listened on. The
    /// E2B SDK sent its `/execute` to the 49983 listener (it routes by the
    /// `E2b-Sandbox-Port: 49999` header): use [`SdkRequest::sandbox_port`].
    pub port: u16,
    pub method: String,
    /// Path and query, without any prefix (`/sandboxes`, `/files?path=...`).
    pub path: String,
    /// Lower-case names, as recorded.
    pub headers: Vec<(String, String)>,
    /// The body bytes; empty when the recorder could not capture a streamed body (the
    /// E2B Start request).
    pub body: Vec<u8>,
}

impl SdkRequest {
    /// A header's recorded value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this went to the control plane.
    pub fn is_api(&self) -> bool {
        self.port == 3000
    }

    /// The sandbox port the request was meant for (the routing header wins over the
    /// recorder's listener port).
    pub fn sandbox_port(&self) -> u16 {
        self.header("e2b-sandbox-port")
            .or_else(|| self.header("novita-sandbox-port"))
            .and_then(|p| p.parse().ok())
            .unwrap_or(self.port)
    }
}

/// The recorded requests of the reference SDK for `provider` (legacy Novita shares the
/// Novita recording).
pub fn sdk_requests(provider: Provider) -> Vec<SdkRequest> {
    let text = match provider {
        Provider::E2b => RECORDED_E2B,
        Provider::Novita | Provider::NovitaLegacy => RECORDED_NOVITA,
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            let headers = v
                .get("headers")
                .and_then(Value::as_object)
                .map(|h| {
                    h.iter()
                        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap_or("").to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            let body = if let Some(b64) = v.get("body_b64").and_then(Value::as_str) {
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap_or_default()
            } else {
                v.get("body")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .as_bytes()
                    .to_vec()
            };
            SdkRequest {
                port: v
                    .get("port")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(0),
                method: v
                    .get("method")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                path: v
                    .get("path")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                headers,
                body,
            }
        })
        .collect()
}

/// The request kinds the recordings cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Create,
    Start,
    ListDir,
    SendSignal,
    FilesUpload,
    FilesDownload,
    Execute,
    Contexts,
    Timeout,
    Delete,
    Connect,
}

/// The kind of a request; `path` without prefix and query.
pub(crate) fn classify(api: bool, method: &str, path: &str) -> Option<Kind> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if api {
        let segs: &[&str] = match segs.as_slice() {
            ["v2", rest @ ..] => rest,
            all => all,
        };
        return match (method, segs) {
            ("POST", ["sandboxes"]) => Some(Kind::Create),
            ("POST", ["sandboxes", _, "timeout"]) => Some(Kind::Timeout),
            ("POST", ["sandboxes", _, "connect"]) => Some(Kind::Connect),
            ("DELETE", ["sandboxes", _]) => Some(Kind::Delete),
            _ => None,
        };
    }
    match (method, path) {
        ("POST", "/process.Process/Start") => Some(Kind::Start),
        ("POST", "/filesystem.Filesystem/ListDir") => Some(Kind::ListDir),
        ("POST", "/process.Process/SendSignal") => Some(Kind::SendSignal),
        ("POST", "/files") => Some(Kind::FilesUpload),
        ("GET", "/files") => Some(Kind::FilesDownload),
        ("POST", "/execute") => Some(Kind::Execute),
        ("POST", "/contexts") => Some(Kind::Contexts),
        _ => None,
    }
}

/// Headers the SDK sends that say nothing about the protocol.
pub(crate) fn volatile(name: &str) -> bool {
    matches!(
        name,
        "user-agent"
            | "lang"
            | "lang_version"
            | "package_version"
            | "publisher"
            | "sdk_runtime"
            | "system"
            | "accept"
            | "accept-encoding"
            | "connection"
            | "host"
            | "content-length"
            | "transfer-encoding"
    ) || name.starts_with("x-novita-sdk-")
}

/// The non-volatile headers the reference SDK sent on one kind of request.
#[derive(Debug, Clone)]
pub(crate) struct Golden {
    pub kind: Kind,
    pub headers: Vec<(String, String)>,
}

pub(crate) fn goldens(provider: Provider) -> Vec<Golden> {
    sdk_requests(provider)
        .into_iter()
        .filter_map(|r| {
            let path = r.path.split('?').next().unwrap_or("");
            let kind = classify(r.is_api(), &r.method, path)?;
            let headers = r
                .headers
                .into_iter()
                .filter(|(k, _)| !volatile(k))
                .collect();
            Some(Golden { kind, headers })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recordings_parse_and_classify() {
        let e2b = goldens(Provider::E2b);
        let novita = goldens(Provider::Novita);
        assert_eq!(sdk_requests(Provider::E2b).len(), 10);
        assert_eq!(sdk_requests(Provider::Novita).len(), 8);
        assert_eq!(e2b.len(), 10);
        assert_eq!(novita.len(), 8);
        let start = novita.iter().find(|g| g.kind == Kind::Start).unwrap();
        assert!(
            start
                .headers
                .contains(&("keepalive-ping-interval".into(), "50".into()))
        );
        assert!(!start.headers.iter().any(|(k, _)| k == "user-agent"));
        let exec = sdk_requests(Provider::E2b)
            .into_iter()
            .find(|r| r.path == "/execute")
            .unwrap();
        assert_eq!(exec.sandbox_port(), 49999);
        let nstart = sdk_requests(Provider::Novita)
            .into_iter()
            .find(|r| r.path == "/process.Process/Start")
            .unwrap();
        assert_eq!(nstart.body.len(), 190);
    }
}
