//! Undoes the damage logs do to messages before they are matched: blockquote markers, markdown
//! emphasis, JSON-escaped quotes, full-width punctuation, trailing line-continuation backslashes
//! and terminal wrapping inside a word or number (also any word, where the log shows the
//! terminal's width).
//! The cleaned text keeps a map back to the original so findings report original line numbers.

/// A cleaned copy of a text with a map from its byte offsets back to the original's.
pub(crate) struct Clean {
    /// The cleaned text that matchers read.
    pub text: String,
    /// `(clean offset, original offset)` at each point where the two drift apart, ascending.
    marks: Vec<(usize, usize)>,
}

impl Clean {
    /// The original byte offset of cleaned offset `at`.
    pub fn original(&self, at: usize) -> usize {
        let i = self.marks.partition_point(|&(c, _)| c <= at);
        match i.checked_sub(1).and_then(|i| self.marks.get(i)) {
            Some(&(c, o)) => o + (at - c),
            None => at,
        }
    }
}

/// Shortest line (in bytes) that can have been wrapped by a terminal: a wrap happens at the
/// window's width, and windows are wider than this.
pub(crate) const MIN_WRAPPED: usize = 40;

/// Words of the messages memsight reads (lower case). A line break inside one of them is a
/// terminal wrap; a break between two other words may be a real line end (or a wrap at a space
/// whose trailing blank a copy removed), so it is kept.
const WORDS: &[&str] = &[
    "allocate",
    "allocated",
    "allocating",
    "allocation",
    "allocations",
    "allocator",
    "already",
    "and",
    "anon-rss",
    "at",
    "available",
    "avoid",
    "backend",
    "but",
    "by",
    "bytes",
    "cache",
    "cached",
    "calloc",
    "capacity",
    "capacty",
    "cgroup",
    "check",
    "child",
    "constraint",
    "cuda",
    "cuda_error_out_of_memory",
    "cudaerrormemoryallocation",
    "cudasuccess",
    "defaultcpuallocator",
    "device",
    "documentation",
    "driver",
    "drivererror",
    "enough",
    "error",
    "exceeds",
    "exhausted",
    "expandable_segments",
    "fail",
    "failcnt",
    "failed",
    "failure",
    "file-rss",
    "for",
    "fragmentation",
    "free",
    "freed_by_count",
    "from",
    "gib",
    "gpu",
    "graphs",
    "hardware",
    "has",
    "hip",
    "hip_error_outofmemory",
    "hiperroroutofmemory",
    "in",
    "inactive",
    "including",
    "is",
    "kib",
    "kill",
    "killed",
    "large",
    "limit",
    "malloc",
    "management",
    "memory",
    "mems_allowed",
    "mib",
    "nccl",
    "non-pytorch",
    "not",
    "of",
    "oom_score_adj",
    "out",
    "outofmemoryerror",
    "outofresources",
    "pgtables",
    "pools",
    "private",
    "process",
    "processes",
    "pytorch",
    "ran",
    "required",
    "reserved",
    "resource",
    "runtime",
    "sacrifice",
    "score",
    "search",
    "segments",
    "setting",
    "shape",
    "shared",
    "shmem-rss",
    "size",
    "tensor",
    "than",
    "the",
    "this",
    "to",
    "total",
    "total-vm",
    "tried",
    "trying",
    "type",
    "unallocated",
    "usage",
    "use",
    "warn",
    "warning",
    "when",
    "which",
    "with",
    "xpu",
    "you",
];

/// Size units a wrap may separate from their number.
const UNITS: &[&str] = &[
    "kB", "KB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB", "B", "bytes",
];

/// Shortest run of blanks inside a line that is a terminal's padding to its right edge (the copy
/// kept the padding where the line wrapped): it is judged like a line break (see [`is_wrap`]).
const PADDING: usize = 16;

/// The run of word characters at the end (`tail`) or start of `s`.
fn word_at(s: &str, tail: bool) -> &str {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if tail {
        let start = s.trim_end_matches(is_word).len();
        &s[start..]
    } else {
        let end = s.len() - s.trim_start_matches(is_word).len();
        &s[..end]
    }
}

/// Whether a newline between `prev_line` and `next_line` is a terminal wrap inside a number or a
/// message word (`16.9⏎4 GiB`, `fre⏎e`, `proce⏎ss`, `G⏎iB`) rather than a line break: the line
/// before is as long as a terminal, the next line does not start like a log line of its own (a
/// date or time), and either digits meet or the two halves make one of [`WORDS`].
fn is_wrap(prev_line: &str, next_line: &str) -> bool {
    let (Some(a), Some(b)) = (prev_line.chars().last(), next_line.chars().next()) else {
        return false;
    };
    if prev_line.len() < MIN_WRAPPED || starts_like_log_line(next_line) {
        return false;
    }
    if (a.is_ascii_digit() || a == '.') && (b.is_ascii_digit() || b == '.') {
        return true;
    }
    // A number and its unit (`53312244⏎kB`): the unit cannot start a line of its own.
    if a.is_ascii_digit() && UNITS.contains(&word_at(next_line, false)) {
        return true;
    }
    let (w1, w2) = (word_at(prev_line, true), word_at(next_line, false));
    if w1.is_empty() || w2.is_empty() || w1.len() + w2.len() > 40 {
        return false;
    }
    // Two whole words (`train.py⏎torch.…`, `Driver⏎Error`) are not one word broken in two.
    let word = |w: &str| {
        let w = w.to_ascii_lowercase();
        WORDS.contains(&w.as_str()) || w == "py" || w == "torch"
    };
    let joined = format!("{w1}{w2}").to_ascii_lowercase();
    WORDS.contains(&joined.as_str()) && !(word(w1) && word(w2))
}

/// Whether a token that ends at `end` of the cleaned `text` may go on after a line break the
/// cleaning kept (a wrap it could not prove): its line is as long as a terminal and the next line
/// starts right away with a non-blank that does not open a log record (`[`, a date or time) nor
/// a capitalised word after a token that ends in a lower-case letter or a digit (`… by allocator
/// GPU_0_bfc⏎Resource Error`, `…⏎Traceback (most recent call last):`): a cut token goes on in
/// its own case. Such a token may be cut; its fact is left out.
pub(crate) fn may_continue(text: &str, end: usize) -> bool {
    let rest = text.get(end..).unwrap_or("");
    let Some(next) = rest
        .strip_prefix('\n')
        .or_else(|| rest.strip_prefix("\r\n"))
    else {
        return false;
    };
    let start = text[..end].rfind('\n').map_or(0, |i| i + 1);
    end - start >= MIN_WRAPPED
        && next
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && c != '[')
        && !starts_like_log_line(next)
        && !(ends_lower_or_digit(&text[..end]) && starts_capitalised(next))
}

/// Whether `s` ends in a lower-case ASCII letter or a digit.
fn ends_lower_or_digit(s: &str) -> bool {
    s.chars()
        .last()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// Whether `line` starts with a capitalised word: an upper-case letter, then lower-case ones up
/// to a blank or the end of the line (`Resource Error`, `Traceback (most …`).
fn starts_capitalised(line: &str) -> bool {
    let mut chars = line.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_uppercase()) {
        return false;
    }
    let word: String = chars.take_while(|c| !c.is_whitespace()).collect();
    !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase())
}

/// A date, time or bracketed prefix at the start of a line: the start of a log record.
fn starts_like_log_line(line: &str) -> bool {
    let b = line.as_bytes();
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let sep = b.get(digits).copied();
    let dotted = || {
        // An uptime or time of day written with dots (`1.06.520.077 E …`): three dotted groups.
        line.split(|c: char| c.is_ascii_whitespace())
            .next()
            .is_some_and(|w| {
                w.split('.').count() >= 3
                    && w.split('.')
                        .all(|g| !g.is_empty() && g.bytes().all(|c| c.is_ascii_digit()))
            })
    };
    // A compact date, then a time of day (MySQL's `150126 22:31:29`).
    let compact_date_time = || {
        digits >= 6
            && sep == Some(b' ')
            && line[digits + 1..]
                .split(|c: char| c.is_ascii_whitespace())
                .next()
                .is_some_and(|w| {
                    let mut parts = w.split(':');
                    let hour = parts.next().unwrap_or("");
                    let minute = parts.next().unwrap_or("");
                    (1..=2).contains(&hour.len())
                        && minute.len() == 2
                        && hour
                            .bytes()
                            .chain(minute.bytes())
                            .all(|c| c.is_ascii_digit())
                })
    };
    digits > 0
        && (matches!(sep, Some(b'-' | b'/' | b':'))
            && b.get(digits + 1).is_some_and(u8::is_ascii_digit)
            || dotted()
            || compact_date_time())
}

/// Whether a break between `line` and `next` may cut a word in two: `line` ends in a letter or
/// digit and `next`, shorter, starts with the rest of a lower-case word and not like a log line of
/// its own (`… memory budget. Restarti⏎ng`, `… killed by unknown s⏎ignal`).
fn cuts_word(line: &str, next: &str) -> bool {
    let rest = next.split(|c: char| c.is_whitespace()).next().unwrap_or("");
    line.chars()
        .last()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && !rest.is_empty()
        && rest.chars().all(|c| c.is_ascii_lowercase())
        && next.len() < line.len()
        && !starts_like_log_line(next)
}

/// The width of the terminal that wrapped `lines`, when it shows: at least two lines of the same
/// length (at least [`MIN_WRAPPED`] characters) each cut inside a word (see [`cuts_word`]). A
/// break after a line of that width inside a word is a wrap, whatever the word.
fn terminal_width(lines: &[(usize, &str)]) -> Option<usize> {
    let mut seen: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for pair in lines.windows(2) {
        let (line, next) = (pair[0].1, pair[1].1);
        if line.len() < MIN_WRAPPED || !cuts_word(line, next) {
            continue;
        }
        *seen.entry(line.chars().count()).or_default() += 1;
    }
    seen.into_iter()
        .filter(|&(_, n)| n >= 2)
        .max_by_key(|&(w, n)| (n, w))
        .map(|(w, _)| w)
}

/// HTML entities a web page leaves in a pasted message, and their characters.
const ENTITIES: [(&str, &str); 6] = [
    ("&#39;", "'"),
    ("&quot;", "\""),
    ("&gt;", ">"),
    ("&lt;", "<"),
    ("&amp;", "&"),
    ("&nbsp;", " "),
];

/// Printable ASCII from `!` to `~`, in order: the forms full-width punctuation and letters stand for.
const ASCII: &str = "!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";

/// Whether `c` is a full-width form of an ASCII character (`；`, `（`, `：`, `Ｇ`) or the ideographic
/// space, which an input method types in place of the ASCII one in a retyped message.
fn is_full_width(c: char) -> bool {
    matches!(c, '\u{FF01}'..='\u{FF5E}' | '\u{3000}')
}

/// Markup at the start of `s`: its byte length and what replaces it — a terminal colour sequence
/// (`ESC [ … m`) or markdown bold marker (`**`) by nothing, an HTML entity by its character, a
/// full-width form by its ASCII character (`22.00MiB(GPU 0；5.81 GiB` as retyped in Chinese).
fn markup(s: &str) -> Option<(usize, &'static str)> {
    if let Some(c) = s.chars().next().filter(|&c| is_full_width(c)) {
        let ascii = match c {
            '\u{3000}' => " ",
            _ => {
                let i = c as usize - 0xFF01;
                ASCII.get(i..=i)?
            }
        };
        return Some((c.len_utf8(), ascii));
    }
    let b = s.as_bytes();
    if b.starts_with(b"**") {
        return Some((2, ""));
    }
    if b.starts_with(b"\x1b[") || b.starts_with(b"\x1b(") {
        let body = b[2..]
            .iter()
            .take_while(|c| c.is_ascii_digit() || **c == b';' || **c == b'?')
            .count();
        let end = 2 + body + usize::from(b.get(2 + body).is_some_and(u8::is_ascii_alphabetic));
        return Some((end, ""));
    }
    ENTITIES
        .iter()
        .find(|(e, _)| s.starts_with(e))
        .map(|(e, c)| (e.len(), *c))
}

/// Longest phrase (in bytes) that markdown italics (`_…_`) are looked for around.
const ITALIC: usize = 400;

/// Offsets of markdown italic markers in `s`: an underscore that opens a phrase (at the start or
/// after a blank or an opening bracket or quote, before a letter or digit) and the one that closes
/// it (after a non-blank, before a blank, punctuation or the end), with a blank between them and
/// no underscore in the words they touch — a phrase, not an identifier (`_lazy_init`, `__init__`,
/// `GPU_0_bfc` keep theirs).
fn italic_markers(s: &str) -> Vec<usize> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let opens = b[i] == b'_'
            && (i == 0 || matches!(b[i - 1], b' ' | b'\t' | b'(' | b'[' | b'"' | b'\''))
            && b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric);
        if !opens {
            i += 1;
            continue;
        }
        let limit = (i + ITALIC).min(b.len());
        let close = (i + 2..limit).find(|&j| {
            b[j] == b'_'
                && !b[j - 1].is_ascii_whitespace()
                && b[j - 1] != b'_'
                && b.get(j + 1).is_none_or(|c| {
                    c.is_ascii_whitespace()
                        || matches!(
                            c,
                            b'.' | b',' | b';' | b':' | b'!' | b'?' | b')' | b']' | b'"' | b'\''
                        )
                })
        });
        // Markers stand outside words: the first word after the opening one and the last word
        // before the closing one hold no underscore of their own.
        let plain = |w: &[u8]| !w.contains(&b'_');
        match close {
            Some(j)
                if b[i + 1..j].contains(&b' ')
                    && b[i + 1..j].split(|c| *c == b' ').next().is_some_and(plain)
                    && b[i + 1..j].rsplit(|c| *c == b' ').next().is_some_and(plain) =>
            {
                out.push(i);
                out.push(j);
                i = j + 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// Length of a blockquote marker (`> `, `>> `, `> > `) at the start of `line`, after indentation.
fn quote_len(line: &str) -> usize {
    let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
    let mut i = indent;
    let b = line.as_bytes();
    let mut quoted = false;
    while b.get(i) == Some(&b'>') {
        quoted = true;
        i += 1;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
    }
    if quoted {
        i
    } else {
        0
    }
}

/// Cleans `text` (see the module comment). Linear in its length.
pub(crate) fn clean(text: &str) -> Clean {
    let mut out = Clean {
        text: String::with_capacity(text.len()),
        marks: Vec::new(),
    };
    // Lines with their quote markers and continuation backslashes removed, keeping original offsets.
    let json = text.contains("\\\"");
    let mut lines: Vec<(usize, &str)> = Vec::new();
    let mut start = 0;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        let q = quote_len(body);
        let mut body = &body[q..];
        let t = body.trim_end_matches([' ', '\t']);
        if let Some(s) = t.strip_suffix('\\').filter(|s| !s.ends_with('\\')) {
            body = s;
        }
        lines.push((start + q, body));
        start += line.len();
    }
    let n = lines.len();
    let width = terminal_width(&lines);
    for (i, &(at, body)) in lines.iter().enumerate() {
        out.push_line(at, body, json);
        if i + 1 < n {
            let next = lines[i + 1].1;
            let cut = width.is_some_and(|w| body.chars().count() == w && cuts_word(body, next));
            if !is_wrap(body, next) && !cut {
                let nl = at + body.len();
                out.push_at(nl, "\n");
            }
        }
    }
    out
}

impl Clean {
    /// Appends the line `body`, which starts at original offset `at`, with a terminal's padding
    /// removed where it stands for a wrap inside a word or number (see [`PADDING`]).
    fn push_line(&mut self, at: usize, body: &str, json: bool) {
        let pad = " ".repeat(PADDING);
        let (mut from, mut search) = (0, 0);
        while let Some(i) = body[search..].find(pad.as_str()).map(|i| search + i) {
            let end = body.len() - body[i..].trim_start_matches(' ').len();
            if i > 0 && end < body.len() && is_wrap(&body[..i], &body[end..]) {
                self.push(at + from, &body[from..i], json);
                from = end;
            }
            search = end;
        }
        self.push(at + from, &body[from..], json);
    }

    /// Appends `s`, which starts at original offset `at`, without terminal colours, markdown bold
    /// markers and HTML entities (see [`markup`]), un-escaping `\"` when `json`.
    fn push(&mut self, at: usize, s: &str, json: bool) {
        let italics = if s.contains('_') {
            italic_markers(s)
        } else {
            Vec::new()
        };
        if italics.is_empty()
            && !s.contains("**")
            && !s.contains('\x1b')
            && !s.contains('&')
            && !s.chars().any(is_full_width)
        {
            return self.push_text(at, s, json);
        }
        let mut from = 0;
        let mut i = 0;
        while i < s.len() {
            if italics.contains(&i) {
                self.push_text(at + from, &s[from..i], json);
                i += 1;
                from = i;
                continue;
            }
            let Some((n, replacement)) = markup(&s[i..]) else {
                i += s[i..].chars().next().map_or(1, char::len_utf8);
                continue;
            };
            self.push_text(at + from, &s[from..i], json);
            if !replacement.is_empty() {
                self.push_at(at + i, replacement);
            }
            i += n;
            from = i;
        }
        self.push_text(at + from, &s[from..], json);
    }

    /// Appends `s`, which starts at original offset `at`, un-escaping `\"` when `json`.
    fn push_text(&mut self, at: usize, s: &str, json: bool) {
        if !json || !s.contains("\\\"") {
            self.push_at(at, s);
            return;
        }
        let mut from = 0;
        for (i, _) in s.match_indices("\\\"") {
            self.push_at(at + from, &s[from..i]);
            from = i + 1;
        }
        self.push_at(at + from, &s[from..]);
    }

    /// Appends `s`, which starts at original offset `at`.
    fn push_at(&mut self, at: usize, s: &str) {
        let here = self.text.len();
        if self.original(here) != at {
            self.marks.push((here, at));
        }
        self.text.push_str(s);
    }
}

#[cfg(test)]
mod tests {
    use super::clean;

    fn cleaned(s: &str) -> String {
        clean(s).text
    }

    #[test]
    fn rejoins_a_number_and_a_word_wrapped_by_the_terminal() {
        let s = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.9\n4 GiB. GPU 0 has a total capacity of 79.15 GiB of which 2.19 MiB is fre\ne. Including non-PyTorch memory, this proce\nss has 1.00 GiB memory in use. Of the allocated memory 0.50 G\niB is allocated";
        let c = cleaned(s);
        assert!(c.contains("allocate 16.94 GiB"), "{c}");
        assert!(c.contains("is free."), "{c}");
        assert!(c.contains("this process has 1.00 GiB"), "{c}");
        assert!(c.contains("memory 0.50 GiB is"), "{c}");
    }

    #[test]
    fn keeps_real_line_breaks() {
        // Short lines, a next line that starts with a timestamp, and two words that make no
        // message word (a wrap at a blank the copy removed) are not joined.
        let s = "step 10 loss 2.31\n2026-11-21 10:00:01 step 11\noom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/init.scope,task=python,pid=7899,uid=0\n12:00:01 next\nRuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 3.95 GiB\ntotal capacity; 3.2 GiB already allocated)";
        assert_eq!(cleaned(s), s);
    }

    #[test]
    fn strips_quote_markers_escapes_and_continuations() {
        let s = "> Killed process 1 (a)\n>> x \\\n{\"e\": \"DriverError(CUDA_ERROR_OUT_OF_MEMORY, \\\"out of memory\\\")\"}";
        assert_eq!(
            cleaned(s),
            "Killed process 1 (a)\nx \n{\"e\": \"DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\"}"
        );
    }

    #[test]
    fn a_token_cut_at_a_kept_break_may_continue() {
        use super::may_continue;
        let t = "OOM when allocating tensor on /job:localhost/replica:0/tas\nk:0/device:GPU:0";
        let cut = t.find('\n').unwrap();
        assert!(may_continue(t, cut));
        // A short line, or a next line that starts with a blank, ends its token.
        assert!(!may_continue("on GPU:0\nk", 8));
        assert!(!may_continue(&t.replace("\nk", "\n k"), cut));
        // A capitalised word after a lower-case or numeric end starts a new line of its own.
        let u = "OP_REQUIRES failed at conv_ops_3d.cc:399 : Resource exhausted: OOM by allocator GPU_0_bfc\nResource Error";
        assert!(!may_continue(u, u.find('\n').unwrap()));
        assert!(may_continue(
            &u.replace("Resource Error", "fc Resource"),
            u.find('\n').unwrap()
        ));
    }

    #[test]
    fn a_terminals_padding_inside_a_word_or_number_is_a_wrap() {
        let pad = " ".repeat(40);
        let s = format!("[2059991.491436] oom-kill:constraint=CONSTRAINT_NONE,cpuset=/,me{pad}ms_allowed=0\n[2059991.491542] Out of memory: Killed process 25315 (python3) total-vm:53312244{pad}kB, anon-rss:0kB");
        let c = cleaned(&s);
        assert!(c.contains("cpuset=/,mems_allowed=0"), "{c}");
        assert!(c.contains("total-vm:53312244kB,"), "{c}");
        // Padding between two whole words stays.
        let t = format!("{}{pad}Epoch 3", "x".repeat(50));
        assert_eq!(cleaned(&t), t);
    }

    #[test]
    fn drops_italic_markers_around_a_phrase_not_an_identifier() {
        assert_eq!(
            cleaned("_Allowed memory size of 536870912 bytes exhausted (tried to allocate 203427840 bytes)_"),
            "Allowed memory size of 536870912 bytes exhausted (tried to allocate 203427840 bytes)"
        );
        let code = "in _lazy_init torch._C._cuda_init() __init__ GPU_0_bfc _a_ b";
        assert_eq!(cleaned(code), code);
    }

    #[test]
    fn a_terminal_width_seen_twice_rejoins_cut_words() {
        let s = "distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarti\nng\ndistributed.nanny - WARNING - Worker process 8999 was killed by unknown s\nignal\ndistributed.nanny - WARNING - Restarting worker";
        let c = cleaned(s);
        assert!(c.contains("memory budget. Restarting\n"), "{c}");
        assert!(c.contains("killed by unknown signal\n"), "{c}");
        // A single cut at a width seen once stays a line break.
        let one = "distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarti\nng";
        assert_eq!(cleaned(one), one);
    }

    #[test]
    fn drops_bold_markers_colours_and_entities() {
        assert_eq!(
            cleaned("**RuntimeError: CUDA error: out of memory**"),
            "RuntimeError: CUDA error: out of memory"
        );
        assert_eq!(
            cleaned("\x1b[31mNCCL WARN Cuda failure &#39;out of memory&#39;\x1b[0m"),
            "NCCL WARN Cuda failure 'out of memory'"
        );
    }

    #[test]
    fn full_width_forms_become_ascii() {
        // A message retyped through a Chinese input method (yolo3-pytorch#81).
        let s = "报错：CUDA out of memory. Tried to allocate 22.00MiB(GPU 0；5.81 GiB total capacity；4.59GiB already allocated)";
        let c = clean(s);
        assert_eq!(
            c.text,
            "报错:CUDA out of memory. Tried to allocate 22.00MiB(GPU 0;5.81 GiB total capacity;4.59GiB already allocated)"
        );
        // Offsets after a replaced form still map back to the original.
        let at = c.text.find("5.81").unwrap();
        assert_eq!(&s[c.original(at)..c.original(at) + 4], "5.81");
        // Every full-width form has its ASCII character; the ideographic space is a blank.
        assert_eq!(cleaned("\u{FF01}\u{FF5E}\u{3000}\u{FF21}"), "!~ A");
    }

    #[test]
    fn maps_offsets_back_to_the_original() {
        let s = "> ab\n> cd";
        let c = clean(s);
        assert_eq!(c.text, "ab\ncd");
        assert_eq!(c.original(0), 2);
        assert_eq!(c.original(3), 7);
    }
}
