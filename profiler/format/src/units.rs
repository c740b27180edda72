//! Byte sizes for people: formatting (`1.50 GiB`) and parsing budgets (`512MiB`, `4GiB`, `100MB`).

use std::fmt;

/// Formats bytes with a binary unit and two decimals (`0 B`, `512 B`, `1.50 KiB`, `3.00 GiB`).
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// Formats a signed byte count with its sign (`+1.00 MiB`, `-512 B`).
pub fn fmt_signed_bytes(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(bytes.unsigned_abs()))
}

/// Why a size string was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// Parses a size: a number with an optional unit. Binary units `KiB MiB GiB TiB` (and `K M G T`)
/// are powers of 1024; decimal `KB MB GB TB` are powers of 1000; `B` or none means bytes.
/// Fractions are allowed (`1.5GiB`). Case-insensitive; spaces between number and unit are allowed.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let err = |why: &str| {
        SizeError(format!(
            "invalid size {text:?}: {why} (examples: 512MiB, 4GiB, 100MB, 1048576)"
        ))
    };
    if num.is_empty() {
        return Err(err("expected a number"));
    }
    let value: f64 = num.parse().map_err(|_| err("not a number"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(err("unknown unit")),
    };
    let bytes = (value * mult as f64).round();
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(bytes as u64)
}

/// The larger of two optional values; either alone when the other is missing.
pub fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(100 << 20), "100.00 MiB");
        assert_eq!(fmt_signed_bytes(-2048), "-2.00 KiB");
    }

    #[test]
    fn parses() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4 gib"), Ok(4 << 30));
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(
            parse_size("12 parsecs").unwrap_err().to_string(),
            "invalid size \"12 parsecs\": unknown unit (examples: 512MiB, 4GiB, 100MB, 1048576)"
        );
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("1.2.3MiB").is_err());
    }
}
