//! Reading a proxy request head (`httparse`) and turning it into a destination plus what to
//! send upstream: nothing for `CONNECT`, the origin-form request for plain HTTP with how its
//! body is framed. A plain-HTTP request whose framing is ambiguous (both `Content-Length` and
//! `Transfer-Encoding`, two different lengths, an encoding that does not end in `chunked`) is
//! refused: the proxy and the upstream server could disagree on where the body ends, and the
//! bytes after it would reach the upstream as a request the proxy never checked.

use http::uri::{Authority, Uri};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::Host;
use crate::policy::MAX_HEAD_BYTES;

/// Most header lines a request head may have.
const MAX_HEADERS: usize = 100;

/// Headers that concern only the client-proxy hop, never forwarded (RFC 9110 section 7.6.1),
/// plus `Host`, which is rewritten from the target.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
    "host",
];

/// A parsed proxy request.
#[derive(Debug)]
pub(crate) struct Request {
    /// Where to connect.
    pub host: Host,
    /// Which port.
    pub port: u16,
    /// `None` for `CONNECT`; for plain HTTP, the request head to send upstream.
    pub forward: Option<Vec<u8>>,
    /// How the body of a plain-HTTP request ends ([`Framing::None`] for `CONNECT`).
    pub framing: Framing,
    /// Bytes the client sent after the head (a body, or early tunnel data), to pass on.
    pub rest: Vec<u8>,
}

/// Where the body of a plain-HTTP request ends (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding: up to the last chunk and its trailers.
    Chunked,
}

/// Why no request came.
#[derive(Debug)]
pub(crate) enum HeadError {
    /// The client closed, or the socket failed, before a head was complete.
    Closed(Option<std::io::Error>),
    /// The head is not `MAX_HEAD_BYTES` long and still not complete.
    TooLarge,
    /// The head is not a request this proxy serves; the reason is for the client.
    Malformed(String),
}

/// Reads one request head (at most [`MAX_HEAD_BYTES`]) and parses it. The caller applies the
/// timeout.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Request, HeadError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let room = (MAX_HEAD_BYTES - buf.len()).min(chunk.len());
        let n = reader
            .read(&mut chunk[..room])
            .await
            .map_err(|e| HeadError::Closed(Some(e)))?;
        if n == 0 {
            return Err(HeadError::Closed(None));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(request) = parse(&buf)? {
            return Ok(request);
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Parses a buffered head: `Ok(None)` while incomplete.
fn parse(buf: &[u8]) -> Result<Option<Request>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(malformed(format!("cannot parse the request head: {e}"))),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(malformed("incomplete request line".into()));
    };
    let rest = buf[len..].to_vec();
    if method == "CONNECT" {
        let authority = target.parse::<Authority>().map_err(|_| {
            malformed(format!(
                "CONNECT needs host:port, not `{}`",
                printable(target)
            ))
        })?;
        let port = authority
            .port_u16()
            .ok_or_else(|| malformed("CONNECT needs host:port; the port is missing".into()))?;
        let host = host_of(&authority)?;
        return Ok(Some(Request {
            host,
            port,
            forward: None,
            framing: Framing::None,
            rest,
        }));
    }

    let uri = target.parse::<Uri>().map_err(|_| {
        malformed(format!(
            "cannot parse the request target `{}`",
            printable(target)
        ))
    })?;
    let scheme = uri.scheme_str().unwrap_or("");
    if scheme.eq_ignore_ascii_case("https") {
        return Err(malformed(
            "https URLs go through CONNECT: set HTTPS_PROXY to this proxy".into(),
        ));
    }
    let Some(authority) = uri
        .authority()
        .filter(|_| scheme.eq_ignore_ascii_case("http"))
    else {
        return Err(malformed(
            "this is a forward proxy: send an absolute http:// URL, or CONNECT host:port".into(),
        ));
    };
    let host = host_of(authority)?;
    let port = authority.port_u16().unwrap_or(80);
    let framing = framing(req.headers)?;
    let path = uri.path_and_query().map_or("/", |pq| pq.as_str());
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };

    let mut head = Vec::with_capacity(len + 64);
    head.extend_from_slice(format!("{method} {path} HTTP/1.{version}\r\n").as_bytes());
    head.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    let listed = connection_tokens(req.headers);
    for header in req.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        let framing = name == "content-length" || name == "transfer-encoding";
        if HOP_BY_HOP.contains(&name.as_str())
            || name.starts_with("proxy-")
            || (!framing && listed.contains(&name))
        {
            continue;
        }
        head.extend_from_slice(header.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some(Request {
        host,
        port,
        forward: Some(head),
        framing,
        rest,
    }))
}

/// How a request's body is framed, from its `Content-Length` and `Transfer-Encoding`
/// headers; anything a server could read another way is refused.
fn framing(headers: &[httparse::Header<'_>]) -> Result<Framing, HeadError> {
    let mut length: Option<u64> = None;
    let mut codings: Vec<String> = Vec::new();
    for header in headers {
        let value = std::str::from_utf8(header.value)
            .map_err(|_| malformed("a framing header is not ASCII".into()))?;
        if header.name.eq_ignore_ascii_case("content-length") {
            for item in value.split(',') {
                let item = item.trim();
                let n = (!item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| item.parse::<u64>().ok())
                    .flatten()
                    .ok_or_else(|| {
                        malformed(format!(
                            "Content-Length `{}` is not a length",
                            printable(item)
                        ))
                    })?;
                if length.is_some_and(|l| l != n) {
                    return Err(malformed(
                        "the request has two different Content-Length values".into(),
                    ));
                }
                length = Some(n);
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            codings.extend(
                value
                    .split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .filter(|c| !c.is_empty()),
            );
        }
    }
    match (length, codings.last()) {
        (Some(_), Some(_)) => Err(malformed(
            "the request has both Content-Length and Transfer-Encoding; send one of them".into(),
        )),
        (None, Some(last)) if last == "chunked" => Ok(Framing::Chunked),
        (None, Some(_)) => Err(malformed(
            "a request's Transfer-Encoding must end in chunked".into(),
        )),
        (Some(n), None) => Ok(Framing::Length(n)),
        (None, None) => Ok(Framing::None),
    }
}

/// Finds the end of a chunked body in the bytes that pass through it.
#[derive(Debug, Default)]
pub(crate) struct ChunkedEnd {
    state: ChunkState,
    /// The size line or trailer line being read.
    line: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading a chunk-size line.
    #[default]
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// The CRLF after chunk data; this many of its bytes seen.
    DataEnd(u8),
    /// Reading trailer lines after the last chunk.
    Trailers,
}

/// Longest chunk-size or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

impl ChunkedEnd {
    /// Feeds the next bytes of the body: `Ok(Some(n))` when the body ends after the first
    /// `n` of them, `Ok(None)` when it goes on past them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, HeadError> {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                ChunkState::Data(left) => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len() - i);
                    i += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd(0)
                    } else {
                        ChunkState::Data(left)
                    };
                }
                ChunkState::DataEnd(seen) => {
                    let expected = if seen == 0 { b'\r' } else { b'\n' };
                    if bytes[i] != expected {
                        return Err(malformed("chunk data is not followed by CRLF".into()));
                    }
                    i += 1;
                    self.state = if seen == 0 {
                        ChunkState::DataEnd(1)
                    } else {
                        ChunkState::Size
                    };
                }
                ChunkState::Size | ChunkState::Trailers => {
                    let byte = bytes[i];
                    i += 1;
                    self.line.push(byte);
                    if self.line.len() > MAX_CHUNK_LINE {
                        return Err(malformed("a chunk line is too long".into()));
                    }
                    if byte != b'\n' {
                        continue;
                    }
                    let line = std::mem::take(&mut self.line);
                    if self.state == ChunkState::Trailers {
                        if line == b"\r\n" {
                            return Ok(Some(i));
                        }
                        continue;
                    }
                    let size = match httparse::parse_chunk_size(&line) {
                        Ok(httparse::Status::Complete((_, size))) => size,
                        _ => return Err(malformed("a chunk size line is malformed".into())),
                    };
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
            }
        }
        Ok(None)
    }
}

/// The header names a `Connection` header lists: also hop-by-hop.
fn connection_tokens(headers: &[httparse::Header<'_>]) -> Vec<String> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .filter_map(|h| std::str::from_utf8(h.value).ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect()
}

fn host_of(authority: &Authority) -> Result<Host, HeadError> {
    if authority.as_str().contains('@') {
        return Err(malformed(
            "credentials in the request target are not supported".into(),
        ));
    }
    Host::parse(authority.host()).map_err(|e| malformed(e.to_string()))
}

fn malformed(reason: String) -> HeadError {
    HeadError::Malformed(reason)
}

/// The target for a message, without control characters, cut short.
fn printable(target: &str) -> String {
    target
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(head: &str) -> Request {
        parse(head.as_bytes()).unwrap().unwrap()
    }

    fn parse_err(head: &str) -> String {
        match parse(head.as_bytes()) {
            Err(HeadError::Malformed(why)) => why,
            other => panic!("{head:?}: {other:?}"),
        }
    }

    #[test]
    fn connect_gives_host_port_and_early_data() {
        let r = parse_ok("CONNECT Example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\nhello");
        assert_eq!(r.host, Host::Name("example.org".into()));
        assert_eq!(r.port, 443);
        assert!(r.forward.is_none());
        assert_eq!(r.rest, b"hello");
        let r = parse_ok("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n");
        assert_eq!(r.host, Host::Ip("::1".parse().unwrap()));
        assert_eq!(r.port, 8443);
    }

    #[test]
    fn incomplete_heads_wait_for_more() {
        assert!(
            parse(b"CONNECT example.org:443 HTTP/1.1\r\nHost: x")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn absolute_form_becomes_origin_form_without_hop_by_hop_headers() {
        let r = parse_ok(
            "POST http://Example.org:8080/a/b?q=1 HTTP/1.1\r\nHost: wrong.test\r\n\
             Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\
             Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\
             Content-Length: 4\r\nUser-Agent: test\r\n\r\nbody",
        );
        assert_eq!(r.host, Host::Name("example.org".into()));
        assert_eq!(r.port, 8080);
        assert_eq!(r.rest, b"body");
        let head = String::from_utf8(r.forward.unwrap()).unwrap();
        assert_eq!(
            head,
            "POST /a/b?q=1 HTTP/1.1\r\nHost: Example.org:8080\r\nContent-Length: 4\r\n\
             User-Agent: test\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn plain_http_defaults_to_port_80_and_path_slash() {
        let r = parse_ok("GET http://example.org HTTP/1.0\r\n\r\n");
        assert_eq!(r.port, 80);
        let head = String::from_utf8(r.forward.unwrap()).unwrap();
        assert!(
            head.starts_with("GET / HTTP/1.0\r\nHost: example.org\r\n"),
            "{head}"
        );
    }

    #[test]
    fn framing_headers_survive_a_connection_listing() {
        let r = parse_ok(
            "POST http://example.org/ HTTP/1.1\r\nConnection: Content-Length\r\n\
             Content-Length: 2\r\n\r\nhi",
        );
        let head = String::from_utf8(r.forward.unwrap()).unwrap();
        assert!(head.contains("Content-Length: 2\r\n"), "{head}");
    }

    #[test]
    fn bodies_are_framed_by_length_or_chunks() {
        let r = parse_ok("POST http://example.org/ HTTP/1.1\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(r.framing, Framing::Length(12));
        let r = parse_ok("POST http://example.org/ HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n");
        assert_eq!(r.framing, Framing::Length(3));
        let r = parse_ok(
            "POST http://example.org/ HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
        );
        assert_eq!(r.framing, Framing::Chunked);
        assert_eq!(
            parse_ok("GET http://example.org/ HTTP/1.1\r\n\r\n").framing,
            Framing::None
        );
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for (head, says) in [
            (
                "POST http://example.org/ HTTP/1.1\r\nContent-Length: 4\r\n\
                 Transfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://example.org/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\
                 Content-Length: 4\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://example.org/ HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
                "two different Content-Length",
            ),
            (
                "POST http://example.org/ HTTP/1.1\r\nContent-Length: +4\r\n\r\n",
                "not a length",
            ),
            (
                "POST http://example.org/ HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                "must end in chunked",
            ),
        ] {
            let why = parse_err(head);
            assert!(why.contains(says), "{head:?}: {why}");
        }
    }

    #[test]
    fn the_end_of_a_chunked_body_is_found_across_pieces() {
        let body =
            b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-Trailer: 1\r\n\r\nGET http://evil.test/";
        let end = body.len() - "GET http://evil.test/".len();
        for split in 0..body.len() {
            let mut c = ChunkedEnd::default();
            let first = c.feed(&body[..split]).unwrap();
            let found = match first {
                Some(n) => n,
                None => split + c.feed(&body[split..]).unwrap().unwrap(),
            };
            assert_eq!(found, end, "split at {split}");
        }
        let mut c = ChunkedEnd::default();
        assert!(c.feed(b"zz\r\n").is_err());
        let mut c = ChunkedEnd::default();
        assert!(c.feed(b"2\r\nabXY").is_err());
    }

    #[test]
    fn requests_the_proxy_cannot_serve_are_malformed() {
        for (head, says) in [
            ("NOT A REQUEST\r\n\r\n", "cannot parse"),
            (
                "GET /relative HTTP/1.1\r\nHost: example.org\r\n\r\n",
                "absolute http:// URL",
            ),
            ("GET https://example.org/ HTTP/1.1\r\n\r\n", "CONNECT"),
            (
                "GET ftp://example.org/ HTTP/1.1\r\n\r\n",
                "absolute http:// URL",
            ),
            ("CONNECT example.org HTTP/1.1\r\n\r\n", "port"),
            (
                "CONNECT user@example.org:443 HTTP/1.1\r\n\r\n",
                "credentials",
            ),
            (
                "GET http://user:pw@example.org/ HTTP/1.1\r\n\r\n",
                "credentials",
            ),
            ("CONNECT exa_mple..org:443 HTTP/1.1\r\n\r\n", "invalid host"),
            ("CONNECT 127.1:443 HTTP/1.1\r\n\r\n", "invalid host"),
            ("GET http://example.org/ HTTP/2.0\r\n\r\n", "cannot parse"),
        ] {
            let why = parse_err(head);
            assert!(why.contains(says), "{head:?}: {why}");
        }
    }
}
