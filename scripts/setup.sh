#!/usr/bin/env bash
# Installs what `make demo` and `make test` need on a fresh machine. Idempotent: a second run
# only checks. Everything downloaded lives outside the tracked tree, in $MEMSIGHT_CACHE
# (default ~/.cache/memsight):
#   - the Rust toolchain is expected (cargo); C compiler and make for jemalloc's build;
#   - libtorch for the tch 0.24 crates: torch==2.11.0 from PyPI in a virtual environment.
# Prints the environment to use on its last line (`source <(scripts/setup.sh --env)`).
set -euo pipefail

CACHE="${MEMSIGHT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memsight}"
TORCH_VERSION="2.11.0"
VENV="$CACHE/torch-$TORCH_VERSION"

say() { echo "setup: $*" >&2; }
die() { echo "setup: error: $*" >&2; exit 1; }

need_apt=()
command -v cargo >/dev/null || die "cargo is missing: install Rust (https://rustup.rs) first"
command -v cc >/dev/null || need_apt+=(gcc g++)
command -v make >/dev/null || need_apt+=(make)
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
if [ "${#need_apt[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || die "missing ${need_apt[*]} and no apt-get to install them"
    say "installing ${need_apt[*]}"
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# Optional: tmux for the viewer's end-to-end test (it skips, saying so, without).
if ! command -v tmux >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing tmux (for the viewer test)"
    { apt-get install -y -qq tmux || { apt-get update -qq && apt-get install -y -qq tmux; }; } >/dev/null 2>&1 \
        || say "could not install tmux: the viewer test will skip"
fi
# Optional: musl-gcc for the test that a musl program runs under the preloaded library (it skips,
# saying so, without).
if ! command -v musl-gcc >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing musl-tools (for the musl-program test)"
    { apt-get install -y -qq musl-tools || { apt-get update -qq && apt-get install -y -qq musl-tools; }; } >/dev/null 2>&1 \
        || say "could not install musl-tools: the musl-program test will skip"
fi
# Optional: promtool and a Prometheus server for the metrics test (it skips, saying so, without).
if ! command -v promtool >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing prometheus (promtool and server, for the metrics test)"
    { apt-get install -y -qq prometheus || { apt-get update -qq && apt-get install -y -qq prometheus; }; } >/dev/null 2>&1 \
        || say "could not install prometheus: the metrics test will skip its promtool and scrape checks"
fi
# Optional: tcmalloc and jemalloc for the test that a job preloading its own allocator is counted
# whole (it skips, saying so, without).
have_lib() { ldconfig -p 2>/dev/null | grep -q "$1"; }
if ! { have_lib libtcmalloc.so.4 && have_lib libjemalloc.so.2; } \
    && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing libgoogle-perftools4 and libjemalloc2 (for the preloaded-allocator tests)"
    { apt-get install -y -qq libgoogle-perftools4 libjemalloc2 \
        || { apt-get update -qq && apt-get install -y -qq libgoogle-perftools4 libjemalloc2; }; } >/dev/null 2>&1 \
        || say "could not install tcmalloc/jemalloc: the preloaded-allocator tests will skip"
fi

torch_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" 2>/dev/null; }
if ! torch_ok; then
    say "installing torch==$TORCH_VERSION into $VENV (about 1 minute, 4.6 GB)"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" || die "pip install torch==$TORCH_VERSION failed"
    torch_ok || die "torch $TORCH_VERSION did not import from $VENV"
fi
# The CUDA runtime and crt headers for memsight-integrations' CUDA shim (OOM observer, segments);
# without them that part is compiled out and reports absent.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -f "$site/nvidia/cu13/include/crt/host_config.h" ]; then
    say "installing nvidia-cuda-crt (CUDA 13.0 headers for the CUDA allocator shim)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nvidia-cuda-crt==13.0.88" \
        || say "could not install nvidia-cuda-crt: the CUDA OOM observer will be compiled out"
fi
say "torch $TORCH_VERSION ready in $VENV"
# maturin builds the wheel (`make wheel`; the install test of `make test`). Optional: without it that
# test skips, saying why.
MATURIN_VERSION="1.16.0"
if [ "$("$VENV/bin/maturin" --version 2>/dev/null)" != "maturin $MATURIN_VERSION" ]; then
    say "installing maturin==$MATURIN_VERSION (builds the wheel)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "maturin==$MATURIN_VERSION" \
        || say "could not install maturin: the wheel test will skip"
fi
# --- Python integrations (integrations/python): the frameworks its tests run for real. Optional:
# without them those tests skip, saying why. Pinned for torch 2.11 and Python 3.11.
PY_TEST_PINS=("transformers==5.23.0" "accelerate==1.15.0" "lightning==2.6.6" "memray==1.20.0")
py_pins_ok() {
    "$VENV/bin/python" - "${PY_TEST_PINS[@]}" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
except PackageNotFoundError:
    sys.exit(1)
PYEOF
}
if ! py_pins_ok; then
    say "installing ${PY_TEST_PINS[*]} (for the Python integration tests)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_TEST_PINS[@]}" \
        || say "could not install ${PY_TEST_PINS[*]}: the Python callback tests will skip"
fi
# --- end Python integrations
# The variables torch-sys reads (tch 0.24) — used by the libtorch crates.
echo "export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV=$VENV PATH=$VENV/bin:\$PATH"
