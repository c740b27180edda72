//! Libraries' and engines' own words for running out of memory: GPU libraries' allocation-failure
//! statuses (`CUBLAS_STATUS_ALLOC_FAILED`, `CUDNN_STATUS_ALLOC_FAILED`, …), PyTorch's
//! `cudaMallocAsync` backend (`Allocation on device N would exceed allowed memory`) and vLLM's
//! KV-cache capacity errors.

use super::facts::Facts;
use super::scan::{compile, each, int_at, size_at, str_at, Pattern, Piece};
use super::Kind;
use std::sync::LazyLock;

static STATUS: Pattern = LazyLock::new(|| {
    compile(r"(?i)\b(?:([A-Za-z]+) failure ([0-9]+): )?\b([a-z]+)_(STATUS_)?ALLOC_FAILED\b")
});
/// What comes before a status on its line, read backwards from it: the call that failed and its
/// code (`cudnnFindConvolutionForwardAlgorithm: 2: CUDNN_STATUS_ALLOC_FAILED`, Knet). The call is
/// one of the status's own library (its name starts with the library's, in lower case as the C
/// APIs spell their functions: `cudnnFind…`, `cublasCreate`), so an exception type (`CuFftError:`)
/// or a logger's name before the status is not taken for it.
static STATUS_HEAD: Pattern = LazyLock::new(|| {
    compile(r"\b([A-Za-z_][A-Za-z0-9_]*)(?:\([^()\n]*\))?\x60?:[\t\x20]*(?:([0-9]+):[\t\x20]*)?\z")
});
/// What follows a status: the call that failed and the device. A call cut inside its arguments
/// (an issue title: `` when calling `cublasCreate(handle ``) keeps what was printed of them.
static STATUS_TAIL: Pattern = LazyLock::new(|| {
    compile(
        r"\A(?:\x60? when calling \x60?([A-Za-z_][A-Za-z0-9_]*(?:\([^()\n]*\)|\([A-Za-z0-9_]+(?m:$))?)\x60?|\s\(([A-Za-z_][A-Za-z0-9_]*)\))?(?:[\t\x20]*;[\t\x20]*GPU=([0-9]+))?",
    )
});
static ASYNC: Pattern = LazyLock::new(|| {
    compile(
        r"(OutOfMemoryError: )?Allocation on device(?:[\t\x20]([0-9]+))?( would exceed allowed memory)?",
    )
});
static ASYNC_FIELD: Pattern = LazyLock::new(|| {
    compile(
        r"(Currently allocated|Requested|Device limit|Free \(according to CUDA\)|PyTorch limit \(set by user-supplied memory fraction\))(?:\s|\\n)*:(?:\s|\\n)*{SIZE}",
    )
});
static VLLM_BLOCKS: Pattern =
    LazyLock::new(|| compile(r"No available memory for the cache blocks"));
static VLLM_TOKENS: Pattern = LazyLock::new(|| {
    compile(
        r"max seq len \(([0-9]+)\) is larger than the maximum number of tokens that can be stored in KV cache \(([0-9]+)\)",
    )
});
static VLLM_BYTES: Pattern = LazyLock::new(|| {
    compile(
        r"max seq len \(([0-9]+)\), \(?{SIZE} KV cache is needed, which is larger than the available KV cache memory \({SIZE}\)(?:\. Based on the available memory, the estimated maximum model length is ([0-9]+))?",
    )
});

/// Longest stretch after an async-backend header where its table is read.
const TABLE: usize = 640;

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    // Each family only where its words occur (a substring search is cheaper than a regex).
    if text.contains("ALLOC_FAILED")
        || text.contains("alloc_failed")
        || text.contains("Alloc_Failed")
    {
        statuses(text, out);
    }
    if text.contains("Allocation on device") {
        async_backend(text, out);
    }
    if text.contains("cache blocks") || text.contains("KV cache") {
        vllm(text, out);
    }
}

fn statuses(text: &str, out: &mut Vec<Piece>) {
    each(&STATUS, text, |c, s, e| {
        let mut f = Facts::default();
        let lib = str_at(c, 3).unwrap_or("").to_ascii_lowercase();
        f.text("library", lib.clone());
        let infix = if c.get(4).is_some() { "_STATUS" } else { "" };
        f.text(
            "status",
            format!("{}{infix}_ALLOC_FAILED", lib.to_ascii_uppercase()),
        );
        f.opt_int("status_code", int_at(c, 2));
        let mut start = s;
        if c.get(1).is_none() {
            let line = text[..s].rfind('\n').map_or(0, |i| i + 1);
            let head = STATUS_HEAD
                .as_ref()
                .and_then(|re| re.captures(&text[line..s]));
            if let Some((h, call)) = head.as_ref().and_then(|h| Some((h, h.get(1)?))) {
                let name = call.as_str();
                let exception = name.ends_with("Error") || name.ends_with("Exception");
                if name.len() > lib.len() && name.starts_with(&lib) && !exception {
                    f.text("failed_call", call.as_str());
                    f.opt_int("status_code", int_at(h, 2));
                    start = line + call.start();
                }
            }
        }
        let mut end = e;
        if let Some(t) = STATUS_TAIL.as_ref().and_then(|re| re.captures(&text[e..])) {
            if f.get("failed_call").is_none() {
                f.opt_text("failed_call", str_at(&t, 1).or_else(|| str_at(&t, 2)));
            }
            f.opt_int("device_index", int_at(&t, 3));
            end += t.get(0).map_or(0, |m| m.end());
        }
        out.push(Piece::message(start, end, Kind::LibraryAllocFailed, f));
    });
}

fn async_backend(text: &str, out: &mut Vec<Piece>) {
    each(&ASYNC, text, |c, s, e| {
        // The header alone is PyTorch's only when it says so (`OutOfMemoryError:` or the limit),
        // also when an error report gives the exception's type on a line of its own just before
        // its message (`Exception Type: torch.OutOfMemoryError` then `Exception Message:
        // Allocation on device`).
        if c.get(1).is_none() && c.get(3).is_none() && !type_just_before(text, s) {
            return;
        }
        let mut f = Facts::default();
        f.opt_int("device_index", int_at(c, 2));
        let to = super::scan::floor(text, (e + TABLE).min(text.len()));
        let mut end = e;
        // The table's rows, in order, up to the first row that is not one of them.
        let mut at = e;
        each(&ASYNC_FIELD, &text[e..to], |r, rs, re| {
            if e + rs > at + 64 {
                return;
            }
            let name = match str_at(r, 1).unwrap_or("") {
                "Currently allocated" => "allocated_bytes",
                "Requested" => "requested_bytes",
                "Device limit" => "device_limit_bytes",
                n if n.starts_with("Free") => "free_bytes",
                _ => "memory_fraction_limit_bytes",
            };
            f.opt_int(name, size_at(r, 2));
            at = e + re;
            end = at;
        });
        out.push(Piece::message(s, end, Kind::TorchCudaOomAsync, f));
    });
}

/// Whether one of the two lines before `at` names PyTorch's `OutOfMemoryError` (an error report
/// that states the exception's type apart from its message).
fn type_just_before(text: &str, at: usize) -> bool {
    let mut from = text[..at].rfind('\n').unwrap_or(0);
    for _ in 0..2 {
        from = text[..from].rfind('\n').unwrap_or(0);
    }
    text[from..at].contains("OutOfMemoryError")
}

fn vllm(text: &str, out: &mut Vec<Piece>) {
    each(&VLLM_BLOCKS, text, |_, s, e| {
        out.push(Piece::message(s, e, Kind::VllmKvCache, Facts::default()));
    });
    each(&VLLM_TOKENS, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("max_model_len", int_at(c, 1));
        f.opt_int("kv_cache_tokens", int_at(c, 2));
        out.push(Piece::message(s, e, Kind::VllmKvCache, f));
    });
    each(&VLLM_BYTES, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("max_model_len", int_at(c, 1));
        f.opt_int("kv_cache_needed_bytes", size_at(c, 2));
        f.opt_int("kv_cache_available_bytes", size_at(c, 4));
        f.opt_int("estimated_max_model_len", int_at(c, 6));
        out.push(Piece::message(s, e, Kind::VllmKvCache, f));
    });
}
