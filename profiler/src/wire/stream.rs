//! The socket stream: newline-delimited JSON [`Record`]s. The sidecar sends `sidecar_hello` (with
//! the format version), `state` (the timeline so far), then each new record, `dropped` notices for
//! a client that fell behind, and `ended`. [`StreamReader`] is the client side: it checks the
//! version and turns anything that is not a record into a clear error.

use super::{Record, WireError, MAJOR};
use std::io::BufRead;

/// Reads records from a stream, checking the greeting first.
pub struct StreamReader<R> {
    input: R,
    line: String,
    lines_read: u64,
    greeted: bool,
}

impl<R: BufRead> StreamReader<R> {
    /// Wraps a buffered reader (a connected socket).
    pub fn new(input: R) -> Self {
        StreamReader {
            input,
            line: String::new(),
            lines_read: 0,
            greeted: false,
        }
    }

    /// The next record; `Ok(None)` at the end of the stream.
    pub fn next_record(&mut self) -> Result<Option<Record>, WireError> {
        self.line.clear();
        let n = self.input.read_line(&mut self.line)?;
        if n == 0 {
            return Ok(None);
        }
        self.lines_read += 1;
        let record: Record = serde_json::from_str(self.line.trim_end()).map_err(|e| {
            let shown: String = self.line.trim_end().chars().take(60).collect();
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
}
