//! Finds OOM messages: every family's matchers report *pieces* (a span, its kind and facts); pieces
//! that continue a message (a second NCCL line, XLA buffer statistics, a cgroup usage line) join
//! the message before them when their facts agree; pieces without OOM evidence on their own (an
//! ONNX node name) are kept only when they joined one that has it.

use super::facts::Facts;
use super::size::exact_bytes;
use super::{accel, cuda, host, jobs, libraries, normalize, torch, vocab, Finding, Kind};
use regex::{Captures, Regex};
use std::sync::LazyLock;

/// A lazily compiled matcher pattern (`None` only if malformed, which a unit test rules out).
pub(crate) type Pattern = LazyLock<Option<Regex>>;

/// Most lines between two pieces of one message.
const JOIN_LINES: usize = 64;

/// Most lines between a report and the same report told again, shortened (one failure).
const REPEAT_LINES: usize = 16;

/// Whether `later` tells the report `first` again, shortened: every fact it states, `first`
/// states alike, and `first` states more.
fn told_again(first: &Facts, later: &Facts) -> bool {
    later.len() < first.len() && later.iter().all(|(n, v)| first.get(n) == Some(v))
}

/// Whether `later` is an allocator's retry of `first` with a smaller request (TensorFlow's stream
/// executor asks again for 90% of the size, line after line): the same facts but a smaller
/// `requested_bytes`. The failure is the first, largest, request.
fn retried_smaller(first: &Facts, later: &Facts) -> bool {
    matches!(
        (first.bytes("requested_bytes"), later.bytes("requested_bytes")),
        (Some(a), Some(b)) if b < a
    ) && first.len() == later.len()
        && later
            .iter()
            .all(|(n, v)| n == "requested_bytes" || first.get(n) == Some(v))
}

/// Facts that name one process of a job rather than its failure: which process, thread and device.
const PER_PROCESS: [&str; 4] = ["pid", "tid", "cuda_device", "device_index"];

/// Whether `later` is `first` told by another process of the same job on the same host (each rank
/// of a distributed job logging NCCL's `host:pid:tid [dev] … Cuda failure 2 'out of memory'` at
/// once): the host is named and every fact but the process's own agrees.
fn other_rank(first: &Facts, later: &Facts) -> bool {
    first.str("host").is_some()
        && first.len() == later.len()
        && later
            .iter()
            .all(|(n, v)| PER_PROCESS.contains(&n) || first.get(n) == Some(v))
}

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
    /// What the text says about the message beyond its facts.
    pub notes: Notes,
    /// Where a kernel OOM report's line comes in it ([`KERNEL_CLOSES`] ends the report); 0 for
    /// other messages.
    pub stage: u8,
}

/// The stage of a kernel report's `Killed process` line, its last: nothing joins it afterwards.
pub(crate) const KERNEL_CLOSES: u8 = 4;

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
            notes: Notes::default(),
            stage: 0,
        }
    }

    /// This piece with its place in a kernel report.
    pub fn stage(mut self, stage: u8) -> Self {
        self.stage = stage;
        self
    }

    /// The start of a message that only the pieces joining it give facts and evidence to (the
    /// first line of a kernel OOM report).
    pub fn boundary(start: usize, end: usize, kind: Kind) -> Self {
        Piece {
            start,
            end,
            kind,
            facts: Facts::default(),
            opens: true,
            evidence: false,
            notes: Notes::default(),
            stage: 0,
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
            notes: Notes::default(),
            stage: 0,
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

/// Whether `text` holds `needle` in any letter case (a message retyped in lower case, a title's
/// capitals): a gate before a reader's patterns, cheaper than a regex over the whole text.
pub(crate) fn contains_any_case(text: &str, needle: &str) -> bool {
    let n = needle.as_bytes();
    let Some(&first) = n.first() else {
        return true;
    };
    let (lo, up) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
    let t = text.as_bytes();
    t.iter().enumerate().any(|(i, &b)| {
        (b == lo || b == up)
            && t.get(i..i + n.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(n))
    })
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

/// Text of capture group `i` with each run of blanks (a line break the match crossed) as one space.
pub(crate) fn words_at(c: &Captures, i: usize) -> Option<String> {
    c.get(i)
        .map(|m| m.as_str().split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Capture group `i` unless it ends where a kept line break may cut it (see
/// [`normalize::may_continue`]): a token that may be only its first part is no fact.
pub(crate) fn whole_at<'t>(c: &Captures<'t>, i: usize, text: &str) -> Option<&'t str> {
    c.get(i)
        .filter(|m| !normalize::may_continue(text, m.end()))
        .map(|m| m.as_str())
}

/// Text of capture group `i`.
pub(crate) fn str_at<'t>(c: &Captures<'t>, i: usize) -> Option<&'t str> {
    c.get(i).map(|m| m.as_str())
}

/// End of the line holding byte `at`.
pub(crate) fn line_end(text: &str, at: usize) -> usize {
    text[at..].find('\n').map_or(text.len(), |i| at + i)
}

/// Phrases with which a runtime says an out-of-memory event is not a failure: TensorFlow's BFC
/// allocator retries, Inductor's autotuner drops the configuration and uses another.
const NON_FATAL: [&str; 5] = [
    "not a failure",
    "Ignoring this choice",
    "error during autotuning",
    // Inductor's autotuner warning from its own module, and the table of the choices it timed.
    "_inductor/select_algorithm.py",
    "\nAUTOTUNE ",
];

/// Longest stretch of text looked at around a match for its context.
const AROUND: usize = 2048;

/// Whether the text around `start..end` says the event is not a failure: its own line (and the
/// lines its last sentence is wrapped onto), and with `neighbours` the line before and the one
/// after (at most [`AROUND`] bytes each way).
pub(crate) fn says_non_fatal(text: &str, start: usize, end: usize, neighbours: bool) -> bool {
    let mut from = floor(text, start.saturating_sub(AROUND));
    let mut to = floor(text, end.saturating_add(AROUND).min(text.len()));
    let skip = if neighbours { 2 } else { 1 };
    if let Some(i) = text[from..start].rmatch_indices('\n').nth(skip - 1) {
        from += i.0 + 1;
    }
    let limit = to;
    if let Some(i) = text[end..limit].match_indices('\n').nth(skip - 1) {
        to = end + i.0;
    }
    // A sentence wrapped onto the next lines (`… allocate 2.59GiB. The⏎ caller indicates that
    // this is not a failure`): a line that does not end one goes on, for two lines at most.
    for _ in 0..2 {
        if to >= limit || text[..to].trim_end().ends_with(['.', '!', '?', ':']) {
            break;
        }
        to = text[to + 1..limit].find('\n').map_or(limit, |i| to + 1 + i);
    }
    NON_FATAL.iter().any(|p| text[from..to].contains(p))
}

/// `at`, moved down to a character boundary of `text`.
pub(crate) fn floor(text: &str, at: usize) -> usize {
    let mut i = at.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// What the text says about a message beyond its facts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Notes {
    /// The runtime says the event is not a failure (TensorFlow's BFC warning, a skipped
    /// autotune configuration): the program goes on.
    pub non_fatal: bool,
    /// The request was too large to print (PyTorch's `Tried to allocate more than 1EB`).
    pub exabyte: bool,
    /// A generic finding's lines speak of a device (GPU, CUDA, VRAM), not host memory.
    pub device: bool,
    /// The failure came while the process was creating its CUDA context or re-mapping memory it
    /// had released (vLLM waking from sleep): it held no device memory of its own.
    pub held_elsewhere: bool,
    /// The log shows a time-sliced GPU shared between pods.
    pub time_sliced: bool,
    /// A generic finding's runtime asks to lower its own settings (`Please try lowering
    /// max_num_seqs`): its own use filled the device.
    pub own_settings: bool,
    /// The driver could not allocate pinned host memory: the host ran out, not the device.
    pub host: bool,
    /// A generic finding's lines name host memory (`CPU buffer`, `system memory`): host words
    /// outweigh device words.
    pub host_words: bool,
    /// The runtime says a single allocation may not pass a size cap (Intel GPUs' 4 GB blocks,
    /// OpenCL's and Vulkan's maximum allocation size).
    pub size_cap: bool,
    /// The request's size is negative (Go's `cannot allocate -8410442019078995968-byte block`):
    /// an overflowed size computation, not a size any memory could serve.
    pub negative_size: bool,
    /// A generic finding's message says how much memory was free (a note for the verdict).
    pub free_bytes: Option<i128>,
    /// A generic finding's message says how much memory the device or machine has.
    pub total_bytes: Option<i128>,
    /// An allocator says a limit of its own that is not memory's was passed (MLX's Metal
    /// allocator: `Resource limit (499000) exceeded`, a count of buffers).
    pub allocator_limit: bool,
}

impl Notes {
    fn join(&mut self, other: Notes) {
        self.non_fatal |= other.non_fatal;
        self.exabyte |= other.exabyte;
        self.device |= other.device;
        self.held_elsewhere |= other.held_elsewhere;
        self.time_sliced |= other.time_sliced;
        self.size_cap |= other.size_cap;
        self.host |= other.host;
        self.host_words |= other.host_words;
        self.own_settings |= other.own_settings;
        self.negative_size |= other.negative_size;
        self.free_bytes = self.free_bytes.or(other.free_bytes);
        self.total_bytes = self.total_bytes.or(other.total_bytes);
        self.allocator_limit |= other.allocator_limit;
    }
}

/// Where a device failure that states no sizes happened before the process held memory: CUDA
/// context creation (cutorch's `THCGeneral`, the driver's context calls, PyTorch's lazy init) and
/// vLLM's sleep-mode wake-up.
const HELD_ELSEWHERE: [&str; 8] = [
    "THCGeneral",
    "cuCtxCreate",
    "cuDevicePrimaryCtxRetain",
    "_cuda_init",
    "_lazy_init",
    "cumem_allocator",
    "wake_up",
    "cudaSetDevice",
];
/// Phrases with which a runtime states a per-allocation size cap.
const SIZE_CAP: [&str; 8] = [
    "allocate memory block with size larger than",
    "invalid memory alloc request size",
    "than the maximum allowed buffer size",
    "than the maximum buffer size",
    "maximum allocation size",
    "max allocation size",
    "maxMemoryAllocationSize",
    "MAX_MEM_ALLOC_SIZE",
];
/// Words of a GPU time-sliced between pods (NVIDIA's device plugin), lower case.
const TIME_SLICED: [&str; 4] = ["timeslicing", "time-slicing", "time-sliced", "time slicing"];

/// Notes from the text around a device message (at most [`AROUND`] bytes each way): whether it
/// came where only memory held elsewhere explains it (only asked when it states no sizes) and
/// whether the GPU is time-sliced. Host messages need neither.
fn context_notes(text: &str, start: usize, end: usize, f: &Finding) -> Notes {
    let device = !matches!(
        f.kind,
        Kind::LinuxOomKiller
            | Kind::OomKillReport
            | Kind::RustAllocFailure
            | Kind::HostAllocFailure
            | Kind::TorchCpuOom
    );
    if !device {
        return Notes::default();
    }
    let from = floor(text, start.saturating_sub(AROUND));
    let to = floor(text, end.saturating_add(AROUND).min(text.len()));
    let near = &text[from..to];
    let sized = f.facts.get("requested_bytes").is_some() || f.facts.get("free_bytes").is_some();
    // Cheap, case-sensitive tests first: most logs have no slicing words at all.
    let sliced = (near.contains("licing") || near.contains("liced") || near.contains("LICING"))
        && {
            let lower = near.to_ascii_lowercase();
            TIME_SLICED.iter().any(|w| lower.contains(w))
        };
    Notes {
        held_elsewhere: !sized && HELD_ELSEWHERE.iter().any(|w| near.contains(w)),
        time_sliced: sliced,
        // Cheap anchors first: the phrases are rare, lower-casing the stretch is not free.
        size_cap: (near.contains("larger than")
            || near.contains("llocation size")
            || near.contains("buffer size")
            || near.contains("AllocationSize")
            || near.contains("alloc request size")
            || near.contains("MAX_MEM_ALLOC"))
            && {
                let lower = near.to_ascii_lowercase();
                SIZE_CAP
                    .iter()
                    .any(|w| lower.contains(&w.to_ascii_lowercase()))
            },
        ..Notes::default()
    }
}

/// A finding with what the scanner saw around it.
pub(crate) struct Found {
    /// The finding.
    pub finding: Finding,
    /// What the text says about it beyond its facts.
    pub notes: Notes,
}

/// Every message in `text`, in order.
pub(crate) fn scan(original: &str) -> Vec<Found> {
    let clean = normalize::clean(original);
    let text = clean.text.as_str();
    let mut pieces = Vec::new();
    torch::find(text, &mut pieces);
    host::find(text, &mut pieces);
    accel::find(text, &mut pieces);
    cuda::find(text, &mut pieces);
    jobs::find(text, &mut pieces);
    libraries::find(text, &mut pieces);
    // The vocabulary reader: memory failures no specific reader explains.
    pieces.sort_by_key(|p| p.start);
    let mut generic = Vec::new();
    vocab::find(text, &pieces, &mut generic);
    pieces.extend(generic);
    // Earliest first; at one start the longest (most specific) wins; overlaps are dropped.
    pieces.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut kept: Vec<Piece> = Vec::new();
    for p in pieces {
        if kept.last().is_none_or(|k| p.start >= k.end) {
            kept.push(p);
        }
    }

    struct Open {
        found: Found,
        start: usize,
        end: usize,
        evidence: bool,
        /// Opened by the first line of a kernel report: its lines join at any distance.
        report: bool,
        stage: u8,
    }
    let mut open: Vec<Open> = Vec::new();
    for p in kept {
        if let Some(last) = open.last_mut() {
            let f = &last.found.finding;
            let gap = lines_between(text, last.end, p.start);
            // A kernel report holds a task list of any length between its lines, which come in
            // a fixed order (a selected process, then the one killed, which may be its child);
            // other messages continue within a few lines.
            let in_order = last.stage < KERNEL_CLOSES && p.stage >= last.stage;
            if !p.opens
                && (gap <= JOIN_LINES || last.report)
                && in_order
                && f.kind == p.kind
                // A failure after a warning the runtime recovered from is a failure of its own.
                && !(last.found.notes.non_fatal && p.evidence && !p.notes.non_fatal)
                // Adjacent generic lines are one failure told twice (llama.cpp's allocator, then
                // its caller, each with its own rounding of the size): the first line's facts stay.
                && (f.facts.agrees_with(&p.facts) || (f.kind == Kind::GenericOom && gap <= 2))
            {
                last.found.finding.facts.absorb(p.facts);
                last.end = last.end.max(p.end);
                last.evidence |= p.evidence;
                last.found.notes.join(p.notes);
                last.stage = last.stage.max(p.stage);
                continue;
            }
        }
        // The same message printed twice in a row (a runtime repeating its warning) is one; so
        // is a report told again a few lines later with less than it first stated (an
        // application logging the exception's string, without its type, after the traceback),
        // or with more (a title that states the cause, then the full message in the body).
        // The same full message again further on is a failure of its own (a second raise),
        // unless nothing but the reporter's markup (blank lines, headings, fences) or the same
        // source's other lines (NCCL's thread repeating its warning pair) lie between. The report
        // compared is the last one of the last few that is evidence (a part that states nothing may
        // lie between). A report naming the same process (its pid) again a few lines on is that
        // process's one death, whatever lies between; an allocator retrying a smaller request on
        // the next line is the first request's failure.
        if p.evidence {
            if let Some(prev) = open.iter_mut().rev().take(4).find(|o| o.evidence) {
                let f = &prev.found.finding;
                let gap = lines_between(text, prev.end, p.start);
                let retry = f.kind == p.kind && gap <= 1 && retried_smaller(&f.facts, &p.facts);
                // The ranks of one job failing together: the first rank's report stands for them.
                let rank = f.kind == p.kind && gap <= 2 && other_rank(&f.facts, &p.facts);
                if retry || rank {
                    prev.end = p.end;
                    continue;
                }
                if f.kind == p.kind
                    && ((f.facts == p.facts
                        && (gap <= 2
                            || (gap <= REPEAT_LINES
                                && (f.facts.get("pid").is_some()
                                    || nothing_new_between(text, prev.start, prev.end, p.start)))))
                        || ((told_again(&f.facts, &p.facts) || told_again(&p.facts, &f.facts))
                            && gap <= REPEAT_LINES))
                {
                    // Told first in short (an issue title), then in full: the full report's facts.
                    prev.found.finding.facts.absorb(p.facts);
                    prev.end = p.end;
                    continue;
                }
            }
        }
        open.push(Open {
            found: Found {
                finding: Finding {
                    kind: p.kind,
                    facts: p.facts,
                    line: 0,
                },
                notes: p.notes,
            },
            start: p.start,
            end: p.end,
            evidence: p.evidence,
            report: p.opens && !p.evidence,
            stage: p.stage,
        });
    }
    // Line numbers of the original text, counted once from start to end (starts ascend).
    let (mut at, mut line) = (0usize, 1usize);
    let mut out = Vec::new();
    for mut o in open {
        if !o.evidence
            || (o.found.finding.facts.is_empty() && !o.found.finding.kind.evidence_suffices())
        {
            continue;
        }
        let notes = context_notes(text, o.start, o.end.max(o.start), &o.found.finding);
        o.found.notes.join(notes);
        let to = clean.original(o.start).clamp(at, original.len());
        line += original.as_bytes()[at..to]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        at = to;
        o.found.finding.line = line;
        out.push(o.found);
    }
    out
}

/// Whether every line between a message (`start..end`) and its repetition at `next` is blank,
/// markup (a markdown heading, a fence, a rule), a line of the same source (it shares the
/// message's first line's header, a prefix with a letter in it ending at a blank:
/// `VM-0-16-ubuntu:392:494 [2] `, NCCL's host, pid, thread and device), a link, or words with no
/// number in them that open no traceback (the runtime's own hint).
fn nothing_new_between(text: &str, start: usize, end: usize, next: usize) -> bool {
    let (Some(end), Some(next)) = (text.get(..end), text.get(..next)) else {
        return false;
    };
    let first_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let first = &text[first_start..line_end(text, first_start)];
    let from = end.len();
    let to = next.rfind('\n').map_or(0, |i| i + 1);
    let Some(after) = text[from..].find('\n').map(|i| from + i + 1) else {
        return false;
    };
    if after > to {
        return true;
    }
    text[after..to].lines().all(|l| {
        let t = l.trim();
        t.is_empty()
            || t.starts_with('#')
            || t.starts_with("```")
            || t.starts_with("---")
            || same_source(first, l)
            // A hint in words or a link (Cycles' `Refer to the … documentation`), not a step,
            // a time or a traceback, which would show the program went on.
            || (t.starts_with("http") && !t.contains(' '))
            || (!t.bytes().any(|b| b.is_ascii_digit()) && !t.starts_with("Traceback"))
    })
}

/// Whether `line` shares `first`'s header: their common beginning, cut back to a blank, holds a
/// letter.
fn same_source(first: &str, line: &str) -> bool {
    let common = first
        .bytes()
        .zip(line.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    first.as_bytes()[..common]
        .iter()
        .rposition(|&b| b == b' ')
        .is_some_and(|cut| first.as_bytes()[..cut].iter().any(u8::is_ascii_alphabetic))
}

/// Line breaks between two offsets (0 when `to` ≤ `from`).
fn lines_between(text: &str, from: usize, to: usize) -> usize {
    text.get(from..to)
        .map_or(0, |s| s.bytes().filter(|&b| b == b'\n').count())
}
