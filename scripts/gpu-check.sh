#!/usr/bin/env bash
# Runs every CUDA path of memsight on a machine with an NVIDIA GPU and PyTorch (docs/gpu.md).
# Built elsewhere, carried there: `scripts/gpu-check.sh BIN OUT [PART…]` where BIN holds
# `memsight`, `memsight-gpt`, `gpu-test` (integrations/tests/gpu.rs built with --no-run),
# `varying_batch` (integrations/examples), optionally debs/ (tmux for the viewer capture) and, for
# the candle part, `candle-probe` (integrations/candle-probe) and `deps/cupti_jobs` (tests/tests/
# cupti_jobs.rs built with --no-run; it finds memsight at BIN/memsight and the preloaded library at
# BIN/../preload/release).
# PARTs (default: all): env stats ablation oom segments shared viewer cupti candle torchcupti pytorch
# pyviewer.
# libtorch comes from the machine's PyTorch (same version as the build's, 2.11.0).
set -uo pipefail
bin="$(cd "$1" && pwd)"; out="$2"; shift 2
parts="${*:-env stats ablation oom segments shared viewer cupti candle torchcupti pytorch pyviewer}"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
py="${PYTHON:-$(command -v python3)}"
torchlib="$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$torchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VIRTUAL_ENV="$(dirname "$(dirname "$py")")"
export MEMSIGHT_QUIET=1
say() { echo "== $* ($(date -u +%T))"; }
has() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }
# tmux for the viewer captures: unpacked from BIN/debs where the machine has none.
tmux_from_debs() {
    if [ -d "$bin/debs" ] && ! command -v tmux >/dev/null; then
        for d in "$bin"/debs/*.deb; do dpkg -x "$d" /tmp/tmuxroot; done
        export PATH="/tmp/tmuxroot/usr/bin:$PATH" LD_LIBRARY_PATH="/tmp/tmuxroot/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
    fi
}
gpt=("$bin/memsight-gpt" train --quiet --device cuda --preset gpt2 --block-size 2048 --eval-every 0)

if has env; then
    say env
    { date -u; nvidia-smi; "$py" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'; } \
        >"$out/env.txt" 2>&1
    head -20 "$out/env.txt"
fi

if has stats; then
    # memsight's allocator numbers vs torch.cuda.memory_stats(), OOM event, NVML, cudarc.
    say "stats: integrations/tests/gpu.rs"
    timeout 180 "$bin/gpu-test" --nocapture --test-threads 1 >"$out/gpu-test.log" 2>&1
    echo "gpu-test exit $?"; grep -E "memsight|torch.cuda|OOM event|NVML|cudarc|test result|SKIP|panicked" "$out/gpu-test.log" | cut -c1-600
fi

if has ablation; then
    # Device-memory ablation at S=2048 (GPT-2 124M's widths, byte vocabulary), 10 steps a row.
    say "ablation: gpt2 shape, S=2048, batch 8"
    timeout "${ABLATE_TIMEOUT:-540}" "$bin/memsight-gpt" ablate --device cuda --preset gpt2 --steps 10 --out "$out/ablation" \
        -- --block-size 2048 --batch-size 8 >"$out/ablation.log" 2>&1
    echo "ablate exit $?"; tail -5 "$out/ablation.log"
    cat "$out/ablation/ablation.md" 2>/dev/null
fi

if has oom; then
    # A forced CUDA OOM (naive attention at batch 64, S=2048): post-mortem, then the same message
    # through `memsight diagnose`.
    say "oom: batch 64 under memsight run"
    timeout 120 "$bin/memsight" run --report "$out/oom.json" -- "${gpt[@]}" --attention naive --batch-size 64 --steps 2 \
        >"$out/oom.log" 2>&1
    echo "run exit $?"; tail -40 "$out/oom.log" | cut -c1-400
    "$bin/memsight" diagnose "$out/oom.log" >"$out/oom-diagnose.txt" 2>&1; echo "diagnose exit $?"
    "$bin/memsight" diagnose --report "$out/oom.json" >"$out/oom-diagnose-report.txt" 2>&1; echo "diagnose --report exit $?"
    head -30 "$out/oom-diagnose.txt"; echo "-- from the report:"; head -30 "$out/oom-diagnose-report.txt"
fi

if has segments; then
    # Varying batch sizes, default allocator vs expandable segments.
    for conf in default expandable_segments:True; do
        say "segments: $conf"
        if [ "$conf" = default ]; then unset PYTORCH_CUDA_ALLOC_CONF; else export PYTORCH_CUDA_ALLOC_CONF="$conf"; fi
        timeout 120 "$bin/memsight" run --report "$out/segments-${conf%%:*}.json" -- "$bin/varying_batch" 300 "$out/segments-${conf%%:*}.job.json" \
            >"$out/segments-${conf%%:*}.log" 2>&1
        echo "exit $?"; grep '^{' "$out/segments-${conf%%:*}.log"
        "$bin/memsight" check "$out/segments-${conf%%:*}.json" --max-device-fragmentation 0.2 2>&1 | head -5
    done
    unset PYTORCH_CUDA_ALLOC_CONF
fi

if has shared; then
    # Two jobs on one GPU: NVML per-process memory, the device-shared tip, then `memsight plan`.
    say "shared: two jobs on one GPU"
    "$bin/memsight" run --report "$out/shared-a.json" -- "${gpt[@]}" --attention naive --batch-size 4 --steps 40 >"$out/shared-a.log" 2>&1 &
    a=$!
    "$bin/memsight" run --report "$out/shared-b.json" -- "${gpt[@]}" --attention efficient --batch-size 4 --steps 40 >"$out/shared-b.log" 2>&1 &
    b=$!
    sleep 8; nvidia-smi --query-compute-apps=pid,used_memory --format=csv >"$out/shared-nvidia-smi.txt" 2>&1
    wait $a; echo "job a exit $?"; wait $b; echo "job b exit $?"
    cat "$out/shared-nvidia-smi.txt"
    for r in a b; do
        "$bin/memsight" summary --format markdown "$out/shared-$r.json" >"$out/shared-$r.md" 2>&1
        grep -iE "device|GPU|shared" "$out/shared-$r.md" | head -12
    done
    "$bin/memsight" plan --gpus 1 --gpu-memory 80GiB "$out/shared-a.json" "$out/shared-b.json" 2>&1 | tee "$out/plan.txt"
    "$bin/memsight" plan --gpus 1 --gpu-memory 80GiB "$out/shared-a.json" "$out/shared-a.json" "$out/shared-a.json" "$out/shared-b.json" 2>&1 | tee -a "$out/plan.txt"
    "$bin/memsight" plan --gpus 1 --gpu-memory 80GiB "$out/shared-a.json" "$out/shared-a.json" "$out/shared-a.json" "$out/shared-a.json" "$out/shared-b.json" 2>&1 | tee -a "$out/plan.txt"
fi

if has viewer; then
    # The live viewer's Devices screen during a CUDA run, captured with tmux.
    say viewer
    tmux_from_debs
    if command -v tmux >/dev/null; then
        export TERM=xterm-256color
        tmux new-session -d -s v -x 160 -y 45 "env LD_LIBRARY_PATH=$LD_LIBRARY_PATH $bin/memsight run --live --report $out/viewer.json -- ${gpt[*]} --attention naive --batch-size 4 --steps 200"
        sleep 9; tmux send-keys -t v 4; sleep 3
        tmux capture-pane -p -t v >"$out/viewer-devices.txt"
        tmux send-keys -t v 1; sleep 2; tmux capture-pane -p -t v >"$out/viewer-overview.txt"
        tmux kill-server 2>/dev/null
        cat "$out/viewer-devices.txt"
    else
        echo "SKIP viewer capture: no tmux"
    fi
fi
if has cupti; then
    # CUPTI's count of the driver allocations vs libtorch's own reserved bytes in one training run.
    say "cupti: driver-level vs caching-allocator figures"
    "$bin/memsight" run --report "$out/cupti.json" -- "${gpt[@]}" --attention sdpa --batch-size 8 --steps 10 \
        >"$out/cupti.log" 2>&1; echo "exit $?"
    "$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); [print(d["backend"], {k: v for k, v in d.items() if k.endswith("bytes")}) for d in r["devices"]]' "$out/cupti.json"
fi
if has candle; then
    # An unmodified candle training program under `memsight run --cupti`: its device memory through
    # CUPTI (CUDA's injection interface loads the preloaded library), then the e2e test on it.
    say "candle: memsight run --cupti"
    cu13="$(cd "$torchlib/../../nvidia/cu13/lib" && pwd)"   # libcupti, libcublas, libcurand
    LD_LIBRARY_PATH="$cu13:$LD_LIBRARY_PATH" timeout 180 "$bin/memsight" run --cupti --interval 50ms \
        --report "$out/candle.json" -- "$bin/candle-probe" --steps 30 >"$out/candle.log" 2>&1
    echo "exit $?"; head -3 "$out/candle.log"; tail -4 "$out/candle.log"
    "$py" - "$out/candle.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print([s for s in r["sources"] if s["name"] == "cupti"])
print(r["devices"])
rows = [(s["t_ms"], d["reserved_bytes"] >> 20) for s in r["timeline"] for d in s.get("devices", []) if d["backend"] == "cupti"]
print("t_ms:MiB", " ".join(f"{t}:{m}" for t, m in rows))
PY
    LD_LIBRARY_PATH="$cu13:$LD_LIBRARY_PATH" MEMSIGHT_CANDLE_PROBE="$bin/candle-probe" timeout 240 "$bin/deps/cupti_jobs" --nocapture --test-threads 1 2>&1 | tail -12
fi
if has torchcupti; then
    # An unmodified PyTorch script under `memsight run --cupti`: CUPTI's count against what PyTorch
    # says it reserved.
    say "torchcupti: memsight run --cupti -- python"
    cu13="$(cd "$torchlib/../../nvidia/cu13/lib" && pwd)"
    cat >"$out/torch_job.py" <<'PY'
import torch
kept = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (256, 64, 512)]
del kept[1]
x = torch.randn(4096, 4096, device="cuda"); y = x @ x; torch.cuda.synchronize()
print("torch max_memory_reserved", torch.cuda.max_memory_reserved(), "memory_reserved", torch.cuda.memory_reserved())
PY
    LD_LIBRARY_PATH="$cu13:$LD_LIBRARY_PATH" timeout 120 "$bin/memsight" run --cupti --report "$out/torch-cupti.json" -- "$py" "$out/torch_job.py" 2>&1 | tail -3
    "$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); print([s for s in r["sources"] if s["name"]=="cupti"], r["devices"])' "$out/torch-cupti.json"
fi
if has pytorch; then
    # A PyTorch script marked with `import memsight` (steps, phases, memsight.torch.install()) under
    # `memsight run` until a forced CUDA OOM: the Python backend's figures against
    # torch.cuda.memory_stats() from the same process, the post-mortem, and `diagnose` on its log.
    say "pytorch: memsight.torch on CUDA, forced OOM"
    cat >"$out/pytorch_job.py" <<'PY'
import json, time, torch, memsight, memsight.torch
print("install", memsight.torch.install(interval=0.05))
model = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096)).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(8):
    memsight.step(step)
    with memsight.phase("forward"):
        loss = model(torch.randn(256 << (step // 2), 4096, device="cuda")).square().mean()
    with memsight.phase("backward"):
        loss.backward()
    with memsight.phase("optimizer"):
        opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
s = torch.cuda.memory_stats()
keys = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.current",
        "reserved_bytes.all.current", "inactive_split_bytes.all.current", "num_alloc_retries", "num_ooms"]
print("STATS " + json.dumps({k: s[k] for k in keys}), flush=True)
time.sleep(0.5)
memsight.step(8)
with memsight.phase("forward"):
    big = torch.empty(200 << 30, dtype=torch.uint8, device="cuda")
PY
    timeout 120 "$bin/memsight" run --interval 50ms --report "$out/pytorch.json" -- "$py" "$out/pytorch_job.py" >"$out/pytorch.log" 2>&1
    echo "exit $?"; grep -E "^install|^STATS|memsight ·|OutOfMemoryError" "$out/pytorch.log" | cut -c1-600
    "$py" - "$out/pytorch.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("sources", [(s["name"], s["available"]) for s in r["sources"]])
print("devices", r.get("devices"))
print("device_ooms", r.get("device_ooms"))
last = [s for s in r["timeline"] if s.get("devices")]
print("last device sample", last[-1]["devices"] if last else None)
print("phases", [(p.get("name"), {k: v for k, v in p.items() if "device" in k or "tensor" in k}) for p in r.get("phases", [])][:6])
PY
    "$bin/memsight" diagnose "$out/pytorch.log" 2>&1 | head -12
fi
if has pyviewer; then
    # The live viewer during a PyTorch CUDA job marked with `import memsight`, captured with tmux at
    # 160x45 and 80x24 (Overview and Devices), then the report's SVG summary with its OOM marker.
    say "pyviewer: live viewer on a CUDA job, SVG summary"
    tmux_from_debs
    cat >"$out/viewer_job.py" <<'PY'
import time, torch, memsight, memsight.torch
memsight.torch.install(interval=0.05)
model = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096)).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(60):
    memsight.step(step)
    with memsight.phase("train/forward"):
        loss = model(torch.randn(256 << (step // 15), 4096, device="cuda")).square().mean()
    with memsight.phase("train/backward"):
        loss.backward()
    with memsight.phase("train/optimizer"):
        opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); time.sleep(0.15)
memsight.step(60)
with memsight.phase("train/forward"):
    big = torch.empty(200 << 30, dtype=torch.uint8, device="cuda")
PY
    if command -v tmux >/dev/null; then
        export TERM=xterm-256color
        for size in 160x45 80x24; do
            tmux new-session -d -s v -x "${size%x*}" -y "${size#*x}" "env LD_LIBRARY_PATH=$LD_LIBRARY_PATH $bin/memsight run --live --interval 50ms --report $out/viewer-$size.json -- $py $out/viewer_job.py; sleep 30"
            sleep 14; tmux capture-pane -p -t v >"$out/viewer-$size-overview.txt"
            tmux send-keys -t v 4; sleep 2; tmux capture-pane -p -t v >"$out/viewer-$size-devices.txt"
            tmux send-keys -t v 2; sleep 2; tmux capture-pane -p -t v >"$out/viewer-$size-phases.txt"
            tmux kill-server 2>/dev/null; sleep 1
        done
        cat "$out/viewer-160x45-overview.txt" "$out/viewer-80x24-overview.txt"
    else
        echo "SKIP viewer capture: no tmux"
    fi
    timeout 120 "$bin/memsight" run --interval 50ms --report "$out/pyviewer.json" -- "$py" "$out/viewer_job.py" >"$out/pyviewer.log" 2>&1
    "$bin/memsight" summary --format svg "$out/pyviewer.json" -o "$out/pyviewer.svg"; echo "svg exit $?"
fi
say done
