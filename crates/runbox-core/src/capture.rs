//! Capturing a run's output: a capped capture that keeps head and tail, incremental UTF-8
//! decoding for live streaming, and a cap on the rich results one run may return. Every backend captures output the same way, so a
//! caller sees the same cap and the same truncation note whatever runs the code.
//!
//! A single process can write gigabytes a second, so nothing here grows with the amount of
//! output: a capture holds at most its cap, a decoder at most three bytes.

use std::collections::VecDeque;

use crate::exec::RichResult;

/// Most rich results one run returns.
pub const MAX_RESULTS: usize = 1000;
/// Most bytes of rich results (all representations together) one run returns.
pub const MAX_RESULT_BYTES: usize = 32 << 20;
/// Most bytes of structured representations (JSON that is not a string, such as
/// `application/json`) one run returns, as sent: parsed, JSON takes many times its size in
/// memory, so it is held to a much smaller budget than text and images.
pub const MAX_STRUCTURED_BYTES: usize = 1 << 20;

/// The rich results of one run, up to [`MAX_RESULTS`] displays and [`MAX_RESULT_BYTES`]:
/// code that displays in an endless loop must not fill the server's memory. Results past
/// the cap are counted, not kept; the value of the last expression is kept whenever its
/// bytes fit. A backend that parses results measures them first ([`Results::room`],
/// [`Results::take_structured`]), so one that cannot be kept is never parsed.
#[derive(Debug, Default)]
pub struct Results {
    kept: Vec<RichResult>,
    bytes: usize,
    dropped: usize,
    largest_dropped: usize,
    structured: usize,
    /// Structured representations left out: how many, the largest, their MIME types.
    structured_dropped: (usize, usize, Vec<String>),
}

/// Counts the bytes written to it.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of a representation: a string's bytes, or the length of other JSON as text
/// (counted as it is written out, never built).
pub fn value_size(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::String(s) => s.len(),
        other => {
            let mut count = Count(0);
            // Writing to a counter does not fail.
            let _ = serde_json::to_writer(&mut count, other);
            count.0
        }
    }
}

impl Results {
    /// No results yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes a result may still take.
    pub fn room(&self) -> usize {
        MAX_RESULT_BYTES.saturating_sub(self.bytes)
    }

    /// Counts `size` bytes of a structured representation of type `mime` about to be
    /// parsed; `false` (and a note for the caller) when they do not fit what is left of
    /// [`MAX_STRUCTURED_BYTES`], and the representation must be left out unparsed.
    pub fn take_structured(&mut self, mime: &str, size: usize) -> bool {
        if self.structured + size <= MAX_STRUCTURED_BYTES {
            self.structured += size;
            return true;
        }
        let (count, largest, mimes) = &mut self.structured_dropped;
        *count += 1;
        *largest = (*largest).max(size);
        if mimes.len() < 4 && !mimes.iter().any(|m| m == mime) {
            mimes.push(mime.to_owned());
        }
        false
    }

    /// Counts a result of `size` bytes that was left out without being read or parsed.
    pub fn drop_unread(&mut self, size: usize) {
        self.dropped += 1;
        self.largest_dropped = self.largest_dropped.max(size);
    }

    /// Adds `r` if it fits.
    pub fn push(&mut self, r: RichResult) {
        let size: usize = r.data.iter().map(|(k, v)| k.len() + value_size(v)).sum();
        self.push_sized(r, size);
    }

    /// Adds `r`, whose MIME types and representations take `size` bytes, if it fits.
    pub fn push_sized(&mut self, r: RichResult, size: usize) {
        // The value of the last expression comes last and is what a run is for: the count
        // does not stop it, only the bytes.
        let counted_out = !r.is_main_result && self.kept.len() >= MAX_RESULTS;
        if counted_out || size > self.room() {
            self.drop_unread(size);
            return;
        }
        self.bytes += size;
        self.kept.push(r);
    }

    /// The results kept, and a note for the caller when some were left out.
    pub fn finish(self) -> (Vec<RichResult>, Option<String>) {
        let mut notes = Vec::new();
        if self.dropped > 0 {
            notes.push(format!(
                "{} rich {} (display() calls or images; the largest {}) left out: one run \
                 returns at most {MAX_RESULTS} of them and {} MiB in all.",
                self.dropped,
                if self.dropped == 1 {
                    "result was"
                } else {
                    "results were"
                },
                mib(self.largest_dropped),
                MAX_RESULT_BYTES >> 20
            ));
        }
        let (count, largest, mimes) = &self.structured_dropped;
        if *count > 0 {
            notes.push(format!(
                "{count} structured {} ({}; the largest {}) left out, their other \
                 representations kept: one run returns at most {} MiB of JSON that is not text.",
                if *count == 1 {
                    "representation was"
                } else {
                    "representations were"
                },
                mimes.join(", "),
                mib(*largest),
                MAX_STRUCTURED_BYTES >> 20
            ));
        }
        let note = (!notes.is_empty()).then(|| notes.join(" "));
        (self.kept, note)
    }
}

/// `bytes` in MiB, for notes.
fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Captures one stream of a run: everything up to `limit` bytes; beyond that the first and
/// last halves, with the number of bytes dropped between them.
#[derive(Debug)]
pub struct Capture {
    limit: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    streamed: usize,
    decoder: Utf8Stream,
}

impl Capture {
    /// A capture keeping at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            streamed: 0,
            decoder: Utf8Stream::default(),
        }
    }

    fn head_cap(&self) -> usize {
        self.limit / 2
    }

    /// Records `bytes`; returns the text to stream live, if any. Live text stops once
    /// `limit` bytes have been streamed (the tail arrives with the outcome).
    pub fn push(&mut self, mut bytes: &[u8]) -> Option<String> {
        self.total += bytes.len() as u64;
        let live = {
            let room = self.limit.saturating_sub(self.streamed);
            let take = room.min(bytes.len());
            self.streamed += take;
            let text = self.decoder.decode(&bytes[..take]);
            (!text.is_empty()).then_some(text)
        };
        let head_room = self.head_cap().saturating_sub(self.head.len());
        let to_head = head_room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..to_head]);
        bytes = &bytes[to_head..];
        let tail_cap = self.limit - self.head_cap();
        if bytes.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - tail_cap..]);
        } else {
            let overflow = (self.tail.len() + bytes.len()).saturating_sub(tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(bytes);
        }
        live
    }

    /// Live text held back because it ended inside a character; call when the stream ends.
    pub fn flush_live(&mut self) -> Option<String> {
        let text = self.decoder.finish();
        (!text.is_empty()).then_some(text)
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.limit as u64
    }

    /// The captured text (invalid UTF-8 replaced) and whether it was truncated.
    pub fn finish(self) -> (String, bool) {
        let truncated = self.truncated();
        let tail: Vec<u8> = self.tail.into_iter().collect();
        if !truncated {
            let mut all = self.head;
            all.extend_from_slice(&tail);
            return (String::from_utf8_lossy(&all).into_owned(), false);
        }
        let dropped = self.total - self.limit as u64;
        let head = trim_incomplete_end(&self.head);
        let tail = skip_continuation_start(&tail);
        let text = format!(
            "{}\n[... {dropped} bytes of output truncated ...]\n{}",
            String::from_utf8_lossy(head),
            String::from_utf8_lossy(tail)
        );
        (text, true)
    }
}

/// The longest prefix of `b` that does not end inside a UTF-8 sequence.
fn trim_incomplete_end(b: &[u8]) -> &[u8] {
    let start = b.len().saturating_sub(3);
    for i in (start..b.len()).rev() {
        let byte = b[i];
        if byte & 0xC0 != 0x80 {
            // A lead (or ASCII) byte: complete if the sequence fits.
            let need = utf8_len(byte);
            return if i + need <= b.len() { b } else { &b[..i] };
        }
    }
    b
}

/// `b` without continuation bytes at its start (the cut fell inside a character).
fn skip_continuation_start(b: &[u8]) -> &[u8] {
    let skip = b.iter().take(3).take_while(|&&x| x & 0xC0 == 0x80).count();
    &b[skip..]
}

fn utf8_len(lead: u8) -> usize {
    match lead {
        0x00..=0x7F => 1,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

/// Decodes UTF-8 arriving in arbitrary chunks: a character split across chunks is held
/// until it completes; invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// The text of `bytes`, less an incomplete character at the end (held for the next).
    pub fn decode(&mut self, bytes: &[u8]) -> String {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(bytes);
        let keep = match std::str::from_utf8(&buf) {
            Ok(_) => 0,
            Err(e) if e.error_len().is_none() => buf.len() - e.valid_up_to(),
            Err(_) => {
                // Invalid somewhere; still hold back an incomplete sequence at the very end.
                buf.len() - trim_incomplete_end(&buf).len()
            }
        };
        self.pending = buf.split_off(buf.len() - keep);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Whatever is still held, flushed as replacement characters.
    pub fn finish(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_stop_at_the_count_and_the_bytes() {
        let small = || RichResult {
            data: [("text/plain".to_owned(), serde_json::json!("x"))].into(),
            is_main_result: false,
        };
        let mut r = Results::new();
        for _ in 0..MAX_RESULTS + 5 {
            r.push(small());
        }
        r.push(RichResult {
            is_main_result: true,
            ..small()
        });
        let (kept, note) = r.finish();
        assert_eq!(
            kept.len(),
            MAX_RESULTS + 1,
            "the last expression's value is kept"
        );
        assert!(kept[MAX_RESULTS].is_main_result);
        let note = note.unwrap();
        assert!(note.starts_with("5 rich results were"), "{note}");
        let big = RichResult {
            data: [(
                "image/png".to_owned(),
                serde_json::json!("A".repeat(MAX_RESULT_BYTES / 2)),
            )]
            .into(),
            is_main_result: false,
        };
        let mut r = Results::new();
        r.push(big.clone());
        r.push(big.clone());
        r.push(small());
        let (kept, note) = r.finish();
        assert_eq!(
            kept.len(),
            2,
            "the second image does not fit, the small text does"
        );
        let note = note.unwrap();
        assert!(
            note.starts_with("1 rich result was (display() calls or images; the largest 16.0 MiB)"),
            "{note}"
        );
        assert_eq!(Results::new().finish(), (Vec::new(), None));
        // Structured JSON has a budget of its own, checked before it is parsed.
        let mut r = Results::new();
        assert!(r.take_structured("application/json", MAX_STRUCTURED_BYTES / 2));
        assert!(!r.take_structured("application/json", MAX_STRUCTURED_BYTES));
        assert!(r.take_structured("application/json", MAX_STRUCTURED_BYTES / 2));
        assert_eq!(r.room(), MAX_RESULT_BYTES);
        let note = r.finish().1.unwrap();
        assert!(
            note.starts_with(
                "1 structured representation was (application/json; the largest 1.0 MiB)"
            ),
            "{note}"
        );
        // Sizes are measured without building the text.
        let json = serde_json::json!({"a": [1, 2, "x"]});
        assert_eq!(value_size(&json), json.to_string().len());
        assert_eq!(value_size(&serde_json::json!("héllo")), 6);
    }

    #[test]
    fn small_output_is_kept_whole() {
        let mut c = Capture::new(100);
        assert_eq!(c.push(b"hello ").as_deref(), Some("hello "));
        assert_eq!(c.push(b"world").as_deref(), Some("world"));
        assert_eq!(c.finish(), ("hello world".to_owned(), false));
    }

    #[test]
    fn exactly_the_limit_is_not_truncated() {
        let mut c = Capture::new(10);
        c.push(b"0123456789");
        assert_eq!(c.finish(), ("0123456789".to_owned(), false));
    }

    #[test]
    fn large_output_keeps_head_and_tail() {
        let mut c = Capture::new(10);
        for chunk in [&b"abc"[..], b"defgh", b"ijklmnopqrst", b"uvwxyz"] {
            c.push(chunk);
        }
        let (text, truncated) = c.finish();
        assert!(truncated);
        assert!(text.starts_with("abcde\n"), "{text}");
        assert!(text.ends_with("\nvwxyz"), "{text}");
        assert!(text.contains("16 bytes of output truncated"), "{text}");
    }

    #[test]
    fn a_flood_stays_bounded() {
        let mut c = Capture::new(1000);
        let chunk = vec![b'x'; 65536];
        for _ in 0..200 {
            c.push(&chunk);
        }
        assert!(c.head.len() + c.tail.len() <= 1000);
        let (text, truncated) = c.finish();
        assert!(truncated);
        assert!(text.len() < 1100);
        assert!(text.contains(&format!("{} bytes", 200 * 65536 - 1000)));
    }

    #[test]
    fn live_output_stops_at_the_limit() {
        let mut c = Capture::new(8);
        assert_eq!(c.push(b"12345").as_deref(), Some("12345"));
        assert_eq!(c.push(b"6789").as_deref(), Some("678"));
        assert_eq!(c.push(b"more"), None);
    }

    #[test]
    fn truncation_never_splits_a_character() {
        let mut c = Capture::new(8);
        // "é" is two bytes; the head cut (4 bytes) falls inside the third one.
        c.push("aéé€€€€€zz".as_bytes());
        let (text, truncated) = c.finish();
        assert!(truncated);
        assert!(!text.contains('\u{FFFD}'), "{text:?}");
        assert!(text.starts_with("aé\n"), "{text:?}");
    }

    #[test]
    fn split_characters_are_joined_and_invalid_bytes_replaced() {
        let mut d = Utf8Stream::default();
        let euro = "€".as_bytes();
        assert_eq!(d.decode(&euro[..1]), "");
        assert_eq!(d.decode(&euro[1..]), "€");
        assert_eq!(d.decode(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(d.decode(b"\xff\xe2\x82"), "\u{FFFD}");
        assert_eq!(d.decode(b"\xac!"), "€!");
        assert_eq!(d.decode(b"\xe2"), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
