# The two commands of the README: `make demo` and `make test`. Everything else is optional.
.PHONY: demo test setup build lint bench fuzz clean wheel

CARGO ?= cargo
OUT ?= out
# libtorch for tch 0.24: the torch==2.11.0 wheel that scripts/setup.sh installs in this venv.
MEMSIGHT_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/memsight
export MEMSIGHT_CACHE
export LIBTORCH_USE_PYTORCH := 1
export VIRTUAL_ENV := $(MEMSIGHT_CACHE)/torch-2.11.0
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)

setup:
	@scripts/setup.sh >/dev/null

# The preloaded library (memsight in Python and C++ jobs) is a workspace of its own: built with the
# main one, `memsight` would carry jemalloc's malloc family, which it must not (profiler/preload).
PRELOAD = --manifest-path profiler/preload/Cargo.toml --target-dir target/preload
# Its thread-locals (the counters read by every malloc and free) use the initial-exec TLS model: the
# default model for a shared library calls __tls_get_addr, which glibc lets allocate (to grow a
# thread's TLS table after dlopen) — through this very malloc. Stable rustc takes -Z flags only
# with RUSTC_BOOTSTRAP, set for this build alone.
PRELOAD_ENV = RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Z tls-model=initial-exec"

build: setup
	$(PRELOAD_ENV) $(CARGO) build --release $(PRELOAD)
	$(CARGO) build --release --workspace --all-targets

# The main job under memsight. Its last line is the path of the report it wrote.
demo: build
	@mkdir -p $(OUT)
	@scripts/demo.sh $(OUT)

test: build lint
	$(CARGO) test --release --workspace --no-fail-fast

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt $(subst --target-dir target/preload,,$(PRELOAD)) -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(PRELOAD_ENV) $(CARGO) clippy --release $(PRELOAD) -- -D warnings

# The wheel users install (`pip install out/wheels/memsight-*.whl`): the `memsight` command, with the
# preloaded library built into it (tui/build.rs), and the Python package. Built in a target
# directory of its own (the command alone: not the workspace's features), as the install test does.
wheel: setup
	cd integrations/python && CARGO_TARGET_DIR=$(CURDIR)/target/install \
		MEMSIGHT_PRELOAD_TARGET_DIR=$(CURDIR)/target/preload \
		$(VIRTUAL_ENV)/bin/maturin build --release --out $(abspath $(OUT))/wheels

# Allocator overhead vs bare jemalloc, glibc malloc, heaptrack and dhat-rs (prints a ratio table),
# the sampler's cost per snapshot, and the sidecar's CPU and effect on step time.
bench: setup
	@command -v heaptrack >/dev/null || (apt-get update -qq && apt-get install -y -qq heaptrack >/dev/null)
	$(CARGO) build --release -p memsight-bench -p memsight-bench-system
	$(CARGO) build --release -p memsight-tui
	$(CARGO) build --release -p memsight --examples
	./target/release/sampler-bench
	./target/release/alloc-bench 21
	./target/release/alloc-ab 100 5
	./target/release/frame-bench
	./target/release/sidecar-bench
	./target/release/helper-bench
	$(PRELOAD_ENV) $(CARGO) build --release $(PRELOAD)
	$(VIRTUAL_ENV)/bin/python integrations/python/bench/overhead.py

# A million executions of each fuzz target (report, budget, ring, socket stream, heap profile),
# with overflow checks and debug assertions; `make test` runs a short run of each. docs/reliability.md.
fuzz:
	$(CARGO) build --profile fuzz -p memsight-fuzz --bin fuzz-parsers
	./target/fuzz/fuzz-parsers all 1000000

clean:
	$(CARGO) clean
	rm -rf $(OUT)
