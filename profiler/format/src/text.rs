//! Text that came from a job or a file (phase names, command lines, paths, log lines) made safe to
//! print on a terminal: control characters — escape sequences that could move the cursor, rewrite
//! the screen or set the window title — and bidirectional overrides are replaced by a visible
//! `\x1b` / `\u{202e}`. Every text output of memsight passes through here; the viewer's screens
//! need not (ratatui draws no control characters).

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as it is (with `keep_layout`, newlines and tabs may).
fn unsafe_char(c: char, keep_layout: bool) -> bool {
    if keep_layout && (c == '\n' || c == '\t') {
        return false;
    }
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

fn escape(s: &str, keep_layout: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| unsafe_char(c, keep_layout)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !unsafe_char(c, keep_layout) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

/// One line of output: every control character escaped, newlines and tabs included (a phase name
/// cannot start a line of its own).
pub fn line(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// A block of output (a markdown document, a list of findings): newlines and tabs kept, every other
/// control character escaped.
pub fn block(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert_eq!(line("fwd"), "fwd");
        assert_eq!(line("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(line("x\ny\r"), "x\\x0ay\\x0d");
        assert_eq!(block("x\ny\tz\x07"), "x\ny\tz\\x07");
        assert_eq!(line("\u{9b}31m \u{202e}cba"), "\\u{9b}31m \\u{202e}cba");
        assert_eq!(line("ünïcode ✓"), "ünïcode ✓");
    }
}
