//! The request gate in front of rmcp's `/mcp` service: every POST that cannot be served
//! gets a JSON-RPC error body with the code the spec names, instead of rmcp's plain-text
//! `413` or `415`.
//!
//! - A `Content-Length` past the limit is refused before a byte of the body is read, and a
//!   body that grows past it while read is refused too (`413`, `-32600`, with the id when
//!   the bytes read hold one).
//! - A body rmcp cannot decode: not JSON (`-32700`), a batch or not a JSON-RPC message
//!   (`-32600`), with `400`.
//! - An `initialize` past the caps on sessions (`503`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use rmcp::model::{ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage};

use super::sessions::{SESSION_HEADER, SessionBook, tenant_of};
use crate::jsonrpc::{IdScanner, diagnose, too_large};
use runbox_http::{Metrics, Rejection};

/// State of the [`gate`] layer.
#[derive(Debug, Clone)]
pub(crate) struct GateState {
    pub(crate) max_bytes: usize,
    pub(crate) book: Arc<SessionBook>,
    pub(crate) default_tenant: String,
    pub(crate) metrics: Arc<Metrics>,
}

/// A JSON-RPC error as an HTTP answer.
fn error_response(status: StatusCode, id: Option<RequestId>, error: ErrorData) -> Response {
    let message = ServerJsonRpcMessage::error(error, id);
    let body = serde_json::to_vec(&message).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Whether a request says its body is JSON (as rmcp requires; other types keep rmcp's `415`).
fn is_json(req_headers: &axum::http::HeaderMap) -> bool {
    req_headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

pub(crate) async fn gate(State(state): State<GateState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || !is_json(req.headers()) {
        return next.run(req).await;
    }
    let limit = state.max_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > limit as u64
    {
        state.metrics.rejected(Rejection::TooLarge);
        let size = usize::try_from(declared).unwrap_or(usize::MAX);
        return error_response(StatusCode::PAYLOAD_TOO_LARGE, None, too_large(size, limit));
    }
    let (parts, body) = req.into_parts();
    let bytes = match collect(body, limit).await {
        Ok(bytes) => bytes,
        Err(Collected::TooLarge(prefix)) => {
            state.metrics.rejected(Rejection::TooLarge);
            let mut scanner = IdScanner::default();
            scanner.feed(&prefix);
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                scanner.id(),
                too_large(limit + 1, limit),
            );
        }
        Err(Collected::Failed(e)) => {
            tracing::debug!("reading a request body: {e}");
            return error_response(
                StatusCode::BAD_REQUEST,
                None,
                ErrorData::invalid_request(
                    format!("the request body could not be read ({e}); send it again"),
                    None,
                ),
            );
        }
    };
    let req = Request::from_parts(parts, Body::from(bytes.clone()));
    if !req.headers().contains_key(SESSION_HEADER)
        && let Some(why) = state.book.refusal(&tenant_of(&req, &state.default_tenant))
        && let Some(id) = initialize_id(&bytes)
    {
        state.metrics.rejected(Rejection::Sessions);
        let mut response = error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            id,
            ErrorData::new(ErrorCode(-32000), why, None),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
        return response;
    }
    let response = next.run(req).await;
    // rmcp answers 415 for a JSON body it cannot decode (the Content-Type was checked above).
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return match diagnose(&bytes) {
            Some((id, error)) => error_response(StatusCode::BAD_REQUEST, id, error),
            None => {
                let mut accepted = Response::new(Body::empty());
                *accepted.status_mut() = StatusCode::ACCEPTED;
                accepted
            }
        };
    }
    response
}

/// The id of an `initialize` request, `Some(None)` for one without a readable id; `None`
/// for any other message.
fn initialize_id(bytes: &[u8]) -> Option<Option<RequestId>> {
    #[derive(serde::Deserialize)]
    struct Probe {
        method: Option<String>,
        id: Option<serde_json::Value>,
    }
    let probe = serde_json::from_slice::<Probe>(bytes).ok()?;
    (probe.method.as_deref() == Some("initialize"))
        .then(|| probe.id.and_then(|v| serde_json::from_value(v).ok()))
}

enum Collected {
    /// Past the limit: what was read.
    TooLarge(Bytes),
    Failed(axum::Error),
}

/// Reads a body of at most `limit` bytes.
async fn collect(mut body: Body, limit: usize) -> Result<Bytes, Collected> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Collected::Failed)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > limit {
            buf.extend_from_slice(&data[..limit - buf.len()]);
            return Err(Collected::TooLarge(buf.freeze()));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}
