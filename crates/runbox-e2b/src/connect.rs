//! The Connect protocol as envd speaks it, JSON codec: unary calls are a JSON POST; a
//! server stream's request is one envelope (flags byte, big-endian u32 length, message) and
//! its answer a sequence of envelopes, the last flagged end-of-stream and carrying either
//! `{}` or the call's error. Envelopes arrive split and merged across chunks at any byte.

use bytes::{Buf, BytesMut};
use serde::Deserialize;

/// Flag of an envelope whose message is compressed (never asked for).
const COMPRESSED: u8 = 0x01;
/// Flag of the end-of-stream envelope.
const END_STREAM: u8 = 0x02;
/// Largest message accepted (envd sends output in chunks of at most a few KiB).
const MAX_MESSAGE: usize = 16 << 20;

/// `message` as the one envelope of a streaming request.
pub(crate) fn envelope(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// What a stream yielded.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame {
    /// One response message.
    Message(Vec<u8>),
    /// The end of the stream: `Ok` when the call succeeded, else its error.
    End(Result<(), EndError>),
}

/// The error an end-of-stream envelope carries.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct EndError {
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
}

#[derive(Deserialize)]
struct EndStream {
    #[serde(default)]
    error: Option<EndError>,
}

/// Reassembles envelopes from the chunks of a response body.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    buf: BytesMut,
    ended: bool,
}

impl Decoder {
    /// Adds a chunk of the body.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame, if the bytes so far hold one.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        if self.ended {
            return if self.buf.is_empty() {
                Ok(None)
            } else {
                Err("sent data after the end of the stream".into())
            };
        }
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(format!(
                "sent a {len}-byte message, more than runbox accepts"
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let message = self.buf.split_to(len).to_vec();
        if flags & COMPRESSED != 0 {
            return Err("sent a compressed message, which runbox did not ask for".into());
        }
        if flags & END_STREAM != 0 {
            self.ended = true;
            let end: EndStream = if message.iter().all(u8::is_ascii_whitespace) {
                EndStream { error: None }
            } else {
                serde_json::from_slice(&message)
                    .map_err(|e| format!("sent a malformed end of stream: {e}"))?
            };
            return Ok(Some(Frame::End(match end.error {
                None => Ok(()),
                Some(e) => Err(e),
            })));
        }
        Ok(Some(Frame::Message(message)))
    }

    /// Whether the end-of-stream envelope has come.
    #[cfg(test)]
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flags: u8, json: &str) -> Vec<u8> {
        let mut v = envelope(json.as_bytes());
        v[0] = flags;
        v
    }

    fn decode_in_pieces(bytes: &[u8], piece: usize) -> Vec<Frame> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for chunk in bytes.chunks(piece) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                out.push(f);
            }
        }
        assert!(d.ended());
        out
    }

    #[test]
    fn envelopes_carry_a_big_endian_length() {
        let e = envelope(br#"{"a":1}"#);
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(&e[5..], br#"{"a":1}"#);
    }

    #[test]
    fn frames_are_reassembled_at_any_split() {
        let mut body = frame(0, r#"{"event":{"start":{"pid":412}}}"#);
        body.extend(frame(0, r#"{"event":{"data":{"stdout":"aGkK"}}}"#));
        body.extend(frame(2, "{}"));
        for piece in [1, 2, 3, 5, 7, 64, body.len()] {
            let frames = decode_in_pieces(&body, piece);
            assert_eq!(frames.len(), 3, "piece {piece}");
            assert_eq!(
                frames[0],
                Frame::Message(br#"{"event":{"start":{"pid":412}}}"#.to_vec())
            );
            assert_eq!(frames[2], Frame::End(Ok(())));
        }
    }

    #[test]
    fn the_end_carries_the_error() {
        let body = frame(
            2,
            r#"{"error":{"code":"deadline_exceeded","message":"too slow"},"metadata":{"k":["v"]}}"#,
        );
        let frames = decode_in_pieces(&body, 4);
        assert_eq!(
            frames,
            [Frame::End(Err(EndError {
                code: "deadline_exceeded".into(),
                message: "too slow".into()
            }))]
        );
        let empty = decode_in_pieces(&frame(2, ""), 1);
        assert_eq!(empty, [Frame::End(Ok(()))]);
    }

    #[test]
    fn malformed_streams_are_refused() {
        let mut d = Decoder::default();
        d.push(&frame(1, "{}"));
        assert!(d.next_frame().unwrap_err().contains("compressed"));
        let mut d = Decoder::default();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().unwrap_err().contains("more than"));
        let mut d = Decoder::default();
        d.push(&frame(2, "{}"));
        d.push(b"x");
        assert_eq!(d.next_frame().unwrap(), Some(Frame::End(Ok(()))));
        assert!(d.next_frame().unwrap_err().contains("after the end"));
    }
}
