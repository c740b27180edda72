//! Why a report could not be read: small, exact, and worded for the person who passed the file.

use std::fmt;
use std::path::{Path, PathBuf};

/// A report that cannot be read or used.
#[derive(Debug)]
pub enum ReportError {
    /// The file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The JSON ends early: the file was cut off (e.g. the writer was killed).
    Truncated {
        /// The file, when known.
        path: Option<PathBuf>,
        /// Where the text ended.
        line: usize,
        /// Column where the text ended.
        column: usize,
    },
    /// Not JSON at all.
    Syntax {
        /// The file, when known.
        path: Option<PathBuf>,
        /// The parser's message.
        why: String,
    },
    /// JSON, but not a memsight report.
    NotAReport {
        /// The file, when known.
        path: Option<PathBuf>,
        /// What is missing.
        why: String,
    },
    /// A report of a schema version this build does not read.
    UnsupportedVersion {
        /// The file, when known.
        path: Option<PathBuf>,
        /// The version in the file.
        found: u64,
        /// The version this build reads.
        supported: u32,
    },
    /// A report of the right version whose fields do not match the schema.
    Invalid {
        /// The file, when known.
        path: Option<PathBuf>,
        /// The field error.
        why: String,
    },
}

impl ReportError {
    pub(crate) fn from_json(e: serde_json::Error) -> Self {
        if e.is_eof() {
            ReportError::Truncated {
                path: None,
                line: e.line(),
                column: e.column(),
            }
        } else {
            ReportError::Syntax {
                path: None,
                why: e.to_string(),
            }
        }
    }

    pub(crate) fn with_path(self, p: &Path) -> Self {
        let p = Some(p.to_path_buf());
        match self {
            ReportError::Truncated { line, column, .. } => ReportError::Truncated {
                path: p,
                line,
                column,
            },
            ReportError::Syntax { why, .. } => ReportError::Syntax { path: p, why },
            ReportError::NotAReport { why, .. } => ReportError::NotAReport { path: p, why },
            ReportError::UnsupportedVersion {
                found, supported, ..
            } => ReportError::UnsupportedVersion {
                path: p,
                found,
                supported,
            },
            ReportError::Invalid { why, .. } => ReportError::Invalid { path: p, why },
            io @ ReportError::Io { .. } => io,
        }
    }
}

fn name(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "report".into())
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            ReportError::Truncated { path, line, column } => write!(
                f,
                "{}: truncated report: the JSON ends early at line {line}, column {column} (was the writer killed?)",
                name(path)
            ),
            ReportError::Syntax { path, why } => write!(f, "{}: not a JSON report: {why}", name(path)),
            ReportError::NotAReport { path, why } => write!(f, "{}: not a memsight report: {why}", name(path)),
            ReportError::UnsupportedVersion { path, found, supported } => write!(
                f,
                "{}: report schema version {found} is not supported by this memsight (reads version {supported}); {}",
                name(path),
                if *found > u64::from(*supported) { "upgrade memsight" } else { "re-create the report with this memsight" }
            ),
            ReportError::Invalid { path, why } => write!(f, "{}: invalid report: {why}", name(path)),
        }
    }
}

impl std::error::Error for ReportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReportError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
