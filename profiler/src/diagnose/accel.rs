//! Accelerator runtimes other than PyTorch's allocator: CUDA driver/runtime errors, candle/cudarc,
//! JAX/XLA, TensorFlow, NCCL, Triton and ONNX Runtime.

use super::facts::{Fact, Facts};
use super::scan::{compile, each, int_at, size_at, str_at, Pattern, Piece};
use super::Kind;
use std::sync::LazyLock;

// CUDA driver / runtime.
static CUDA_ERROR_OOM: Pattern = LazyLock::new(|| {
    compile(r"(?:([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)): )?CUDA error: out of memory")
});
static CUDA_ERROR_AT: Pattern =
    LazyLock::new(|| compile(r"CUDA error ([0-9]+) at ([^\s:]+:[0-9]+): out of memory"));
static CUDA_CHECK: Pattern = LazyLock::new(|| {
    compile(
        r#"CUDA error at ([^\s:]+:[0-9]+) code=([0-9]+)\((cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY)\)(?: "([^"\n]*)")?"#,
    )
});
static GGML_DEVICE: Pattern = LazyLock::new(|| {
    compile(r"current device: ([0-9]+), in function ([A-Za-z0-9_:]+) at [^\n]*\n[\t\x20]*([^\n]+)")
});
static ERROR_TOKEN: Pattern = LazyLock::new(|| {
    compile(
        r"(?:([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)): )?(CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation)(?:: (out of memory))?",
    )
});
static STREAM_EXECUTOR: Pattern = LazyLock::new(|| {
    compile(
        r"failed to allocate {SIZE} \(([0-9]+) bytes\) from device: (CUDA_ERROR_[A-Z_]+)(?:: (out of memory))?",
    )
});
static GGML_ALLOC: Pattern = LazyLock::new(|| {
    compile(
        r"allocating {SIZE} on device ([0-9]+): (\w+) failed: (out of memory)(?:[\s\S]{0,400}?buffer of size ([0-9]+))?",
    )
});
// candle / cudarc.
static DRIVER_ERROR: Pattern =
    LazyLock::new(|| compile(r#"DriverError\((CUDA_ERROR_OUT_OF_MEMORY), \\?"([^"\\]*)\\?"\)"#));
// JAX / XLA.
static XLA_REQUEST: Pattern = LazyLock::new(|| {
    compile(r"Out of memory (?:while trying to allocate|allocating) (?:([0-9]+) bytes|{SIZE})")
});
static XLA_REQUEST_EXACT: Pattern =
    LazyLock::new(|| compile(r"Failed to allocate request for {SIZE} \(([0-9]+)B\)"));
static XLA_STAT: Pattern = LazyLock::new(|| {
    compile(
        r"(parameter|constant|maybe_live_out|preallocated temp|total) (allocation|fragmentation): {SIZE}(?: \(([0-9.]+)%\))?",
    )
});
// TensorFlow.
static TF_TENSOR: Pattern = LazyLock::new(|| {
    compile(
        r"OOM when allocating tensor (?:with|of) shape\s?\[([0-9,\s]*)\] and type ([A-Za-z0-9_]+)(?: on ([^\s\]]+))?(?: by allocator ([A-Za-z0-9_]+))?",
    )
});
static TF_BFC: Pattern = LazyLock::new(|| {
    compile(
        r"Allocator \(([A-Za-z0-9_]+)\) ran out of memory trying to allocate {SIZE}(?:[^\n]*?freed_by_count=([0-9]+))?",
    )
});
static TF_EIGEN: Pattern =
    LazyLock::new(|| compile(r"EigenAllocator for GPU ran out of memory when allocating ([0-9]+)"));
// NCCL, Triton, ONNX Runtime.
static NCCL: Pattern = LazyLock::new(|| {
    compile(
        r"([A-Za-z0-9][A-Za-z0-9._-]*):([0-9]+):([0-9]+) \[([0-9]+)\][^\n]*?NCCL WARN (?:Cuda failure '([^'\n]*)'|Failed to CUDA (?:calloc|malloc|host alloc) ([0-9]+) bytes)",
    )
});
static TRITON: Pattern = LazyLock::new(|| {
    compile(
        r"out of resource: ([A-Za-z][A-Za-z\s]*?), Required: ([0-9]+), Hardware limit: ([0-9]+)",
    )
});
static ORT_NODE: Pattern =
    LazyLock::new(|| compile(r"while running ([A-Za-z0-9_]+) node\. Name:'([^'\n]*)'"));
static ORT_FAIL: Pattern = LazyLock::new(|| {
    compile(
        r"(?:Failed to allocate memory for requested buffer of size|smaller than requested bytes of) ([0-9]+)",
    )
});

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    cuda_driver(text, out);
    candle(text, out);
    xla(text, out);
    tensorflow(text, out);
    others(text, out);
}

fn cuda_driver(text: &str, out: &mut Vec<Piece>) {
    let kind = Kind::CudaDriverOom;
    each(&CUDA_ERROR_OOM, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.text("error_string", "out of memory");
        out.push(Piece::message(s, e, kind, f));
    });
    each(&CUDA_ERROR_AT, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("cuda_error_code", int_at(c, 1));
        f.opt_text("location", str_at(c, 2));
        f.text("error_string", "out of memory");
        out.push(Piece::message(s, e, kind, f));
    });
    each(&CUDA_CHECK, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("location", str_at(c, 1));
        f.opt_int("cuda_error_code", int_at(c, 2));
        f.opt_text("cuda_error", str_at(c, 3));
        f.opt_text("failed_call", str_at(c, 4));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&GGML_DEVICE, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("device_index", int_at(c, 1));
        f.opt_text("function", str_at(c, 2));
        if let Some(t) = str_at(c, 3) {
            f.text("failed_call", t.trim());
        }
        out.push(Piece::part(s, e, kind, f, false));
    });
    each(&ERROR_TOKEN, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.opt_text("cuda_error", str_at(c, 2));
        f.opt_text("error_string", str_at(c, 3));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&STREAM_EXECUTOR, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 3));
        f.opt_text("cuda_error", str_at(c, 4));
        f.opt_text("error_string", str_at(c, 5));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&GGML_ALLOC, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 6).or_else(|| size_at(c, 1)));
        f.opt_int("device_index", int_at(c, 3));
        f.opt_text("failed_call", str_at(c, 4));
        f.text("error_string", "out of memory");
        out.push(Piece::message(s, e, kind, f));
    });
}

fn candle(text: &str, out: &mut Vec<Piece>) {
    each(&DRIVER_ERROR, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("cuda_error", str_at(c, 1));
        f.opt_text("error_string", str_at(c, 2));
        out.push(Piece::message(s, e, Kind::CandleOrCudarcOom, f));
    });
}

fn xla(text: &str, out: &mut Vec<Piece>) {
    let kind = Kind::JaxXlaOom;
    each(&XLA_REQUEST, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1).or_else(|| size_at(c, 2)));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&XLA_REQUEST_EXACT, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 3));
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
        f.opt_text("dtype", str_at(c, 2));
        if let Some(d) = str_at(c, 3) {
            f.text("device", d);
            if let Some(i) = d
                .rsplit_once("GPU:")
                .and_then(|(_, n)| n.parse::<i128>().ok())
            {
                f.int("device_index", i);
            }
        }
        f.opt_text("allocator", str_at(c, 4));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&TF_BFC, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("allocator", str_at(c, 1));
        f.opt_int("requested_bytes", size_at(c, 2));
        f.opt_int("freed_by_count", int_at(c, 4));
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
        let oom = match str_at(c, 5) {
            Some(err) => {
                f.text("error_string", err);
                err.contains("out of memory")
            }
            None => false,
        };
        let requested = int_at(c, 6);
        f.opt_int("requested_bytes", requested);
        out.push(Piece::part(s, e, kind, f, oom || requested.is_some()));
    });
    each(&TRITON, text, |c, s, e| {
        let mut f = Facts::default();
        f.text("subsystem", "triton");
        f.opt_text("resource", str_at(c, 1));
        f.opt_int("required_bytes", int_at(c, 2));
        f.opt_int("hardware_limit_bytes", int_at(c, 3));
        out.push(Piece::message(s, e, kind, f));
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
