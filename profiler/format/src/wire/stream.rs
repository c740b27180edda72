//! The socket stream: newline-delimited JSON [`Record`]s. The sidecar sends `sidecar_hello` (with
//! the format version), `state` (the timeline so far), then each new record, `dropped` notices for
//! a client that fell behind, and `ended`. [`StreamReader`] is the client side: it checks the
//! version and turns anything that is not a record into a clear error.

use super::{Record, WireError, MAJOR};
use std::io::{BufRead, Read};

/// Longest line accepted (the `state` line carries the whole bounded timeline: a few MiB).
pub const MAX_LINE: usize = 64 << 20;

/// Reads records from a stream, checking the greeting first.
pub struct StreamReader<R> {
    input: R,
    line: Vec<u8>,
    lines_read: u64,
    greeted: bool,
    max_line: usize,
}

/// Just the version of a greeting, read when the rest of it does not parse (a newer major may
/// change anything else).
#[derive(serde::Deserialize)]
struct Greeting {
    #[serde(rename = "type")]
    kind: String,
    major: u16,
}

impl<R: BufRead> StreamReader<R> {
    /// Wraps a buffered reader (a connected socket).
    pub fn new(input: R) -> Self {
        Self::with_max_line(input, MAX_LINE)
    }

    /// Like [`StreamReader::new`], refusing lines longer than `max_line` bytes.
    pub fn with_max_line(input: R, max_line: usize) -> Self {
        StreamReader {
            input,
            line: Vec::new(),
            lines_read: 0,
            greeted: false,
            max_line,
        }
    }

    /// The next record; `Ok(None)` at the end of the stream. A line longer than the limit is an
    /// error, read no further than the limit.
    pub fn next_record(&mut self) -> Result<Option<Record>, WireError> {
        self.line.clear();
        let limit = self.max_line as u64 + 1;
        let n = (&mut self.input)
            .take(limit)
            .read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Ok(None);
        }
        self.lines_read += 1;
        if self.line.len() > self.max_line {
            return Err(WireError::NotAStream(format!(
                "line {} is longer than {} bytes",
                self.lines_read, self.max_line
            )));
        }
        let text = self.line.trim_ascii_end();
        let record: Record = serde_json::from_slice(text).map_err(|e| {
            if !self.greeted {
                if let Ok(g) = serde_json::from_slice::<Greeting>(text) {
                    if g.kind == "sidecar_hello" && g.major != MAJOR {
                        return WireError::Version { found: g.major };
                    }
                }
            }
            let shown: String = String::from_utf8_lossy(text).chars().take(60).collect();
            WireError::NotAStream(format!(
                "line {} is not a memsight record ({e}): {shown:?}",
                self.lines_read
            ))
        })?;
        if !self.greeted {
            match &record {
                Record::SidecarHello { major, .. } if *major != MAJOR => {
                    return Err(WireError::Version { found: *major })
                }
                Record::SidecarHello { .. } => self.greeted = true,
                _ => {
                    return Err(WireError::NotAStream(
                        "the stream does not start with a sidecar_hello".into(),
                    ))
                }
            }
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_and_garbage_are_clear_errors() {
        let newer =
            b"{\"type\":\"sidecar_hello\",\"major\":2,\"minor\":0,\"job_pid\":1,\"command\":[]}\n";
        let e = StreamReader::new(&newer[..])
            .next_record()
            .unwrap_err()
            .to_string();
        assert!(e.contains("newer than this memsight reads"), "{e}");
        let e = StreamReader::new(&b"HTTP/1.1 200 OK\r\n"[..])
            .next_record()
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1 is not a memsight record"), "{e}");
        let first = b"{\"type\":\"dropped\",\"count\":1}\n";
        let e = StreamReader::new(&first[..])
            .next_record()
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not start with a sidecar_hello"), "{e}");
        let ok = b"{\"type\":\"sidecar_hello\",\"major\":1,\"minor\":7,\"job_pid\":1,\"command\":[]}\n{\"type\":\"brand_new\"}\n";
        let mut r = StreamReader::new(&ok[..]);
        assert!(matches!(
            r.next_record().unwrap(),
            Some(Record::SidecarHello { .. })
        ));
        assert_eq!(r.next_record().unwrap(), Some(Record::Unknown));
        assert_eq!(r.next_record().unwrap(), None);
    }

    /// A newer major's greeting whose other fields changed still says "upgrade memsight".
    #[test]
    fn a_newer_greeting_with_other_fields_is_a_version_error() {
        let newer = b"{\"type\":\"sidecar_hello\",\"major\":3,\"job\":{\"pid\":1}}\n";
        let e = StreamReader::new(&newer[..]).next_record().unwrap_err();
        assert!(e.to_string().ends_with("upgrade memsight"), "{e}");
    }

    /// A line without a newline is read up to the limit and refused, never buffered whole.
    #[test]
    fn an_endless_line_is_refused_at_the_limit() {
        let endless = std::io::repeat(b'x');
        let mut r = StreamReader::with_max_line(std::io::BufReader::new(endless), 1 << 20);
        let e = r.next_record().unwrap_err().to_string();
        assert!(e.contains("line 1 is longer than 1048576 bytes"), "{e}");
        assert!(r.line.capacity() <= 4 << 20, "{}", r.line.capacity());
    }
}
