//! PyTorch messages: the CUDA/HIP caching allocator (≥ 2.1 and older wordings), MPS and the CPU
//! allocator.

use super::facts::{Fact, Facts, GpuProcess};
use super::normalize::may_continue;
use super::scan::{compile, each, int_at, size_at, str_at, Piece};
use super::Kind;
use regex::Regex;
use std::sync::LazyLock;

/// The ≥ 2.1 message up to its free clause; also cut there, at the end of a line (an issue title,
/// `… is free` with no period, or with an ellipsis), where the clauses it does state are whole.
/// The device index may be missing (`GPU  has`: PyTorch printed none), and a paste that lost text
/// after a figure (`of which 0 bytes i emory 10.65 GiB is allocated…`) keeps the whole figures
/// before the hole: a figure ends at a blank; the clauses after it are read on their own (see
/// [`cuda_new`]).
static NEW: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(CUDA|HIP|XPU|NPU|MLU|MUSA) out of memory\. Tried to allocate {SIZE}\. GPU:?\s?([0-9]+)?\s?has a total capac(?:i)?ty of {SIZE}(?: of which {SIZE}(?: is free)?)?(?:\.|[\x20\t]*(?:…|\.\.\.)?[\x20\t]*(?m:$)|[\x20\t]+)",
    )
});
static OLD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(?:(CUDA|HIP|XPU|NPU|MLU|MUSA) out of memory\. )?Tried to allocate {SIZE}\s*\((?:GPU|NPU|MLU|XPU):?\s*([0-9]+);([^)]*total capac[^)]*)\)?",
    )
});
/// A message cut right after its request: the wording (≥ 2.1 or older) is told by the exception
/// type before it — PyTorch ≤ 2.0 raised a `RuntimeError`, ≥ 2.1 its own `OutOfMemoryError` —
/// and without one it is taken as the current one, with the two facts it states.
/// Also retyped with an article (`CUDA out of the memory. Tried to allocate 360.00 MiB`), which the
/// vocabulary reads as the same words; cut inside the device clause, the device it names (`…
/// Tried to allocate 1024.00 MiB. GPU 0 has a`).
/// A message whose request a writer cut with an ellipsis (`RuntimeError: CUDA out of memory. Tried
/// to allocate... This is the single most common barrier`): the backend, its wording told as for
/// [`CUT`].
static ELIDED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(CUDA|HIP|XPU|NPU|MLU|MUSA) out of (?:the )?memory\. Tried to allocate[\t\x20]?(?:\.\.\.|…)",
    )
});
static CUT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(CUDA|HIP|XPU|NPU|MLU|MUSA) out of (?:the )?memory\. Tried to allocate {SIZE}(?:\. GPU:?\s?([0-9]+)\s?has\b)?",
    )
});
/// PyTorch's own exception with only its first sentence (`torch.cuda.OutOfMemoryError: CUDA out of
/// memory.`, quoted in prose or a title): the ≥ 2.1 wording, since only ≥ 2.1 raises that type,
/// with its backend, also without its period where a title ends. The message starts at the
/// backend, where [`CUT`] and the full wordings start.
static HEADLINE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(r"(?m)\bOutOfMemoryError: ((CUDA|HIP|XPU|NPU|MLU|MUSA) out of memory)(?:\.|[\t\x20]*$)")
});
/// PyTorch's wording for a request too large to print.
static EXABYTE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(r"(CUDA|HIP|XPU|NPU|MLU|MUSA) out of memory\. Tried to allocate more than 1EB memory")
});
static PROCESS: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"Process ([0-9]+) has {SIZE} memory in use"));
static THIS_PROCESS: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"this process has {SIZE} memory in use"));
/// PyTorch's own allocations; `Of the allocated memory` may be lost in a paste with holes.
static BY_TORCH: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"(?:Of the allocated memory )?{SIZE} is allocated by PyTorch"));
static PRIVATE_POOLS: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"with {SIZE} allocated in private pools"));
static UNALLOCATED: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"and {SIZE} is reserved by PyTorch but unallocated"));
/// A blank line: the end of a paragraph.
static PARAGRAPH: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"\n[\t\x20]*\n").ok());
static NEXT_OOM: LazyLock<Option<Regex>> = LazyLock::new(|| compile(r"(?i)out of memory"));
static CLAUSE: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"^\s*{SIZE}\s+([A-Za-z][A-Za-z\s]*?)\s*$"));
static MPS: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"MPS backend out of memory \(MPS allocated: {SIZE}, other allocations: {SIZE}, max allowed: {SIZE}\)(?:\. Tried to allocate {SIZE} on ([a-z]+) pool)?",
    )
});
static CPU: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(?:\[enforce fail at ([^\]\r\n]+)\][^\r\n]*?)?DefaultCPUAllocator: (?:not enough memory|can't allocate memory)(?:: you tried to allocate ([0-9]+) bytes\.?(?: Error code ([0-9]+))?)?",
    )
});

/// Longest tail of a new-style message searched for its clauses.
const TAIL: usize = 8192;

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    cuda_new(text, out);
    cuda_old(text, out);
    // The full wordings start at the same place and are longer, so they win over this one.
    each(&CUT, text, |c, s, e| {
        let mut f = Facts::default();
        backend_and_request(c, &mut f);
        f.opt_int("device_index", int_at(c, 4));
        let kind = if text[..s].ends_with("RuntimeError: ") {
            Kind::TorchCudaOomOld
        } else {
            Kind::TorchCudaOomNew
        };
        out.push(Piece::message(s, e, kind, f));
    });
    each(&ELIDED, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("backend", str_at(c, 1));
        let kind = if text[..s].ends_with("RuntimeError: ") {
            Kind::TorchCudaOomOld
        } else {
            Kind::TorchCudaOomNew
        };
        out.push(Piece::message(s, e, kind, f));
    });
    each(&HEADLINE, text, |c, _, e| {
        let Some(s) = c.get(1).map(|m| m.start()) else {
            return;
        };
        let mut f = Facts::default();
        f.opt_text("backend", str_at(c, 2));
        out.push(Piece::message(s, e, Kind::TorchCudaOomNew, f));
    });
    each(&EXABYTE, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("backend", str_at(c, 1));
        let mut p = Piece::message(s, e, Kind::TorchCudaOomNew, f);
        p.notes.exabyte = true;
        out.push(p);
    });
    mps(text, out);
    cpu(text, out);
}

fn backend_and_request(c: &regex::Captures, f: &mut Facts) {
    f.opt_text("backend", str_at(c, 1));
    f.opt_int("requested_bytes", size_at(c, 2));
}

fn cuda_new(text: &str, out: &mut Vec<Piece>) {
    each(&NEW, text, |c, s, e| {
        let mut f = Facts::default();
        backend_and_request(c, &mut f);
        f.opt_int("device_index", int_at(c, 4));
        f.opt_int("total_bytes", size_at(c, 5));
        f.opt_int("free_bytes", size_at(c, 7));
        // The rest of this message: up to the next OOM message, at most TAIL bytes.
        let mut tail_end = text.len().min(e + TAIL);
        while !text.is_char_boundary(tail_end) {
            tail_end -= 1;
        }
        let mut tail = &text[e..tail_end];
        if let Some(n) = NEXT_OOM.as_ref().and_then(|r| r.find(tail)) {
            tail = &tail[..n.start()];
        }
        let mut end = e;
        // The message ends with the unallocated clause; processes come before "Of the allocated".
        if let Some(all) = clause(&UNALLOCATED, tail).and_then(|c| c.get(0)) {
            tail = &tail[..all.end()];
        }
        let procs_end = tail.find("Of the allocated memory").unwrap_or(tail.len());
        let procs: Vec<GpuProcess> = PROCESS
            .as_ref()
            .map(|re| {
                re.captures_iter(&tail[..procs_end])
                    .filter_map(|c| {
                        Some(GpuProcess {
                            pid: str_at(&c, 1)?.parse().ok()?,
                            bytes: u128::try_from(size_at(&c, 2)?).ok()?,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        // A list crossing a kept line break that may be a wrap may have lost a broken clause:
        // all of it or nothing — unless every word between the clauses is explained (the list
        // and the own-process clause cover the whole stretch, so nothing was lost).
        let maybe_cut = tail[..procs_end]
            .match_indices('\n')
            .any(|(i, _)| may_continue(text, e + i))
            && !clauses_cover(&tail[..procs_end]);
        if !procs.is_empty() && !maybe_cut {
            f.set("processes", Fact::Processes(procs));
        }
        for (re, name) in [
            (&THIS_PROCESS, "this_process_bytes"),
            (&BY_TORCH, "allocated_by_torch_bytes"),
            (&PRIVATE_POOLS, "private_pools_bytes"),
            (&UNALLOCATED, "reserved_unallocated_bytes"),
        ] {
            let Some(c) = clause(re, tail) else { continue };
            f.opt_int(name, size_at(&c, 1));
            if let Some(all) = c.get(0) {
                end = end.max(e + all.end());
            }
        }
        out.push(Piece::message(s, end, Kind::TorchCudaOomNew, f));
    });
}

/// The first match of a clause pattern in `hay`.
fn clause<'t>(re: &LazyLock<Option<Regex>>, hay: &'t str) -> Option<regex::Captures<'t>> {
    re.as_ref()?.captures(hay)
}

fn cuda_old(text: &str, out: &mut Vec<Piece>) {
    let (Some(re), Some(clause)) = (OLD.as_ref(), CLAUSE.as_ref()) else {
        return;
    };
    for c in re.captures_iter(text) {
        let Some(m) = c.get(0) else { continue };
        let mut f = Facts::default();
        backend_and_request(&c, &mut f);
        f.opt_int("device_index", int_at(&c, 4));
        // The clause list ends at a blank line, closing parenthesis or not: a message never
        // spans a paragraph break (a paste that lost the `)` goes on with the reporter's prose).
        let list = str_at(&c, 5).unwrap_or("");
        let list = PARAGRAPH
            .as_ref()
            .and_then(|re| re.find(list))
            .map_or(list, |m| &list[..m.start()]);
        for part in list.split(';') {
            let Some(pc) = clause.captures(part) else {
                continue;
            };
            let label: String = str_at(&pc, 3)
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let name = match label.as_str() {
                l if l.starts_with("total capac") => "total_bytes",
                "already allocated" => "already_allocated_bytes",
                "free" => "free_bytes",
                "reserved in total by PyTorch" => "reserved_total_bytes",
                "cached" => "cached_bytes",
                "inactive" => "inactive_bytes",
                _ => continue,
            };
            f.opt_int(name, size_at(&pc, 1));
        }
        out.push(Piece::message(m.start(), m.end(), Kind::TorchCudaOomOld, f));
    }
}

/// Whether the `Process P has …` and own-process clauses account for every word of `list`.
fn clauses_cover(list: &str) -> bool {
    let mut rest = list.to_string();
    for re in [&PROCESS, &THIS_PROCESS] {
        if let Some(re) = re.as_ref() {
            rest = re.replace_all(&rest, " ").into_owned();
        }
    }
    let rest = rest.replace("Including non-PyTorch memory,", " ");
    rest.chars().all(|c| !c.is_alphanumeric())
}

fn mps(text: &str, out: &mut Vec<Piece>) {
    each(&MPS, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", size_at(c, 7));
        f.opt_text("pool", str_at(c, 9));
        for (name, i) in [
            ("mps_allocated_bytes", 1),
            ("other_allocations_bytes", 3),
            ("max_allowed_bytes", 5),
        ] {
            f.opt_int(name, size_at(c, i));
        }
        out.push(Piece::message(s, e, Kind::TorchMpsOom, f));
    });
}

fn cpu(text: &str, out: &mut Vec<Piece>) {
    each(&CPU, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 2));
        f.opt_int("error_code", int_at(c, 3));
        if let Some(loc) = str_at(c, 1) {
            f.text("enforce_location", loc.trim());
        }
        out.push(Piece::message(s, e, Kind::TorchCpuOom, f));
    });
}
