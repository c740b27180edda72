"""Overhead of memsight's preloaded library on Python jobs, side by side with memray's.

A benchmark driver, not a test. Runs two workloads of this directory — `train_step.py` (a small
PyTorch CPU training step) and `churn.py` (Python list/dict/bytes churn) — under each mode below,
interleaved: every round runs every mode once, in forward order on even rounds and backward order
on odd ones (ABC…CBA…), so the drift of a shared machine falls on all modes alike.

Modes:
  plain          python script
  memsight       memsight run --report <tmp> -- python script   (preload + session + sidecar)
  preload        LD_PRELOAD=<lib> MEMSIGHT_REPORT=<tmp> MEMSIGHT_RING=off MEMSIGHT_QUIET=1
                 (the library and its session with sampler thread, no sidecar, no ring)
  preload-count  LD_PRELOAD=<lib> only: the malloc wrapper counting, no session at all
  memray         memray run -o <tmp>.bin script (default: hooks the C allocator, Python stacks)
  memray-native  memray run --native (also unwinds the native stack of every allocation)
  memray-pymalloc memray run --trace-python-allocators (also records every pymalloc allocation)

Two figures per run: the time measured inside the script (the median step of train_step.py, the
median chunk of churn.py: start-up excluded) and the whole process's wall time (start-up, import
of torch, tracker start and the report or capture file written at exit). The table shows, per mode,
the minimum and median over rounds, the ratio of minimums to plain's, and the median of the
per-round ratios (each mode against plain of the same round).

    $VENV/bin/python integrations/python/bench/overhead.py [--rounds 7] [--only train_step,churn]
        [--modes plain,memsight,...]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LIB = ROOT / "target/preload/release/libmemsight_preload.so"
MEMSIGHT = ROOT / "target/release/memsight"
PY = sys.executable

WORKLOADS = {
    "train_step": ["--warmup", "20", "--steps", "150"],
    "churn": ["--chunks", "10"],
}
MODES = ["plain", "memsight", "preload", "preload-count", "memray", "memray-native",
         "memray-pymalloc"]
LINE = re.compile(r"^BENCH \S+ median_s=(\S+) min_s=(\S+) loop_s=(\S+)", re.M)


def command(mode: str, script: Path, args: list[str], tmp: Path) -> tuple[list[str], dict]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    job = [PY, str(script), *args]
    memray = [PY, "-m", "memray", "run", "-q", "-f", "-o", str(tmp / "memray.bin")]
    if mode == "plain":
        return job, env
    if mode == "memsight":
        return [str(MEMSIGHT), "run", "--report", str(tmp / "memsight.json"), "--", *job], env
    if mode == "preload":
        env.update(LD_PRELOAD=str(LIB), MEMSIGHT_REPORT=str(tmp / "preload.json"),
                   MEMSIGHT_RING="off", MEMSIGHT_QUIET="1")
        return job, env
    if mode == "preload-count":
        env["LD_PRELOAD"] = str(LIB)
        return job, env
    if mode == "memray":
        return [*memray, str(script), *args], env
    if mode == "memray-native":
        return [*memray, "--native", str(script), *args], env
    if mode == "memray-pymalloc":
        return [*memray, "--trace-python-allocators", str(script), *args], env
    raise ValueError(mode)


def run_once(mode: str, name: str, tmp: Path) -> tuple[float, float]:
    cmd, env = command(mode, HERE / f"{name}.py", WORKLOADS[name], tmp)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"{mode} {name} failed (rc {p.returncode}):\n{p.stdout}\n{p.stderr}")
    return float(m.group(1)), wall


def table(name: str, res: dict[str, list[tuple[float, float]]], modes: list[str]) -> str:
    base = res["plain"]
    out = [f"\n{name}: in-script = median {'step' if name == 'train_step' else 'chunk'}; "
           f"wall = whole process ({len(base)} rounds)",
           f"| mode | in-script min | median | ratio (mins) | ratio (median of rounds) "
           f"| wall min | median | ratio (mins) | ratio (median of rounds) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in modes:
        r = res[mode]
        cells = [mode]
        for k in (0, 1):
            xs = [x[k] for x in r]
            bs = [b[k] for b in base]
            per_round = [x / b for x, b in zip(xs, bs)]
            unit = 1e3 if k == 0 else 1.0
            fmt = "{:.3f} ms" if k == 0 else "{:.2f} s"
            cells += [fmt.format(min(xs) * unit), fmt.format(statistics.median(xs) * unit),
                      f"{min(xs) / min(bs):.3f}×", f"{statistics.median(per_round):.3f}×"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    modes = args.modes.split(",")
    if "plain" not in modes:
        modes.insert(0, "plain")
    for need, what in ((LIB, "the preloaded library"), (MEMSIGHT, "memsight")):
        if not need.exists():
            sys.exit(f"{what} not found at {need}: run `make build` first")
    if any(m.startswith("memray") for m in modes):
        try:
            import memray  # noqa: F401
        except ImportError:
            sys.exit("memray is not installed in this Python (pip install memray)")
    print(f"python {sys.version.split()[0]}; load {os.getloadavg()}; {os.cpu_count()} cpus",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="memsight-bench-") as d:
        tmp = Path(d)
        for name in args.only.split(","):
            res: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
            for r in range(args.rounds):
                order = modes if r % 2 == 0 else modes[::-1]
                for mode in order:
                    inside, wall = run_once(mode, name, tmp)
                    res[mode].append((inside, wall))
                    print(f"  {name} round {r} {mode}: {inside * 1e3:.3f} ms inside, "
                          f"{wall:.2f} s wall", file=sys.stderr, flush=True)
            print(table(name, res, modes), flush=True)
    print(f"load after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
