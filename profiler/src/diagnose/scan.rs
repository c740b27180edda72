//! Finds OOM messages: every family's matchers report *pieces* (a span, its kind and facts); pieces
//! that continue a message (a second NCCL line, XLA buffer statistics, a cgroup usage line) join
//! the message before them when their facts agree; pieces without OOM evidence on their own (an
//! ONNX node name) are kept only when they joined one that has it.

use super::facts::Facts;
use super::size::exact_bytes;
use super::{accel, host, torch, Finding, Kind};
use regex::{Captures, Regex};
use std::sync::LazyLock;

/// A lazily compiled matcher pattern (`None` only if malformed, which a unit test rules out).
pub(crate) type Pattern = LazyLock<Option<Regex>>;

/// Most lines between two pieces of one message.
const JOIN_LINES: usize = 64;

/// A matched part of a message.
pub(crate) struct Piece {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
    pub facts: Facts,
    /// Starts a message of its own (never joins the one before).
    pub opens: bool,
    /// Shows, on its own, that memory ran out.
    pub evidence: bool,
}

impl Piece {
    /// A piece that starts a message and is OOM evidence on its own.
    pub fn message(start: usize, end: usize, kind: Kind, facts: Facts) -> Self {
        Piece {
            start,
            end,
            kind,
            facts,
            opens: true,
            evidence: true,
        }
    }

    /// A piece that joins the message before it when the facts agree.
    pub fn part(start: usize, end: usize, kind: Kind, facts: Facts, evidence: bool) -> Self {
        Piece {
            start,
            end,
            kind,
            facts,
            opens: false,
            evidence,
        }
    }
}

/// Whitespace between words of a message: spaces, line breaks, or the `\n` escapes of a message
/// embedded in JSON.
const SP: &str = r"(?:\s|\\[nrt])+";
/// A printed size: number and unit (two capture groups).
const SIZE: &str = r"([0-9]+(?:\.[0-9]+)?)\s?(bytes|[KMGTP]iB|[KMGTP]B|kB|B|[KMGTP])";

/// Compiles a matcher pattern: each literal space matches any whitespace run (see [`SP`]) and
/// `{SIZE}` a printed size. `None` only for a malformed pattern, which a unit test rules out.
pub(crate) fn compile(pattern: &str) -> Option<Regex> {
    Regex::new(&pattern.replace(' ', SP).replace("{SIZE}", SIZE)).ok()
}

/// Runs `re` over `text`, handing each match's captures to `f`.
pub(crate) fn each(re: &Pattern, text: &str, mut f: impl FnMut(&regex::Captures, usize, usize)) {
    if let Some(re) = re.as_ref() {
        for c in re.captures_iter(text) {
            if let Some(m) = c.get(0) {
                f(&c, m.start(), m.end());
            }
        }
    }
}

/// Bytes of the size captured at groups `i` (number) and `i + 1` (unit).
pub(crate) fn size_at(c: &Captures, i: usize) -> Option<i128> {
    let n = c.get(i)?.as_str();
    let u = c.get(i + 1)?.as_str();
    exact_bytes(n, u).and_then(|b| i128::try_from(b).ok())
}

/// Integer of capture group `i`.
pub(crate) fn int_at(c: &Captures, i: usize) -> Option<i128> {
    c.get(i)?.as_str().parse().ok()
}

/// Text of capture group `i`.
pub(crate) fn str_at<'t>(c: &Captures<'t>, i: usize) -> Option<&'t str> {
    c.get(i).map(|m| m.as_str())
}

/// End of the line holding byte `at`.
pub(crate) fn line_end(text: &str, at: usize) -> usize {
    text[at..].find('\n').map_or(text.len(), |i| at + i)
}

/// The process a piece is about: a kernel line names it as `pid` or, on old kernels, `selected_pid`.
fn process_of(f: &Facts) -> Option<u128> {
    f.bytes("pid").or_else(|| f.bytes("selected_pid"))
}

/// Two pieces about different processes are different messages.
fn same_process(a: &Facts, b: &Facts) -> bool {
    match (process_of(a), process_of(b)) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// Every message in `text`, in order.
pub(crate) fn scan(text: &str) -> Vec<Finding> {
    let mut pieces = Vec::new();
    torch::find(text, &mut pieces);
    host::find(text, &mut pieces);
    accel::find(text, &mut pieces);
    // Earliest first; at one start the longest (most specific) wins; overlaps are dropped.
    pieces.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut kept: Vec<Piece> = Vec::new();
    for p in pieces {
        if kept.last().is_none_or(|k| p.start >= k.end) {
            kept.push(p);
        }
    }

    struct Open {
        finding: Finding,
        end: usize,
        evidence: bool,
    }
    let mut open: Vec<Open> = Vec::new();
    for p in kept {
        if let Some(last) = open.last_mut() {
            let near = text[last.end..p.start].matches('\n').count() <= JOIN_LINES;
            if !p.opens
                && near
                && last.finding.kind == p.kind
                && last.finding.facts.agrees_with(&p.facts)
                && same_process(&last.finding.facts, &p.facts)
            {
                last.finding.facts.absorb(p.facts);
                last.end = p.end;
                last.evidence |= p.evidence;
                continue;
            }
        }
        open.push(Open {
            finding: Finding {
                kind: p.kind,
                facts: p.facts,
                line: text[..p.start].matches('\n').count() + 1,
            },
            end: p.end,
            evidence: p.evidence,
        });
    }
    open.into_iter()
        .filter(|o| o.evidence && !o.finding.facts.is_empty())
        .map(|o| o.finding)
        .collect()
}
