//! Reading a proxy request head (`httparse`) and turning it into a destination plus what to
//! send upstream: nothing for `CONNECT`, the origin-form request for plain HTTP.

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
    /// Bytes the client sent after the head (a body, or early tunnel data), to pass on.
    pub rest: Vec<u8>,
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
        rest,
    }))
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
