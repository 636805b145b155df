//! Response bodies: chunking, cuts, streams, Connect envelopes, Python-style JSON.

use std::io;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize as _;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::Chunking;

type Item = Result<Bytes, io::Error>;

/// Split `data` into chunks per `chunking`; `pos` is the number of bytes of the body
/// already chunked (so `Every(n)` boundaries fall at multiples of n across messages).
fn split(data: &Bytes, chunking: Chunking, pos: &mut usize, out: &mut Vec<Bytes>) {
    let len = data.len();
    match chunking {
        Chunking::Whole => {
            if len > 0 {
                out.push(data.clone());
            }
        }
        Chunking::Bytewise => out.extend((0..len).map(|i| data.slice(i..i + 1))),
        Chunking::Every(n) => {
            let n = n.max(1);
            let mut i = 0;
            while i < len {
                let take = (n - *pos % n).min(len - i);
                out.push(data.slice(i..i + take));
                i += take;
                *pos += take;
            }
            return;
        }
    }
    *pos += len;
}

/// How long a cut body pauses before the abort, so the bytes before it reach the client.
const CUT_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

fn cut_error() -> io::Error {
    io::Error::other("runbox-e2b-fake: body cut by a fault")
}

/// Response headers used below.
pub(crate) const JSON: &str = "application/json";
pub(crate) const TEXT: &str = "text/plain; charset=utf-8";
pub(crate) const CONNECT_JSON: &str = "application/connect+json";
pub(crate) const OCTET: &str = "application/octet-stream";

fn build(
    status: StatusCode,
    content_type: Option<&str>,
    extra: &[(&str, String)],
    body: Body,
) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Some(ct) = content_type
        && let Ok(v) = HeaderValue::from_str(ct)
    {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    for (k, v) in extra {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            resp.headers_mut().append(name, value);
        }
    }
    resp
}

/// A plain (non-streamed) response, chunked per `chunking`; `cut` sends only the first
/// half of the bytes and then aborts the connection.
pub(crate) fn plain(
    chunking: Chunking,
    status: StatusCode,
    content_type: Option<&str>,
    extra: &[(&str, String)],
    body: impl Into<Bytes>,
    cut: bool,
) -> Response {
    let body: Bytes = body.into();
    if !cut && chunking == Chunking::Whole {
        return build(status, content_type, extra, Body::from(body));
    }
    let data = if cut {
        body.slice(0..body.len() / 2)
    } else {
        body
    };
    let mut pieces = Vec::new();
    split(&data, chunking, &mut 0, &mut pieces);
    let items = futures_util::stream::iter(pieces.into_iter().map(Ok::<Bytes, io::Error>));
    let body = if cut {
        Body::from_stream(items.chain(futures_util::stream::once(async {
            // Let the server flush what was sent before the connection is aborted.
            tokio::time::sleep(CUT_PAUSE).await;
            Err(cut_error())
        })))
    } else {
        Body::from_stream(items)
    };
    build(status, content_type, extra, body)
}

/// The sending half of a streamed response body.
pub(crate) struct StreamTx {
    tx: mpsc::Sender<Item>,
    chunking: Chunking,
    pos: usize,
    cut: bool,
    dead: bool,
}

impl StreamTx {
    /// Send one message (chunked); false once the client is gone or the stream was cut.
    pub async fn send(&mut self, msg: impl Into<Bytes>) -> bool {
        if self.dead {
            return false;
        }
        let msg: Bytes = msg.into();
        let mut pieces = Vec::new();
        split(&msg, self.chunking, &mut self.pos, &mut pieces);
        for p in pieces {
            if self.tx.send(Ok(p)).await.is_err() {
                self.dead = true;
                return false;
            }
        }
        if self.cut {
            self.abort().await;
            return false;
        }
        true
    }

    /// Abort the connection without finishing the body.
    pub async fn abort(&mut self) {
        if !self.dead {
            tokio::time::sleep(CUT_PAUSE).await;
            let _ = self.tx.send(Err(cut_error())).await;
            self.dead = true;
        }
    }
}

/// A streamed 200 response; the body ends when the returned sender is dropped. With
/// `cut`, the connection is aborted right after the first message.
pub(crate) fn streaming(chunking: Chunking, content_type: &str, cut: bool) -> (Response, StreamTx) {
    let (tx, rx) = mpsc::channel::<Item>(64);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let resp = build(
        StatusCode::OK,
        Some(content_type),
        &[],
        Body::from_stream(stream),
    );
    (
        resp,
        StreamTx {
            tx,
            chunking,
            pos: 0,
            cut,
            dead: false,
        },
    )
}

/// One Connect envelope: flags, big-endian u32 length, JSON.
pub(crate) fn envelope(flags: u8, json: &Value) -> Bytes {
    let payload = json.to_string().into_bytes();
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

/// Serialises like Python's `json.dumps` defaults: `", "` and `": "` separators.
struct PyFormatter;

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `v` as one NDJSON line in the code interpreter's style (with the trailing `\n`).
pub(crate) fn py_line(v: &Value) -> Bytes {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, PyFormatter);
    if v.serialize(&mut ser).is_err() {
        buf = v.to_string().into_bytes();
    }
    buf.push(b'\n');
    Bytes::from(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_n_counts_across_messages() {
        let mut pos = 0;
        let mut out = Vec::new();
        split(
            &Bytes::from_static(b"abcde"),
            Chunking::Every(3),
            &mut pos,
            &mut out,
        );
        split(
            &Bytes::from_static(b"fgh"),
            Chunking::Every(3),
            &mut pos,
            &mut out,
        );
        let got: Vec<&[u8]> = out.iter().map(|b| b.as_ref()).collect();
        assert_eq!(got, vec![&b"abc"[..], b"de", b"f", b"gh"]);
    }

    #[test]
    fn python_style_lines() {
        let v = serde_json::json!({"a": [1, 2], "b": {"c": null}});
        assert_eq!(&py_line(&v)[..], b"{\"a\": [1, 2], \"b\": {\"c\": null}}\n");
    }

    #[test]
    fn envelope_bytes() {
        let e = envelope(2, &serde_json::json!({}));
        assert_eq!(&e[..], b"\x02\x00\x00\x00\x02{}");
    }
}
