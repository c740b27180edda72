#!/usr/bin/env bash
# Builds candle-probe (an unmodified candle training program, for `memsight run --cupti` on a GPU:
# docs/gpu.md section 6) where no CUDA toolkit is installed: PyPI's CUDA 13.0 toolchain wheels and
# the torch environment's nvidia/cu13 headers and libraries, unpacked into one tree under
# $MEMSIGHT_CACHE (default ~/.cache/memsight), plus a stub libcuda.so for the link (candle links
# cudarc with `dynamic-linking`; the GPU machine's driver provides the real libcuda.so.1).
# Usage: integrations/candle-probe/build.sh [COMPUTE_CAP (default 90: H100/H200)]
# Prints the binary's path. The kernels take ~20 minutes on 2 cores the first time.
set -euo pipefail
cap="${1:-90}"
here="$(cd "$(dirname "$0")" && pwd)"
cache="${MEMSIGHT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memsight}"
venv="$cache/torch-2.11.0"
cuda="$cache/cuda-13.0"
py="$venv/bin/python"
[ -x "$py" ] || { echo "build.sh: no torch environment at $venv (scripts/setup.sh creates it)" >&2; exit 2; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
if [ ! -x "$cuda/bin/nvcc" ]; then
    # The torch environment's CUDA 13 headers and libraries (a CUDA build of torch has them).
    cu13="$("$py" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null || true)"
    [ -n "$cu13" ] && [ -d "$cu13/include" ] \
        || { echo "build.sh: no nvidia/cu13 in $venv (a CUDA build of torch 2.11.0 brings it)" >&2; exit 2; }
    "$py" -m pip download -q --no-deps -d "$scratch/wheels" \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
    rm -rf "$cuda.tmp"; mkdir -p "$cuda.tmp"
    cp -a "$cu13/." "$cuda.tmp/"
    for w in "$scratch/wheels"/*.whl; do "$py" -m zipfile -e "$w" "$scratch/x"; done
    cp -a "$scratch/x/nvidia/cu13/." "$cuda.tmp/"
    chmod +x "$cuda.tmp"/bin/* "$cuda.tmp"/nvvm/bin/*
    rm -rf "$cuda"; mv "$cuda.tmp" "$cuda"
fi
lib="$cuda/lib"
ln -sfn lib "$cuda/lib64"
for pair in cudart:libcudart.so.13 nvrtc:libnvrtc.so.13 curand:libcurand.so.10 cublas:libcublas.so.13 cublasLt:libcublasLt.so.13; do
    ln -sf "${pair#*:}" "$lib/lib${pair%%:*}.so"
done
if [ ! -e "$lib/libcuda.so" ]; then
    # One empty function per driver symbol cudarc references: the CUDA toolkit's lib/stubs idea.
    cudarc="$(cargo metadata --format-version 1 --manifest-path "$here/Cargo.toml" \
        | "$py" -c 'import json,sys,os; print(os.path.dirname([p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"][0]))')"
    [ -d "$cudarc/src/driver/sys" ] || { echo "build.sh: cudarc's driver bindings not found" >&2; exit 2; }
    grep -rhoE '\bcu[A-Z][A-Za-z0-9_]*\b' "$cudarc/src/driver/sys" \
        | sort -u | awk '{print "void " $1 "(void) {}"}' >"$scratch/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so" "$scratch/stub.c"
fi
export CUDA_ROOT="$cuda" CUDA_PATH="$cuda" PATH="$cuda/bin:$PATH" CUDA_COMPUTE_CAP="$cap"
cargo build --release --manifest-path "$here/Cargo.toml" >&2
echo "${CARGO_TARGET_DIR:-$here/target}/release/candle-probe"
