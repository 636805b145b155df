//! envd, the daemon in every sandbox (port 49983): processes (Connect server streams and
//! unary calls), the file system (unary calls) and file transfer (plain HTTP `/files`).

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::{Method, RequestBuilder};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::Remote;
use crate::config::{E2bConfig, ENVD_PORT, INTERPRETER_PORT, Provider};
use crate::connect::{Decoder, Frame, envelope};
use crate::http::{Http, ProviderError, Retry, Surface};
use crate::proto::{
    EntryInfo, EntryResponse, ListDirRequest, ListDirResponse, PathRequest, PidSelector,
    ProcessEvent, ProcessStreamMessage, SelectRequest, SignalRequest, StartRequest,
};

/// Largest unary answer accepted (a listing of a big tree; past it, list a subdirectory).
const MAX_UNARY: usize = 32 << 20;

/// Seconds between the keepalives envd sends on an idle stream, so proxies keep it open.
const KEEPALIVE_SECONDS: &str = "50";

/// The HTTP surfaces inside sandboxes: envd and the code interpreter.
#[derive(Debug, Clone)]
pub(crate) struct Sandboxes {
    pub(crate) http: Http,
    config: std::sync::Arc<E2bConfig>,
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A `Start` or `Connect` stream of process events.
pub(crate) struct ProcessStream {
    body: ByteStream,
    decoder: Decoder,
    http: Http,
}

impl std::fmt::Debug for ProcessStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessStream").finish_non_exhaustive()
    }
}

/// The HTTP status connect-go gives a Connect error code.
fn status_of(code: &str) -> u16 {
    match code {
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
    }
}

/// The Connect code of an HTTP status that carried no Connect error (a proxy answered).
fn code_of(status: u16) -> &'static str {
    match status {
        400 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "already_exists",
        429 => "resource_exhausted",
        502 | 503 => "unavailable",
        504 => "deadline_exceeded",
        _ => "unknown",
    }
}

/// Gives an envd error its Connect code, from the status when the body had none.
fn with_code(e: ProviderError) -> ProviderError {
    match e {
        ProviderError::Status {
            provider,
            surface,
            status,
            code: None,
            message,
            retry_after,
        } => ProviderError::Status {
            provider,
            surface,
            status,
            code: Some(code_of(status).to_owned()),
            message,
            retry_after,
        },
        e => e,
    }
}

impl ProcessStream {
    /// The next event (keepalives skipped); `None` once the stream has ended well.
    pub(crate) async fn next(&mut self) -> Result<Option<ProcessEvent>, ProviderError> {
        loop {
            match self
                .decoder
                .next_frame()
                .map_err(|m| self.http.protocol(Surface::Envd, m))?
            {
                Some(Frame::Message(bytes)) => {
                    let m: ProcessStreamMessage = serde_json::from_slice(&bytes).map_err(|e| {
                        self.http
                            .protocol(Surface::Envd, format!("sent a malformed event: {e}"))
                    })?;
                    match m.event {
                        Some(e) if e.start.is_some() || e.data.is_some() || e.end.is_some() => {
                            return Ok(Some(e));
                        }
                        // A keepalive, or an event of a kind runbox does not know.
                        _ => continue,
                    }
                }
                Some(Frame::End(Ok(()))) => return Ok(None),
                Some(Frame::End(Err(e))) => {
                    return Err(ProviderError::Status {
                        provider: self.http.provider.name(),
                        surface: Surface::Envd,
                        status: status_of(&e.code),
                        code: Some(e.code),
                        message: e.message,
                        retry_after: None,
                    });
                }
                None => {}
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(e)) => return Err(self.http.transport(Surface::Envd, e)),
                None => {
                    return Err(self
                        .http
                        .protocol(Surface::Envd, "stream ended before its end"));
                }
            }
        }
    }
}

impl Sandboxes {
    pub(crate) fn new(http: Http, config: std::sync::Arc<E2bConfig>) -> Self {
        Self { http, config }
    }

    /// A request to `path` on `port` of the sandbox, with its token and routing headers.
    fn request(&self, remote: &Remote, port: u16, method: Method, path: &str) -> RequestBuilder {
        let url = format!(
            "{}{path}",
            self.config
                .sandbox_base(port, &remote.id, remote.domain.as_deref())
        );
        let mut r = self.http.client.request(method, url);
        if let Some(t) = &remote.envd_token {
            r = r.header("X-Access-Token", t);
        }
        // Novita's code interpreter requests carry no routing headers (as its SDK sends).
        let routed = port == ENVD_PORT || self.config.provider == Provider::E2b;
        if routed && let Some((id, p)) = self.config.provider.routing_headers() {
            r = r.header(id, &remote.id).header(p, port.to_string());
        }
        r
    }

    /// A request to the code interpreter (port 49999).
    pub(crate) fn interpreter(
        &self,
        remote: &Remote,
        method: Method,
        path: &str,
    ) -> RequestBuilder {
        let mut r = self.request(remote, INTERPRETER_PORT, method, path);
        if let Some(t) = &remote.traffic_token {
            r = r.header("E2B-Traffic-Access-Token", t);
        }
        r
    }

    /// A unary Connect call to envd.
    pub(crate) async fn unary<Q: Serialize, R: DeserializeOwned>(
        &self,
        remote: &Remote,
        rpc: &str,
        req: &Q,
    ) -> Result<R, ProviderError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| self.http.protocol(Surface::Envd, format!("request: {e}")))?;
        let timeout = self.config.request_timeout;
        let path = format!("/{rpc}");
        let response = self
            .http
            .send(Surface::Envd, Retry::Idempotent, || {
                self.request(remote, ENVD_PORT, Method::POST, &path)
                    .timeout(timeout)
                    .header("Content-Type", "application/json")
                    .header("Connect-Protocol-Version", "1")
                    .header("Content-Encoding", "identity")
                    .header("Connect-Timeout-Ms", timeout.as_millis().to_string())
                    .body(body.clone())
            })
            .await
            .map_err(with_code)?;
        let bytes = self.http.body(Surface::Envd, response, MAX_UNARY).await?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes).map_err(|e| {
            self.http.protocol(
                Surface::Envd,
                format!("sent an answer to {rpc} runbox cannot read: {e}"),
            )
        })
    }

    /// Starts a process; with `deadline`, envd kills it when that has passed.
    /// Starts a process as the template's default user, or as `user`.
    pub(crate) async fn start(
        &self,
        remote: &Remote,
        req: &StartRequest<'_>,
        deadline: Option<Duration>,
        user: Option<&str>,
    ) -> Result<ProcessStream, ProviderError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| self.http.protocol(Surface::Envd, format!("request: {e}")))?;
        self.stream(
            remote,
            "process.Process/Start",
            envelope(&body),
            deadline,
            user,
        )
        .await
    }

    /// Re-attaches to the event stream of a running process.
    pub(crate) async fn attach(
        &self,
        remote: &Remote,
        pid: u32,
    ) -> Result<ProcessStream, ProviderError> {
        let body = serde_json::to_vec(&SelectRequest {
            process: PidSelector { pid },
        })
        .map_err(|e| self.http.protocol(Surface::Envd, format!("request: {e}")))?;
        self.stream(
            remote,
            "process.Process/Connect",
            envelope(&body),
            None,
            None,
        )
        .await
    }

    async fn stream(
        &self,
        remote: &Remote,
        rpc: &str,
        body: Vec<u8>,
        deadline: Option<Duration>,
        user: Option<&str>,
    ) -> Result<ProcessStream, ProviderError> {
        // envd reads only the user name of a Basic header.
        let basic = user.map(|u| {
            use base64::Engine as _;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:"))
            )
        });
        let path = format!("/{rpc}");
        let response = self
            .http
            .send(Surface::Envd, Retry::Refused, || {
                let mut r = self
                    .request(remote, ENVD_PORT, Method::POST, &path)
                    .header("Content-Type", "application/connect+json")
                    .header("Connect-Protocol-Version", "1")
                    .header("Connect-Content-Encoding", "identity")
                    .header("Connect-Accept-Encoding", "identity")
                    .header("Keepalive-Ping-Interval", KEEPALIVE_SECONDS)
                    .body(body.clone());
                if let Some(d) = deadline {
                    r = r.header("Connect-Timeout-Ms", d.as_millis().max(1).to_string());
                }
                if let Some(b) = &basic {
                    r = r.header("Authorization", b);
                }
                r
            })
            .await
            .map_err(with_code)?;
        Ok(ProcessStream {
            body: Box::pin(response.bytes_stream()),
            decoder: Decoder::default(),
            http: self.http.clone(),
        })
    }

    /// Sends SIGKILL (or SIGTERM) to a process; `false` when there is no such process.
    pub(crate) async fn signal(
        &self,
        remote: &Remote,
        pid: u32,
        kill: bool,
    ) -> Result<bool, ProviderError> {
        let req = SignalRequest {
            process: PidSelector { pid },
            signal: if kill {
                "SIGNAL_SIGKILL"
            } else {
                "SIGNAL_SIGTERM"
            },
        };
        match self
            .unary::<_, serde_json::Value>(remote, "process.Process/SendSignal", &req)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("not_found") => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn stat(
        &self,
        remote: &Remote,
        path: &str,
    ) -> Result<EntryInfo, ProviderError> {
        let r: EntryResponse = self
            .unary(remote, "filesystem.Filesystem/Stat", &PathRequest { path })
            .await?;
        Ok(r.entry)
    }

    pub(crate) async fn list_dir(
        &self,
        remote: &Remote,
        path: &str,
        depth: u32,
    ) -> Result<Vec<EntryInfo>, ProviderError> {
        let r: ListDirResponse = self
            .unary(
                remote,
                "filesystem.Filesystem/ListDir",
                &ListDirRequest { path, depth },
            )
            .await?;
        Ok(r.entries)
    }

    /// Downloads a file; the answer's body is its bytes.
    pub(crate) async fn download(
        &self,
        remote: &Remote,
        path: &str,
    ) -> Result<reqwest::Response, ProviderError> {
        self.http
            .send(Surface::Envd, Retry::Idempotent, || {
                self.request(remote, ENVD_PORT, Method::GET, "/files")
                    .query(&[("path", path)])
            })
            .await
            .map_err(with_code)
    }

    /// Uploads `data` as the file `path` (parents made, an old file replaced).
    pub(crate) async fn upload(
        &self,
        remote: &Remote,
        path: &str,
        data: Bytes,
    ) -> Result<(), ProviderError> {
        // The part's file name is the destination (as the SDKs send it); a name that cannot
        // be quoted in a header goes as a raw body instead, with the path in the query.
        let multipart = !path.contains(['"', '\r', '\n', '\\']);
        let boundary = boundary();
        let timeout = self.config.request_timeout;
        let body: Bytes = if multipart {
            let mut b = Vec::with_capacity(data.len() + 256);
            b.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
                     filename=\"{path}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            );
            b.extend_from_slice(&data);
            b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
            b.into()
        } else {
            data
        };
        let content_type = if multipart {
            format!("multipart/form-data; boundary={boundary}")
        } else {
            "application/octet-stream".to_owned()
        };
        self.http
            .send(Surface::Envd, Retry::Idempotent, || {
                self.request(remote, ENVD_PORT, Method::POST, "/files")
                    .query(&[("path", path)])
                    .timeout(timeout)
                    .header("Content-Type", &content_type)
                    .body(body.clone())
            })
            .await
            .map_err(with_code)?;
        Ok(())
    }
}

/// A multipart boundary no file's bytes are likely to hold.
fn boundary() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        return "runbox-boundary-7d1f0c2a9e4b8d35".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(frames: &[(u8, &str)]) -> ProcessStream {
        let mut body = Vec::new();
        for (flags, json) in frames {
            let mut e = envelope(json.as_bytes());
            e[0] = *flags;
            body.extend(e);
        }
        let http = Http {
            client: reqwest::Client::new(),
            provider: Provider::E2b,
            max_retries: 0,
        };
        let response = reqwest::Response::from(http::Response::new(body));
        ProcessStream {
            body: Box::pin(response.bytes_stream()),
            decoder: Decoder::default(),
            http,
        }
    }

    #[tokio::test]
    async fn a_stream_must_end_with_its_end_envelope() {
        let mut s = stream(&[
            (0, r#"{"event":{"start":{"pid":7}}}"#),
            (0, r#"{"event":{"keepalive":{}}}"#),
            (0, r#"{"event":{"data":{"stdout":"aGkK"}}}"#),
        ]);
        assert_eq!(s.next().await.unwrap().unwrap().start.unwrap().pid, 7);
        // The keepalive is skipped.
        assert_eq!(
            s.next().await.unwrap().unwrap().data.unwrap().stdout,
            b"hi\n"
        );
        let e = s.next().await.unwrap_err();
        assert!(e.to_string().contains("stream ended before its end"), "{e}");
    }

    #[tokio::test]
    async fn an_end_envelope_carries_the_call_s_outcome() {
        let mut s = stream(&[(0, r#"{"event":{"end":{}}}"#), (2, "{}")]);
        let end = s.next().await.unwrap().unwrap().end.unwrap();
        assert_eq!((end.exit_code, end.exited), (0, false));
        assert!(s.next().await.unwrap().is_none());
        let mut s = stream(&[(
            2,
            r#"{"error":{"code":"deadline_exceeded","message":"too long"}}"#,
        )]);
        let e = s.next().await.unwrap_err();
        assert_eq!(
            (e.code(), e.status()),
            (Some("deadline_exceeded"), Some(408))
        );
    }

    #[test]
    fn codes_and_statuses_map_both_ways() {
        for code in [
            "not_found",
            "unauthenticated",
            "already_exists",
            "unavailable",
        ] {
            assert_eq!(code_of(status_of(code)), code);
        }
        assert_eq!(status_of("deadline_exceeded"), 408);
        assert_eq!(code_of(504), "deadline_exceeded");
        assert_eq!(code_of(500), "unknown");
    }
}
