//! CUDA and HIP driver/runtime out-of-memory errors as every layer prints them: PyTorch's
//! `CUDA error: out of memory`, the old THC `cuda runtime error (2)`, Caffe/glog `Check failed`
//! (the glog header's `file:line` is the logger's, not a fact, as for TensorFlow's headers),
//! CuPy, tinygrad, cudarc tokens, TensorFlow's stream executor (CUDA and ROCm) and ggml/llama.cpp.

use super::facts::Facts;
use super::scan::{compile, each, int_at, size_at, str_at, words_at, Pattern, Piece};
use super::{normalize, Kind};
use std::sync::LazyLock;

/// `CUDA_ERROR_OUT_OF_MEMORY` with a stray space allowed inside (a token split by copying).
const DRIVER_OOM: &str = r"C\s?U\s?D\s?A\s?_\s?E\s?R\s?R\s?O\s?R\s?_\s?O\s?U\s?T\s?_\s?O\s?F\s?_\s?M\s?E\s?M\s?O\s?R\s?Y";
/// An exception type before a message (`RuntimeError: `, `torch.AcceleratorError: `).
const EXC: &str = r"(?:([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)): )?";

/// `CUDA error: out of memory`, with where it failed after `at` or in parentheses after it (Leela
/// Chess Zero's `CUDA error: out of memory (…\network_cudnn.cc:442)`, the closing parenthesis
/// lost where a reporter cut the line).
static CUDA_ERROR_OOM: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"{EXC}(?i:CUDA (?:driver |runtime )?error:\s?out of memory)(?: at ([^\s:]+:[0-9]+)| \(([^()\s]+:[0-9]+)\)?)?(?:[\s\S]{{0,8}}?Search for `(cudaErrorMemoryAllocation)')?"
    ))
});
static CUDA_ERROR_CODE: Pattern = LazyLock::new(|| {
    compile(r"(?i:CUDA) (?i:error) ([0-9]+)(?: at ([^\s:]+:[0-9]+))?[:,] out of memory")
});
static CUDA_CHECK: Pattern = LazyLock::new(|| {
    compile(
        r#"CUDA error at ([^\s:]+:[0-9]+) code=([0-9]+)\((cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY)\)(?: "([^"\n]*)")?"#,
    )
});
static THC_CHECK: Pattern = LazyLock::new(|| {
    compile(r"THCudaCheck FAIL file=(\S+) line=([0-9]+) error=([0-9]+) : (out of memory)")
});
static THC_ERROR: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"{EXC}cuda runtime err(?:or)?\s*\(([0-9]+)\)\s*: (out of memory)(?: at (\S+:[0-9]+))?"
    ))
});
/// A failed check that the CUDA call returned `cudaSuccess`: glog/Caffe's `Check failed: error ==
/// cudaSuccess (2 vs. 0) out of memory`, and Caffe2's `[enforce fail at F:L] error == cudaSuccess.
/// 2 vs 0. Error at: F:L: out of memory` (its exception type and where the call failed).
static GLOG_CHECK: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"(?:Check failed: |{EXC}\[enforce fail at [^\]\n]*\] )(?:\w+ == cudaSuccess(?:(?: \(|\. )([0-9]+) vs\.? 0\)?\.?)?|cudaSuccess == \w+ \(0 vs\. ([0-9]+)\))(?: Error at: (\S+:[0-9]+))?[:\s]*(?:(?:Cuda Error|CUDA): )?(out of memory)",
    ))
});
static CUPY: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"{EXC}(?:Out of memory allocating|out of memory to allocate) ([0-9][0-9,]*) bytes"
    ))
});
static GGML_DEVICE: Pattern = LazyLock::new(|| {
    compile(r"current device: ([0-9]+), in function ([A-Za-z0-9_:]+) at [^\n]*\n[\t\x20]*([^\n]+)")
});
/// An error token after its exception type, with what the wrapper says around it: numba's
/// `CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY` (the code and the
/// failed call), a call with its arguments that `failed with error` the token (KeOps'
/// `cuMemAlloc(&p_data, sizeof(TYPE *) * nargs) failed with error CUDA_ERROR_OUT_OF_MEMORY`),
/// AMDGPU.jl's `HIPError(code hipErrorOutOfMemory, out of memory)` and CuPy's
/// `cudaErrorMemoryAllocation: out of memory` (the error string); the call named before the token
/// and a colon (libgpuarray's `GpuArrayException: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: out of
/// memory`).
static ERROR_TOKEN: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"{EXC}(?:\[([0-9]+)\] )?(?:Call to (\w+) results in |((?:cuda|cu|hip)[A-Z]\w*\((?:[^()\n]|\([^()\n]*\))*\)) failed with error |((?:cuda|cu|hip)[A-Z]\w*): )?({DRIVER_OOM}|cudaErrorMemoryAllocation|hipErrorOutOfMemory|HIP_ERROR_OutOfMemory)(?:[:,] (out of memory))?"
    ))
});
static STREAM_EXECUTOR: Pattern = LazyLock::new(|| {
    compile(
        r"failed to alloc(?:ate)? (?:{SIZE}(?: \(([0-9]+) bytes\))?|([0-9]+) bytes) (?:from|on) (device|host): (CUDA_ERROR_[A-Z_]+|HIP_ERROR_\w+|hipError_t\([0-9]+\)|hipError\w+)(?:: (out of memory))?",
    )
});
static GGML_ALLOC: Pattern = LazyLock::new(|| {
    compile(
        r"allocating {SIZE} on device ([0-9]+): (\w+) failed: (out of memory)(?:[\s\S]{0,400}?buffer of size ([0-9]+))?",
    )
});

/// A CUDA or HIP call named as the one that failed: MXNet's `cudaMalloc failed: out of memory` /
/// `cudaMalloc retry failed: out of memory` (after its exception type and a logger's `[time]
/// file:line:` header, which is not a fact), also with its return code between (`cudaHostAlloc
/// failed, ret[2], out of memory`); a call whose name says `Host` allocates pinned host memory.
/// ggml's `allocating X on device N: cudaMalloc failed` (group 2) is read by [`GGML_ALLOC`].
static CALL_FAILED: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"{EXC}(?:\[[^\]\n]{{1,40}}\] [^\s:]+:[0-9]+: )?(on device [0-9]+: )?\b((?:cuda|cu|hip)[A-Z]\w*)(?: retry)? failed(?:: |, (?:ret|code|error)\s?[\[(=:]?\s?([0-9]+)[\])]?, )(out of memory)"
    ))
});
/// The driver's error string, then the call that failed and where (Blender Cycles' `Out of memory
/// in cuStreamCreate(&cuda_stream_, CU_STREAM_NON_BLOCKING) (…/queue.cpp:21)`).
static STRING_IN_CALL: Pattern = LazyLock::new(|| {
    compile(
        r"\b((?i:out of memory)) in ((?:cuda|cu|hip)[A-Z]\w*\([^()\n]*\)) \(([^()\n]+:[0-9]+)\)",
    )
});
/// A CUDA check that names the failed expression and where it was made (TensorRT-LLM's `CUDA
/// runtime error in ::cudaMallocAsync(ptr, n, stream): out of memory (tllmBuffers.h:112)`), in any
/// case and also with the CUDA code before its string (TensorRT's `Cuda Error in allocate: 2 (out
/// of memory)`).
static ERROR_IN: Pattern = LazyLock::new(|| {
    compile(&format!(
        r"{EXC}(?:\[[^\]\n]{{1,40}}\])*\s*(?i:CUDA (?:runtime |driver )?error in) ([^\n]+?): (?:([0-9]+) \()?(out of memory)\)?(?: \(([^\s()]+:[0-9]+)\))?"
    ))
});

/// The canonical form of a driver error token (a copied token may hold a stray space).
fn token(c: &regex::Captures, i: usize) -> Option<String> {
    str_at(c, i).map(|t| t.split_whitespace().collect())
}

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    let kind = Kind::CudaDriverOom;
    each(&CUDA_ERROR_OOM, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.text("error_string", "out of memory");
        f.opt_text("location", str_at(c, 2).or_else(|| str_at(c, 3)));
        f.opt_text("cuda_error", str_at(c, 4));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&CUDA_ERROR_CODE, text, |c, s, e| {
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
    // THC prints the check first and raises the same error as a RuntimeError: one message.
    each(&THC_CHECK, text, |c, s, e| {
        let mut f = Facts::default();
        if let (Some(file), Some(line)) = (str_at(c, 1), str_at(c, 2)) {
            f.text("location", format!("{file}:{line}"));
        }
        f.opt_int("cuda_error_code", int_at(c, 3));
        f.opt_text("error_string", words_at(c, 4).as_deref());
        out.push(Piece::message(s, e, kind, f));
    });
    each(&THC_ERROR, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.opt_int("cuda_error_code", int_at(c, 2));
        f.opt_text("error_string", words_at(c, 3).as_deref());
        f.opt_text("location", str_at(c, 4));
        out.push(Piece::part(s, e, kind, f, true));
    });
    each(&GLOG_CHECK, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.opt_int("cuda_error_code", int_at(c, 2).or_else(|| int_at(c, 3)));
        f.opt_text("location", str_at(c, 4));
        f.opt_text("error_string", words_at(c, 5).as_deref());
        out.push(Piece::message(s, e, kind, f));
    });
    each(&CUPY, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        let bytes = str_at(c, 2).and_then(|n| n.replace(',', "").parse::<i128>().ok());
        f.opt_int("requested_bytes", bytes);
        out.push(Piece::message(s, e, kind, f));
    });
    each(&GGML_DEVICE, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("device_index", int_at(c, 1));
        f.opt_text("function", str_at(c, 2));
        // The call is on the line after the source path; a wrapped path would take its place.
        let path_cut = c
            .get(3)
            .is_some_and(|m| normalize::may_continue(text, m.start().saturating_sub(1)));
        if let Some(t) = str_at(c, 3).filter(|_| !path_cut) {
            f.text("failed_call", t.trim());
        }
        out.push(Piece::part(s, e, kind, f, false));
    });
    // A bare error token: its own message, or the name of the one just before (`CUDA error: out
    // of memory` followed by its `cudaErrorMemoryAllocation`).
    each(&ERROR_TOKEN, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.opt_int("cuda_error_code", int_at(c, 2));
        f.opt_text(
            "failed_call",
            str_at(c, 3)
                .or_else(|| str_at(c, 4))
                .or_else(|| str_at(c, 5)),
        );
        if let Some(t) = token(c, 6) {
            f.text("cuda_error", t);
        }
        f.opt_text("error_string", words_at(c, 7).as_deref());
        out.push(Piece::part(s, e, kind, f, true));
    });
    each(&STREAM_EXECUTOR, text, |c, s, e| {
        let mut f = Facts::default();
        let bytes = int_at(c, 3)
            .or_else(|| int_at(c, 4))
            .or_else(|| size_at(c, 1));
        f.opt_int("requested_bytes", bytes);
        f.opt_text("cuda_error", str_at(c, 6));
        f.opt_text("error_string", words_at(c, 7).as_deref());
        let mut p = Piece::message(s, e, kind, f);
        // Pinned host memory the driver could not allocate: the host ran out, not the device.
        p.notes.host = str_at(c, 5) == Some("host");
        out.push(p);
    });
    each(&CALL_FAILED, text, |c, s, e| {
        if c.get(2).is_some() {
            return;
        }
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.opt_text("failed_call", str_at(c, 3));
        f.opt_int("cuda_error_code", int_at(c, 4));
        f.opt_text("error_string", words_at(c, 5).as_deref());
        // Its own message, or the same failure told again by a caller (ollama's runner error
        // repeating ggml's `cudaMalloc failed: out of memory`).
        let mut p = Piece::part(s, e, kind, f, true);
        p.notes.host = str_at(c, 3).is_some_and(|call| call.contains("Host"));
        out.push(p);
    });
    each(&STRING_IN_CALL, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("error_string", str_at(c, 1));
        f.opt_text("failed_call", str_at(c, 2));
        f.opt_text("location", str_at(c, 3));
        out.push(Piece::message(s, e, kind, f));
    });
    each(&ERROR_IN, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("exception_type", str_at(c, 1));
        f.opt_text("failed_call", str_at(c, 2));
        f.opt_int("cuda_error_code", int_at(c, 3));
        f.opt_text("error_string", words_at(c, 4).as_deref());
        f.opt_text("location", str_at(c, 5));
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

/// The cudarc/candle driver-error pattern, shared with the candle matcher.
pub(crate) fn driver_oom_token() -> &'static str {
    DRIVER_OOM
}
