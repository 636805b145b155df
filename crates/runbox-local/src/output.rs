//! Output handling: the capped capture and UTF-8 decoding every backend shares (from
//! `runbox_core::capture`), and the end-of-run marker scanner.
//!
//! A single process can write gigabytes a second to a pipe, so nothing here grows with the
//! amount of output: a capture holds at most its cap, a decoder at most three bytes, a
//! scanner at most one marker's length.

pub(crate) use runbox_core::capture::Capture;

/// Finds a marker in a byte stream arriving in chunks, passing through everything before
/// it. Bytes that might be the start of the marker are held back until the next chunk
/// decides.
#[derive(Debug)]
pub(crate) struct MarkerScanner {
    marker: Vec<u8>,
    held: Vec<u8>,
    found: bool,
}

impl MarkerScanner {
    pub(crate) fn new(marker: &[u8]) -> Self {
        Self {
            marker: marker.to_vec(),
            held: Vec::new(),
            found: false,
        }
    }

    pub(crate) fn found(&self) -> bool {
        self.found
    }

    /// Feeds a chunk; returns the bytes that precede the marker. After the marker is found,
    /// everything else is discarded (it belongs to no run).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.found {
            return Vec::new();
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        if let Some(i) = find(&buf, &self.marker) {
            self.found = true;
            buf.truncate(i);
            return buf;
        }
        // Hold back the longest suffix that is a prefix of the marker.
        let max = self.marker.len().saturating_sub(1).min(buf.len());
        let keep = (1..=max)
            .rev()
            .find(|&k| buf[buf.len() - k..] == self.marker[..k])
            .unwrap_or(0);
        self.held = buf.split_off(buf.len() - keep);
        buf
    }

    /// Bytes held back when the stream ends without a marker.
    pub(crate) fn flush(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    memchr::memmem::find(haystack, needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_split_across_chunks_is_found() {
        let mut s = MarkerScanner::new(b"<END>");
        assert_eq!(s.feed(b"hello <E"), b"hello ");
        assert!(!s.found());
        assert_eq!(s.feed(b"N"), b"");
        assert_eq!(s.feed(b"D>late"), b"");
        assert!(s.found());
        assert_eq!(s.feed(b"more"), b"");
    }

    #[test]
    fn a_false_start_is_released() {
        let mut s = MarkerScanner::new(b"<END>");
        assert_eq!(s.feed(b"a <E"), b"a ");
        assert_eq!(s.feed(b"X"), b"<EX");
        assert_eq!(s.feed(b"<<END>"), b"<");
        assert!(s.found());
    }

    #[test]
    fn flush_returns_held_bytes() {
        let mut s = MarkerScanner::new(b"<END>");
        assert_eq!(s.feed(b"x<EN"), b"x");
        assert_eq!(s.flush(), b"<EN");
    }
}
