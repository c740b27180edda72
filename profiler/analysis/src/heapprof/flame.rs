//! Flamegraph SVGs (inferno) of folded stacks: frame width is live bytes.

/// Renders folded stacks (`root;…;leaf`, bytes) as an SVG flamegraph.
pub fn svg(title: &str, folded: &[(String, u64)]) -> Result<Vec<u8>, String> {
    if folded.is_empty() {
        return Err("no sampled allocations to draw".into());
    }
    let lines: Vec<String> = folded.iter().map(|(s, b)| format!("{s} {b}")).collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "bytes".to_string();
    opts.name_type = "Function:".to_string();
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out)
        .map_err(|e| format!("cannot draw the flamegraph: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_named_frames() {
        let svg = super::svg(
            "heap at peak",
            &[
                ("main;app::hold".into(), 200 << 20),
                ("main;app::small".into(), 1 << 20),
            ],
        )
        .unwrap();
        let text = String::from_utf8(svg).unwrap();
        assert!(text.contains("app::hold"));
        assert!(text.contains("heap at peak"));
        assert!(super::svg("x", &[]).is_err());
    }
}
