//! MCP over stdin and stdout: one JSON-RPC message per line. Every request gets an answer,
//! even one the server cannot read: a line that is not JSON gets `-32700`, a batch or a line
//! that is not a JSON-RPC message gets `-32600`, and a line longer than the limit is skipped
//! without being kept in memory while its top-level `id` is read as it goes by, so that the
//! client gets `-32600` for it instead of waiting forever. Notifications get no answer.

use std::io;
use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use crate::jsonrpc::{IdScanner, diagnose, too_large};

/// The stdio transport over any reader and writer.
pub(crate) struct LineTransport<R, W> {
    read: R,
    /// The line being read (kept across cancelled reads: `receive` is raced by the service).
    line: Vec<u8>,
    /// While an oversized line is skipped: its id as far as read, and its size so far.
    skipping: Option<(IdScanner, usize)>,
    max_line: usize,
    out: Arc<Mutex<Output<W>>>,
}

/// The writing half: whole messages are queued before any byte is written, and whoever holds
/// the lock next writes what is left, so a write interrupted by cancellation never leaves
/// half a line for another message to land in.
struct Output<W> {
    write: Option<W>,
    queued: Vec<u8>,
    written: usize,
}

impl<W: AsyncWrite + Unpin> Output<W> {
    fn queue(&mut self, message: &ServerJsonRpcMessage) -> io::Result<()> {
        serde_json::to_writer(&mut self.queued, message)?;
        self.queued.push(b'\n');
        Ok(())
    }

    async fn flush(&mut self) -> io::Result<()> {
        let Some(write) = self.write.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        while self.written < self.queued.len() {
            let n = write.write(&self.queued[self.written..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written += n;
        }
        self.queued.clear();
        self.written = 0;
        write.flush().await
    }
}

/// What one read step found.
enum Read {
    Line,
    /// An oversized line ended: its id, if read, and its size.
    Oversized(Option<RequestId>, usize),
    Eof,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncBufRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub(crate) fn new(read: R, write: W, max_line: usize) -> Self {
        Self {
            read,
            line: Vec::new(),
            skipping: None,
            max_line,
            out: Arc::new(Mutex::new(Output {
                write: Some(write),
                queued: Vec::new(),
                written: 0,
            })),
        }
    }

    /// Reads up to the end of a line without holding more than `max_line` bytes of it.
    /// Cancellation-safe: bytes are consumed only together with recording them.
    async fn read_line(&mut self) -> io::Result<Read> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Read::Eof);
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let piece = &available[..take];
            let mut ended = None;
            if let Some((scanner, size)) = &mut self.skipping {
                scanner.feed(piece);
                *size += take;
                if newline.is_some() {
                    ended = Some(Read::Oversized(scanner.id(), *size));
                }
            } else if self.line.len() + take > self.max_line {
                let mut scanner = IdScanner::default();
                scanner.feed(&self.line);
                scanner.feed(piece);
                let size = self.line.len() + take;
                self.line.clear();
                if newline.is_some() {
                    ended = Some(Read::Oversized(scanner.id(), size));
                } else {
                    self.skipping = Some((scanner, size));
                }
            } else {
                self.line.extend_from_slice(piece);
                if newline.is_some() {
                    ended = Some(Read::Line);
                }
            }
            self.read.consume(take);
            if let Some(read) = ended {
                if matches!(read, Read::Oversized(..)) {
                    self.skipping = None;
                }
                return Ok(read);
            }
        }
    }
}

/// Queues an error answer; it is written before the next message is read.
async fn answer<W: AsyncWrite + Unpin>(
    out: &Mutex<Output<W>>,
    id: Option<RequestId>,
    error: ErrorData,
) {
    let message = ServerJsonRpcMessage::error(error, id);
    if let Err(e) = out.lock().await.queue(&message) {
        tracing::error!("cannot encode an error answer: {e}");
    }
}

/// Writes what is queued.
async fn flush_answers<W: AsyncWrite + Unpin>(out: &Mutex<Output<W>>) -> io::Result<()> {
    let mut out = out.lock().await;
    if out.queued.len() > out.written {
        out.flush().await?;
    }
    Ok(())
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncBufRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = Arc::clone(&self.out);
        async move {
            let mut out = out.lock().await;
            out.queue(&item)?;
            out.flush().await
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let out = Arc::clone(&self.out);
            if let Err(e) = flush_answers(&out).await {
                tracing::error!("writing to stdout: {e}");
                return None;
            }
            match self.read_line().await {
                Ok(Read::Line) => {}
                Ok(Read::Oversized(Some(id), size)) => {
                    tracing::warn!(
                        size,
                        limit = self.max_line,
                        "a request larger than the limit was skipped and answered with an error"
                    );
                    answer(&out, Some(id), too_large(size, self.max_line)).await;
                    continue;
                }
                Ok(Read::Oversized(None, size)) => {
                    tracing::warn!(
                        size,
                        limit = self.max_line,
                        "a message larger than the limit, with no id to answer, was skipped"
                    );
                    continue;
                }
                Ok(Read::Eof) => return None,
                Err(e) => {
                    tracing::error!("reading stdin: {e}");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let mut text = line.strip_suffix(b"\n").unwrap_or(&line);
            text = text.strip_suffix(b"\r").unwrap_or(text);
            text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<ClientJsonRpcMessage>(text) {
                Ok(message) => return Some(message),
                Err(e) => match diagnose(text) {
                    Some((id, error)) => {
                        tracing::debug!("answering a message that does not decode: {e}");
                        answer(&out, id, error).await;
                    }
                    None => tracing::debug!("ignoring a notification that does not decode: {e}"),
                },
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let mut out = self.out.lock().await;
        let flushed = if out.queued.len() > out.written {
            out.flush().await
        } else {
            Ok(())
        };
        out.write = None;
        flushed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, BufReader};

    async fn exchange(input: Vec<u8>, max: usize) -> (Vec<String>, Vec<String>) {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server);
        let mut t = LineTransport::new(BufReader::new(server_read), server_write, max);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
            let mut out = String::new();
            client.read_to_string(&mut out).await.unwrap();
            out
        });
        let mut received = Vec::new();
        while let Some(m) = t.receive().await {
            received.push(serde_json::to_string(&m).unwrap());
        }
        t.close().await.unwrap();
        drop(t);
        let out = writer.await.unwrap();
        (received, out.lines().map(str::to_owned).collect())
    }

    #[tokio::test]
    async fn every_request_gets_an_answer() {
        let big = "x".repeat(300);
        let input = format!(
            "{{not json\n\
             [{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}}]\n\
             {{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"code\":\"{big}\"}}}}\n\
             {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":{{\"code\":\"{big}\"}}}}\n\
             {{\"method\":\"tools/call\",\"params\":{{\"code\":\"{big}\"}},\"jsonrpc\":\"2.0\",\"id\":\"last\"}}\n\
             \r\n\
             {{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}}\r\n"
        );
        let (received, answers) = exchange(input.into_bytes(), 200).await;
        assert_eq!(received, [r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#]);
        let answers: Vec<serde_json::Value> = answers
            .iter()
            .map(|a| serde_json::from_str(a).unwrap())
            .collect();
        let codes: Vec<_> = answers
            .iter()
            .map(|a| (a["id"].clone(), a["error"]["code"].as_i64().unwrap()))
            .collect();
        assert_eq!(
            codes,
            [
                (serde_json::Value::Null, -32700),
                (serde_json::Value::Null, -32600),
                (serde_json::json!(2), -32600),
                (serde_json::json!("last"), -32600),
            ],
            "{answers:?}"
        );
        assert!(
            answers[2]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("larger than the 200 bytes"),
            "{answers:?}"
        );
    }
}
