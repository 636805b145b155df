//! Sending a request to the provider: retries of refusals that are only for now (429, 502,
//! 503, 504, honouring `Retry-After` and `Should-Retry`), and errors that say which surface
//! answered what.

use std::time::Duration;

use reqwest::{RequestBuilder, Response, StatusCode};

use crate::config::Provider;

/// Longest `Retry-After` waited for; beyond it the refusal is reported with the delay.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// Longest error text kept from a response body.
const MAX_ERROR_TEXT: usize = 500;

/// Which of the provider's HTTP surfaces a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// The REST control plane (`api.{domain}`).
    Api,
    /// envd, the daemon in the sandbox (port 49983).
    Envd,
    /// The code interpreter (port 49999).
    Interpreter,
}

impl Surface {
    fn name(self) -> &'static str {
        match self {
            Surface::Api => "API",
            Surface::Envd => "sandbox daemon (envd)",
            Surface::Interpreter => "code interpreter",
        }
    }
}

/// A request that failed at the provider.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProviderError {
    /// The provider answered with an error status.
    #[error("{provider}'s {} answered {status}: {message}", surface.name())]
    Status {
        provider: &'static str,
        surface: Surface,
        status: u16,
        /// A Connect error code (`not_found`, ...), or E2B's `error_code`.
        code: Option<String>,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The provider could not be reached, or the connection broke.
    #[error("the connection to {provider}'s {} failed: {source}", surface.name())]
    Transport {
        provider: &'static str,
        surface: Surface,
        #[source]
        source: reqwest::Error,
    },
    /// The answer did not follow the protocol (a stream cut short, a malformed message).
    #[error("{provider}'s {} {message}", surface.name())]
    Protocol {
        provider: &'static str,
        surface: Surface,
        message: String,
    },
}

impl ProviderError {
    /// The HTTP status, for an error status.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The Connect error code, for an envd error.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            Self::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// Whether the sandbox itself is gone (expired or killed): the control plane's 404, or
    /// the edge proxy's 502 saying the sandbox "was not found".
    pub(crate) fn sandbox_gone(&self) -> bool {
        match self {
            Self::Status {
                surface: Surface::Api,
                status: 404,
                ..
            } => true,
            Self::Status {
                surface: Surface::Envd | Surface::Interpreter,
                status: 502,
                message,
                ..
            } => message.contains("was not found"),
            _ => false,
        }
    }

    /// Turns this into the error the front end shows, for sandbox `id` (when there is one).
    pub(crate) fn into_core(self, id: Option<&str>) -> runbox_core::Error {
        use runbox_core::Error;
        if let Some(id) = id
            && self.sandbox_gone()
        {
            return Error::not_found(id);
        }
        match &self {
            Self::Status {
                provider,
                surface: Surface::Api,
                status: 401 | 403,
                message,
                ..
            } => Error::InvalidRequest(format!(
                "{provider} refused the API key: {message}; check the key (with --auth \
                 passthrough, the one you send as Authorization: Bearer)"
            )),
            Self::Status {
                provider,
                status: 429,
                message,
                retry_after,
                ..
            } => Error::LimitReached(match retry_after {
                Some(d) => format!(
                    "{provider} is limiting requests ({message}); retry in {} s",
                    d.as_secs().max(1)
                ),
                None => format!("{provider} is limiting requests ({message}); retry later"),
            }),
            _ => Error::sandbox_caused_by("the cloud sandbox provider failed the request", self),
        }
    }
}

/// Which refusals a request may be retried after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Every "for now" status: the request is idempotent.
    Idempotent,
    /// Only 429 and 503, which refuse a request before it is acted on: for requests that
    /// must not run twice (creating a sandbox).
    Refused,
    /// Never (a run: it may have started).
    Never,
}

/// The provider's HTTP client.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    pub(crate) client: reqwest::Client,
    pub(crate) provider: Provider,
    pub(crate) max_retries: u32,
}

impl Http {
    /// Sends the request `build` makes, again after a refusal for now, and returns the
    /// answer if it is a success; an error with the provider's message otherwise.
    pub(crate) async fn send(
        &self,
        surface: Surface,
        retry: Retry,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Response, ProviderError> {
        let mut attempt = 0u32;
        loop {
            let response = build()
                .send()
                .await
                .map_err(|source| self.transport(surface, source))?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let retry_after = retry_after(&response);
            let retryable = match retry {
                Retry::Idempotent => matches!(status.as_u16(), 429 | 502 | 503 | 504),
                Retry::Refused => matches!(status.as_u16(), 429 | 503),
                Retry::Never => false,
            };
            let should = response
                .headers()
                .get("should-retry")
                .and_then(|v| v.to_str().ok())
                .map(str::to_ascii_lowercase);
            let retryable = match should.as_deref() {
                Some("false") => false,
                Some("true") => retry != Retry::Never,
                _ => retryable,
            };
            let error = self.error(surface, response, retry_after).await;
            // The edge proxy's "sandbox not found" is final, whatever its status says.
            if !retryable || attempt >= self.max_retries || error.sandbox_gone() {
                return Err(error);
            }
            let wait = match retry_after {
                Some(d) if d > MAX_RETRY_AFTER => return Err(error),
                Some(d) => d,
                None => backoff(attempt),
            };
            attempt += 1;
            tracing::debug!(
                status = status.as_u16(),
                attempt,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "provider refused a request for now; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// The whole body of `response`, refused past `max` bytes: what a sandbox's daemons send
    /// is as untrusted as the code in the sandbox, which may replace them.
    pub(crate) async fn body(
        &self,
        surface: Surface,
        response: Response,
        max: usize,
    ) -> Result<bytes::Bytes, ProviderError> {
        use futures_util::StreamExt as _;
        let mut body = response.bytes_stream();
        let mut all = bytes::BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.transport(surface, e))?;
            if all.len() + chunk.len() > max {
                return Err(self.protocol(
                    surface,
                    format!(
                        "sent an answer larger than runbox accepts ({} MiB)",
                        max >> 20
                    ),
                ));
            }
            all.extend_from_slice(&chunk);
        }
        Ok(all.freeze())
    }

    pub(crate) fn transport(&self, surface: Surface, source: reqwest::Error) -> ProviderError {
        ProviderError::Transport {
            provider: self.provider.name(),
            surface,
            source,
        }
    }

    pub(crate) fn protocol(&self, surface: Surface, message: impl Into<String>) -> ProviderError {
        ProviderError::Protocol {
            provider: self.provider.name(),
            surface,
            message: message.into(),
        }
    }

    /// The error an unsuccessful `response` stands for: its JSON `message` (and Connect
    /// `code`, or E2B `error_code`) when it has one, else its text.
    pub(crate) async fn error(
        &self,
        surface: Surface,
        response: Response,
        retry_after: Option<Duration>,
    ) -> ProviderError {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let (code, message) = parse_error_body(status, &text);
        ProviderError::Status {
            provider: self.provider.name(),
            surface,
            status: status.as_u16(),
            code,
            message,
            retry_after,
        }
    }
}

/// The code and message of an error body: `{"code": "not_found", "message": ...}`
/// (Connect), `{"code": 404, "message": ..., "error_code": ...}` (the control plane), or
/// plain text (a proxy).
pub(crate) fn parse_error_body(status: StatusCode, text: &str) -> (Option<String>, String) {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
        && let Some(o) = v.as_object()
    {
        let code = o
            .get("code")
            .and_then(|c| c.as_str())
            .or_else(|| o.get("error_code").and_then(|c| c.as_str()))
            .map(str::to_owned);
        if let Some(m) = o.get("message").and_then(|m| m.as_str()) {
            return (code, shorten(m));
        }
        if code.is_some() {
            return (
                code,
                status.canonical_reason().unwrap_or("error").to_owned(),
            );
        }
    }
    let text = text.trim();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        shorten(text)
    };
    (None, message)
}

fn shorten(s: &str) -> String {
    if s.len() <= MAX_ERROR_TEXT {
        return s.to_owned();
    }
    let mut end = MAX_ERROR_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// `Retry-After` as delta-seconds (an HTTP date is rare from APIs and taken as one second).
fn retry_after(response: &Response) -> Option<Duration> {
    let v = response.headers().get(reqwest::header::RETRY_AFTER)?;
    let s = v.to_str().ok()?.trim();
    Some(match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => Duration::from_secs(1),
    })
}

/// Exponential backoff with jitter: about 0.5 s, 1 s, 2 s, ... up to 10 s.
fn backoff(attempt: u32) -> Duration {
    let base = 500u64.saturating_mul(1 << attempt.min(5)).min(10_000);
    let mut b = [0u8; 2];
    let jitter = match getrandom::fill(&mut b) {
        Ok(()) => u64::from(u16::from_le_bytes(b)) % (base / 4 + 1),
        Err(_) => 0,
    };
    Duration::from_millis(base - base / 8 + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_of_every_surface_are_read() {
        let (c, m) = parse_error_body(
            StatusCode::NOT_FOUND,
            r#"{"code":"not_found","message":"file not found"}"#,
        );
        assert_eq!(
            (c.as_deref(), m.as_str()),
            (Some("not_found"), "file not found")
        );
        let (c, m) = parse_error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"code":503,"message":"no capacity","error_code":"sandbox_capacity_unavailable"}"#,
        );
        assert_eq!(c.as_deref(), Some("sandbox_capacity_unavailable"));
        assert_eq!(m, "no capacity");
        let (c, m) = parse_error_body(StatusCode::BAD_GATEWAY, "sandbox abc was not found\n");
        assert_eq!((c, m.as_str()), (None, "sandbox abc was not found"));
        let (_, m) = parse_error_body(StatusCode::BAD_GATEWAY, "");
        assert_eq!(m, "Bad Gateway");
        let (_, m) = parse_error_body(StatusCode::BAD_GATEWAY, &"é".repeat(600));
        assert!(m.ends_with('…') && m.len() <= MAX_ERROR_TEXT + 3);
    }

    #[tokio::test]
    async fn bodies_past_the_cap_are_refused() {
        let http = Http {
            client: reqwest::Client::new(),
            provider: Provider::E2b,
            max_retries: 0,
        };
        let answer = |body: &'static str| reqwest::Response::from(http::Response::new(body));
        let ok = http
            .body(Surface::Envd, answer("0123456789"), 10)
            .await
            .unwrap();
        assert_eq!(&ok[..], b"0123456789");
        let e = http
            .body(Surface::Envd, answer("0123456789!"), 10)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("larger than runbox accepts"), "{e}");
    }

    #[test]
    fn backoff_grows_and_stays_bounded() {
        assert!(backoff(0) >= Duration::from_millis(437));
        assert!(backoff(0) <= Duration::from_millis(600));
        assert!(backoff(2) >= Duration::from_millis(1750));
        assert!(backoff(30) <= Duration::from_millis(12_500));
    }

    fn status(surface: Surface, status: u16, message: &str) -> ProviderError {
        ProviderError::Status {
            provider: "E2B",
            surface,
            status,
            code: None,
            message: message.into(),
            retry_after: Some(Duration::from_secs(7)),
        }
    }

    #[test]
    fn errors_become_what_the_caller_can_act_on() {
        use runbox_core::Error;
        let gone = status(Surface::Envd, 502, "The sandbox sbx1 was not found");
        assert!(matches!(
            gone.into_core(Some("sbx1")),
            Error::SandboxNotFound { .. }
        ));
        let closed_port = status(Surface::Envd, 502, "port is not open");
        assert!(matches!(
            closed_port.into_core(Some("sbx1")),
            Error::Sandbox { .. }
        ));
        let key = status(Surface::Api, 401, "Invalid API key").into_core(None);
        assert!(key.to_string().contains("refused the API key"), "{key}");
        let slow = status(Surface::Api, 429, "too many").into_core(None);
        assert!(slow.to_string().contains("retry in 7 s"), "{slow}");
        let other = status(Surface::Api, 500, "boom").into_core(None);
        assert!(runbox_core::chain(&other).contains("answered 500: boom"));
    }
}
