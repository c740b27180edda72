//! Printed sizes back to bytes, exactly: `round(printed number × binary unit)` in integer
//! arithmetic, as the OOM corpus defines (PyTorch, TensorFlow, XLA and MPS all print binary units,
//! MPS with `KB/MB/GB` labels, the kernel with `kB`).

/// Bytes per unit label; every label is binary (1 KB = 1 KiB = 1024 bytes), as these tools print.
fn unit_bytes(unit: &str) -> Option<u128> {
    Some(match unit {
        "bytes" | "byte" | "B" | "" => 1,
        // R prints `Kb`, `Mb` and `Gb` for sizes divided by 1024 (`cannot allocate vector of size
        // 4.5 Gb`).
        "KiB" | "KB" | "kB" | "K" | "k" | "Kb" => 1 << 10,
        "MiB" | "MB" | "M" | "Mi" | "Mb" => 1 << 20,
        "GiB" | "GB" | "G" | "Gi" | "Gb" => 1 << 30,
        "TiB" | "TB" | "T" | "Tb" => 1 << 40,
        "PiB" | "PB" | "P" => 1 << 50,
        _ => return None,
    })
}

/// `number` (digits with an optional fraction) × `unit`, rounded half up; `None` when either part
/// is malformed or the result passes `u128`.
pub fn exact_bytes(number: &str, unit: &str) -> Option<u128> {
    let unit = unit_bytes(unit)?;
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) || frac.len() > 18 {
        return None;
    }
    let scale = 10u128.pow(frac.len() as u32);
    let digits: u128 = format!("{int}{frac}").parse().ok()?;
    let scaled = digits.checked_mul(unit)?;
    Some((scaled + scale / 2) / scale)
}

#[cfg(test)]
mod tests {
    use super::exact_bytes;

    #[test]
    fn corpus_rounding_rules() {
        assert_eq!(exact_bytes("20.00", "MiB"), Some(20971520));
        assert_eq!(exact_bytes("1.95", "GiB"), Some(2093796557));
        assert_eq!(exact_bytes("41.56", "MiB"), Some(43578819));
        assert_eq!(exact_bytes("1024.00", "KiB"), Some(1 << 20));
        assert_eq!(exact_bytes("0", "bytes"), Some(0));
        assert_eq!(exact_bytes("5.56", "GB"), Some(5970004541));
        assert_eq!(exact_bytes("168424", "kB"), Some(172466176));
        assert_eq!(exact_bytes("17179869184.00", "GiB"), Some(1u128 << 64));
        assert_eq!(exact_bytes("48.5", "KiB"), Some(49664));
        assert_eq!(exact_bytes("4.5", "Gb"), Some(4831838208));
        assert_eq!(exact_bytes("20.3", "Mb"), Some(21286093));
    }

    #[test]
    fn malformed_is_none() {
        assert_eq!(exact_bytes("", "MiB"), None);
        assert_eq!(exact_bytes("1.2.3", "MiB"), None);
        assert_eq!(exact_bytes("12", "parsecs"), None);
        assert_eq!(exact_bytes("9".repeat(60).as_str(), "PiB"), None);
    }
}
