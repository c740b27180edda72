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

/// An SVG with no frames that says why (`message`): the file asked for when there is nothing to
/// draw, such as the growth between two profiles where no site grew.
pub fn empty_svg(title: &str, message: &str) -> Vec<u8> {
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"80\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\n\
         <text x=\"600\" y=\"56\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">{}</text>\n\
         </svg>\n",
        xml_text(title),
        xml_text(message)
    )
    .into_bytes()
}

/// `s` as XML character data.
fn xml_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
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

    #[test]
    fn an_empty_drawing_says_why() {
        let text =
            String::from_utf8(super::empty_svg("heap growth", "no site grew in a<b")).unwrap();
        assert!(text.starts_with("<?xml"));
        assert!(text.contains("no site grew in a&lt;b"), "{text}");
        assert!(text.trim_end().ends_with("</svg>"));
    }
}
