//! Accelerator runtimes other than PyTorch's allocator and the CUDA driver: candle/cudarc, JAX/XLA,
//! TensorFlow, NCCL, Triton and ONNX Runtime.

use super::facts::{Fact, Facts};
use super::scan::{
    compile, each, int_at, says_non_fatal, size_at, str_at, whole_at, words_at, Pattern, Piece,
};
use super::Kind;
use std::sync::LazyLock;

// candle / cudarc.
static DRIVER_ERROR: Pattern = LazyLock::new(|| {
    compile(&format!(
        r#"DriverError\(({}), \\?"([^"\\]*)\\?"\)"#,
        super::cuda::driver_oom_token()
    ))
});
// JAX / XLA.
/// XLA's allocation failures with the request: `Out of memory while trying to allocate N bytes`,
/// `Out of memory allocating N bytes`, and PJRT's `Error allocating device buffer: Attempting to
/// allocate 4.39G. That was not possible.` (TPU and GPU clients).
static XLA_REQUEST: Pattern = LazyLock::new(|| {
    compile(
        r"(?:Out of memory (?:while trying to allocate|allocating)|Error allocating device buffer: Attempting to allocate) (?:([0-9]+) bytes|{SIZE})(?:\. That was not possible\. There are {SIZE} free)?",
    )
});
/// XLA's `Attempting to allocate 31.06M. That was not possible. There are 58.64M free.` without
/// PJRT's `Error allocating device buffer:` before it (`RuntimeError: RESOURCE_EXHAUSTED: Attempting
/// to allocate …`, TPU's `Due to fragmentation, the largest contiguous region …` after it).
static XLA_ATTEMPT: Pattern = LazyLock::new(|| {
    compile(r"Attempting to allocate {SIZE}\. That was not possible\.(?: There are {SIZE} free)?")
});
/// XLA on TPU reserving a program's memory: `Attempting to reserve 3.95G at the bottom of memory.
/// That was not possible. There are 1.92G free, …`, then its HBM report (`HBM capacity 8.00G:`,
/// `Program requirement: 3.95G (4,237,689,856 bytes)`, the exact request).
static XLA_RESERVE: Pattern = LazyLock::new(|| {
    compile(
        r"Attempting to reserve {SIZE} at the bottom of memory\. That was not possible\.(?: There are {SIZE} free)?",
    )
});
static XLA_HBM: Pattern = LazyLock::new(|| {
    compile(r"\AHBM capacity {SIZE}:|\A\s*Program requirement: {SIZE} \(\s*([0-9][0-9,]*) bytes\)")
});
/// Lines after a reservation failure where XLA's HBM report is read.
const HBM_REPORT: usize = 12;
static XLA_REQUEST_EXACT: Pattern = LazyLock::new(|| {
    compile(r"Failed to allocate request for {SIZE} \(([0-9]+)B\)(?: on device ordinal ([0-9]+))?")
});
/// XLA on TPU: `Ran out of memory in memory space hbm. Used 17.37G of 15.48G hbm.`
static XLA_SPACE: Pattern = LazyLock::new(|| {
    compile(
        r"Ran out of memory in memory space ([A-Za-z0-9_]+)\.(?: Used {SIZE} of {SIZE} [A-Za-z0-9_]+)?",
    )
});
/// XLA on TPU checking a program's static allocations against the device: `TPU TensorCore Hbm
/// usage: 34.82G, SparseCore Hbm usage 174.10G, exceeding available bytes: 95.74G` (the usages
/// are stated apart, their sum is not; the available bytes are the device's).
static XLA_USAGE: Pattern = LazyLock::new(|| {
    compile(r"(?i:\bHbm usage)\b[^\n]{0,120}?\bexceeding available bytes:\s?{SIZE}")
});
/// XLA:TPU refusing an allocation larger than the memory (`Allocation (size=107374182400) would
/// exceed memory (size=17179869184) :: #allocation7 [shape = …]`): the request and the total.
static XLA_WOULD_EXCEED: Pattern = LazyLock::new(|| {
    compile(r"Allocation \(size=([0-9]+)\) would exceed memory \(size=([0-9]+)\)")
});
/// XLA's status alone (`RESOURCE_EXHAUSTED: Out of memory`), when no request follows it.
static XLA_BARE: Pattern =
    LazyLock::new(|| compile(r"(?i:RESOURCE_EXHAUSTED|Resource exhausted): Out of memory"));
/// XLA's `cudaMallocAsync` allocator: the failed request, then the device's free and total memory.
static XLA_ASYNC: Pattern =
    LazyLock::new(|| compile(r"cuMemAllocAsync failed to allocate ([0-9]+) bytes[^\n]*"));
static XLA_ASYNC_FREE: Pattern =
    LazyLock::new(|| compile(r"Reported by CUDA: Free memory/Total memory: ([0-9]+)/([0-9]+)"));
static XLA_STAT: Pattern = LazyLock::new(|| {
    compile(
        r"(parameter|constant|maybe_live_out|preallocated temp|total) (allocation|fragmentation): {SIZE}(?: \(([0-9.]+)%\))?",
    )
});
// TensorFlow.
static TF_TENSOR: Pattern = LazyLock::new(|| {
    compile(
        r"OOM when allocating tensor (?:with|of) shape(?:\s?\[([0-9,\s]*)\])?(?: and type ([A-Za-z0-9_]+))?(?: on ([^\s\]]+))?(?: by allocator ([A-Za-z0-9_]+(?: allocator)?))?",
    )
});
/// The BFC allocator's warning, with its allocator's name (`Allocator (GPU_0_bfc) ran out …`,
/// `Allocator ran out …`) or in the older wording without it (`Ran out of memory trying to
/// allocate 220.5KiB.  See logs for memory state.`); a printed size must follow.
static TF_BFC: Pattern = LazyLock::new(|| {
    compile(
        r"(?:Allocator(?: \(([A-Za-z0-9_]+)\))? ran|\bRan) out of memory trying to allocate {SIZE}(?:[^\n]*?freed_by_count=([0-9]+))?",
    )
});
static TF_RAN_OUT: Pattern =
    LazyLock::new(|| compile(r"Ran out of GPU memory when allocating ([0-9]+) bytes"));
static TF_EIGEN: Pattern =
    LazyLock::new(|| compile(r"EigenAllocator for GPU ran out of memory when allocating ([0-9]+)"));
// NCCL, Triton, ONNX Runtime.
static NCCL: Pattern = LazyLock::new(|| {
    compile(
        r"([A-Za-z0-9][A-Za-z0-9._-]*):([0-9]+):([0-9]+) \[([0-9]+)\][^\n]*?(?:NCCL )?WARN (?:Cuda failure (?:([0-9]+) )?'([^'\n]*)'|Failed to CUDA (?:calloc|malloc|host alloc) ([0-9]+) bytes)",
    )
});
static NCCL_BARE: Pattern = LazyLock::new(|| {
    compile(
        r"(?:NCCL (?:WARN|warning\(error\) log entry[^'\n]*')|ncclUnhandledCudaError: Call to CUDA function failed\.(?:\s*\[rank[0-9]+\]:)? Last error:(?:\s*\[rank[0-9]+\]:)?)\s?Cuda failure (?:([0-9]+) )?'(out of memory)'",
    )
});
/// Triton's `out of resource: shared memory, Required: N, Hardware limit: M`, also with the limit's
/// label retyped (`Hardware limitation: M`), or cut after the resource (`out of resource: shared
/// memory,` where a paste ends).
static TRITON: Pattern = LazyLock::new(|| {
    compile(
        r"(?m)out of resource:\s*([A-Za-z][A-Za-z\s]*?)(?:,\s*Required:\s*([0-9]+),\s*Hardware limit[a-z]*:\s*([0-9]+)|,?[\t\x20]*$)",
    )
});
static ORT_NODE: Pattern = LazyLock::new(|| {
    compile(r"while running ([A-Za-z0-9_]+) node\.(?: Name:\\?'([^'\n\\]*)\\?')?")
});
/// ONNX Runtime's arena failing a request, also cut where an issue title ends (`…
/// BFCArena::AllocateRawInternal(size_t, …) Failed to alloc`): the arena's own function names it.
static ORT_FAIL: Pattern = LazyLock::new(|| {
    compile(
        r"(?:Failed to allocate memory for requested buffer of size|smaller than requested bytes of) ([0-9]+)|(?m)BFCArena::AllocateRawInternal\([^)\n]*\) Failed to alloc(?:ate(?: memory)?)?[\t\x20.]*$",
    )
});

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    candle(text, out);
    xla(text, out);
    tensorflow(text, out);
    others(text, out);
}

fn candle(text: &str, out: &mut Vec<Piece>) {
    each(&DRIVER_ERROR, text, |c, s, e| {
        let mut f = Facts::default();
        if let Some(t) = str_at(c, 1) {
            f.text("cuda_error", t.split_whitespace().collect::<String>());
        }
        f.opt_text("error_string", str_at(c, 2));
        out.push(Piece::message(s, e, Kind::CandleOrCudarcOom, f));
    });
}

fn xla(text: &str, out: &mut Vec<Piece>) {
    let kind = Kind::JaxXlaOom;
    each(&XLA_REQUEST, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1).or_else(|| size_at(c, 2)));
        f.opt_int("free_bytes", size_at(c, 4));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_ATTEMPT, text, |c, s, e| {
        // PJRT's wording is read whole by XLA_REQUEST.
        if text[..s].ends_with("device buffer: ") {
            return;
        }
        let mut f = Facts::default();
        f.opt_int("requested_bytes", size_at(c, 1));
        f.opt_int("free_bytes", size_at(c, 3));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_RESERVE, text, |c, s, e| {
        let mut f = Facts::default();
        let mut requested = size_at(c, 1);
        f.opt_int("free_bytes", size_at(c, 3));
        // The HBM report's lines, up to the first that is not one of them.
        let mut end = e;
        let mut at = super::scan::line_end(text, e);
        for _ in 0..HBM_REPORT {
            if at >= text.len() {
                break;
            }
            let next = super::scan::line_end(text, at + 1);
            let line = &text[at + 1..next];
            if let Some(h) = XLA_HBM.as_ref().and_then(|re| re.captures(line)) {
                f.opt_int("total_bytes", size_at(&h, 1));
                let exact = str_at(&h, 5).and_then(|n| n.replace(',', "").parse::<i128>().ok());
                requested = exact.or(requested);
                end = next;
            }
            at = next;
        }
        f.opt_int("requested_bytes", requested);
        out.push(Piece::message(s, end, kind, f));
    });
    each(&XLA_SPACE, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("memory_space", str_at(c, 1));
        f.opt_int("used_bytes", size_at(c, 2));
        f.opt_int("total_bytes", size_at(c, 4));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_WOULD_EXCEED, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1));
        f.opt_int("total_bytes", int_at(c, 2));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_USAGE, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("total_bytes", size_at(c, 1));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_BARE, text, |_, s, e| {
        let next = text[e..].trim_start_matches([' ', '\t']);
        if !(next.starts_with("while") || next.starts_with("allocating")) {
            out.push(Piece::message(s, e, kind, Facts::default()));
        }
    });
    each(&XLA_ASYNC, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_ASYNC_FREE, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("free_bytes", int_at(c, 1));
        f.opt_int("total_bytes", int_at(c, 2));
        out.push(Piece::part(s, e, kind, f, false));
    });
    each(&XLA_REQUEST_EXACT, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 3));
        f.opt_int("device_index", int_at(c, 4));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_STAT, text, |c, s, e| {
        let what = str_at(c, 1).unwrap_or("");
        let name = match (what, str_at(c, 2).unwrap_or("")) {
            ("parameter", "allocation") => "parameter_allocation_bytes",
            ("constant", "allocation") => "constant_allocation_bytes",
            ("maybe_live_out", "allocation") => "maybe_live_out_allocation_bytes",
            (p, "allocation") if p.starts_with("preallocated") => {
                "preallocated_temp_allocation_bytes"
            }
            ("total", "allocation") => "total_allocation_bytes",
            ("total", "fragmentation") => "total_fragmentation_bytes",
            _ => return,
        };
        let mut f = Facts::default();
        f.opt_int(name, size_at(c, 3));
        if let Some(p) = str_at(c, 5).and_then(|p| p.parse::<f64>().ok()) {
            f.set("total_fragmentation_percent", Fact::Float(p));
        }
        out.push(Piece::part(s, e, kind, f, false));
    });
}

fn tensorflow(text: &str, out: &mut Vec<Piece>) {
    let kind = Kind::TensorflowOom;
    each(&TF_TENSOR, text, |c, s, e| {
        let mut f = Facts::default();
        let dims: Option<Vec<i128>> = str_at(c, 1).map(|d| {
            d.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .filter_map(|x| x.parse().ok())
                .collect()
        });
        if let Some(d) = dims {
            f.set("shape", Fact::Ints(d));
        }
        f.opt_text("dtype", whole_at(c, 2, text));
        // A device path or allocator name cut by a line break may be only its first part.
        if let Some(d) = whole_at(c, 3, text) {
            f.text("device", d);
            // The device's index after its type, whatever the type (`GPU:0`, `XPU:0`, `DML:0`).
            if let Some(i) = d
                .rsplit_once("device:")
                .and_then(|(_, t)| t.split_once(':'))
                .and_then(|(_, n)| n.parse::<i128>().ok())
            {
                f.int("device_index", i);
            }
        }
        f.opt_text("allocator", whole_at(c, 4, text));
        // The op's report of a failure the allocator's warning before it told first (`Ran out
        // of memory trying to allocate 24.38MiB.` then `OOM when allocating tensor …`) continues
        // that warning; alone, it is a message of its own.
        out.push(Piece::part(s, e, kind, f, true));
    });
    each(&TF_BFC, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("allocator", str_at(c, 1));
        f.opt_int("requested_bytes", size_at(c, 2));
        f.opt_int("freed_by_count", int_at(c, 4));
        let mut p = Piece::message(s, e, kind, f);
        p.notes.non_fatal = says_non_fatal(text, s, e, false);
        out.push(p);
    });
    each(&TF_RAN_OUT, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&TF_EIGEN, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1));
        out.push(Piece::message(s, e, kind, f));
    });
}

fn others(text: &str, out: &mut Vec<Piece>) {
    let kind = Kind::NcclOrOther;
    each(&NCCL, text, |c, s, e| {
        let mut f = Facts::default();
        f.text("subsystem", "nccl");
        f.opt_text("host", str_at(c, 1));
        for (name, i) in [("pid", 2), ("tid", 3), ("cuda_device", 4)] {
            f.opt_int(name, int_at(c, i));
        }
        f.opt_int("cuda_error_code", int_at(c, 5));
        let oom = match words_at(c, 6) {
            Some(err) => {
                f.text("error_string", err.as_str());
                err.contains("out of memory")
            }
            None => false,
        };
        let requested = int_at(c, 7);
        f.opt_int("requested_bytes", requested);
        out.push(Piece::part(s, e, kind, f, oom || requested.is_some()));
    });
    each(&NCCL_BARE, text, |c, s, e| {
        let mut f = Facts::default();
        f.text("subsystem", "nccl");
        f.opt_int("cuda_error_code", int_at(c, 1));
        f.opt_text("error_string", words_at(c, 2).as_deref());
        out.push(Piece::part(s, e, kind, f, true));
    });
    each(&TRITON, text, |c, s, e| {
        let mut f = Facts::default();
        f.text("subsystem", "triton");
        f.opt_text("resource", str_at(c, 1));
        f.opt_int("required_bytes", int_at(c, 2));
        f.opt_int("hardware_limit_bytes", int_at(c, 3));
        let mut p = Piece::message(s, e, kind, f);
        p.notes.non_fatal = says_non_fatal(text, s, e, true);
        out.push(p);
    });
    each(&ORT_NODE, text, |c, s, e| {
        let mut f = Facts::default();
        f.text("subsystem", "onnxruntime");
        f.opt_text("node_type", str_at(c, 1));
        f.opt_text("node_name", str_at(c, 2));
        out.push(Piece::part(s, e, kind, f, false));
    });
    each(&ORT_FAIL, text, |c, s, e| {
        let mut f = Facts::default();
        f.text("subsystem", "onnxruntime");
        f.opt_int("requested_bytes", int_at(c, 1));
        out.push(Piece::part(s, e, kind, f, true));
    });
}
