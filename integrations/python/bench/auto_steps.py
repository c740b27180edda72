"""Cost of the automatic PyTorch steps and phases (memsight/_auto.py) on a real training step.

A benchmark driver, not a test. Runs nanoGPT's unmodified ``train.py`` (tests/tests/python_jobs/
nanogpt, on random tokens written to a scratch directory) under ``memsight run`` with the automatic
steps and phases on, and with ``--no-auto-steps``, interleaved (ABBA…), and compares nanoGPT's own
per-iteration times (``iter N: … time X ms``; the first iterations and those after an evaluation are
left out). Prints, per mode, the median step over rounds and the median of per-round ratios.

    $VENV/bin/python integrations/python/bench/auto_steps.py [--rounds 7] [--iters 60]
        [--model small|tiny] [--in-process]

``--in-process`` measures inside one process instead (no start-up, no machine drift between
processes): nanoGPT's model and optimizer step (the same loop body as train.py: forward, backward,
optimizer step, zero_grad) in blocks of steps with the hooks installed and removed in turn
(``memsight._auto``'s ``install``/``remove``), under ``memsight run`` for its session.
"""

import argparse
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NANOGPT = ROOT / "tests/tests/python_jobs/nanogpt"
MEMSIGHT = ROOT / "target/release/memsight"

MODELS = {
    # nanoGPT's README CPU command ("baby GPT" on a laptop), as it stands.
    "small": ["--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128"],
    # The test's configuration: many modules, little arithmetic (the hooks' worst case).
    "tiny": ["--block_size=32", "--batch_size=4", "--n_layer=2", "--n_head=2", "--n_embd=64"],
}


def scratch():
    d = Path(tempfile.mkdtemp(prefix="memsight-auto-bench-"))
    for f in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / f, d / f)
    (d / "config").mkdir()
    shutil.copy(NANOGPT / "config/train_shakespeare_char.py", d / "config")
    data = d / "data/shakespeare_char"
    data.mkdir(parents=True)
    import numpy as np

    rng = np.random.default_rng(0)
    for name, n in (("train", 200_000), ("val", 20_000)):
        rng.integers(0, 65, n, dtype=np.uint16).tofile(data / ("%s.bin" % name))
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 65}, f)
    return d


def one_run(d, auto, iters, model):
    cmd = [str(MEMSIGHT), "run", "--report", str(d / "r.json")]
    if not auto:
        cmd.append("--no-auto-steps")
    cmd += ["--", sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
            "--compile=False", "--eval_iters=2", "--log_interval=1", "--dropout=0.0",
            "--max_iters=%d" % iters, "--lr_decay_iters=%d" % iters,
            "--eval_interval=%d" % (iters + 1)] + MODELS[model]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, check=True).stdout
    times = [float(m.group(2)) for m in re.finditer(r"^iter (\d+): .*time ([0-9.]+)ms", out, re.M)
             if int(m.group(1)) >= 5]
    return statistics.median(times)


def in_process(rounds, model):
    """The in-process A/B; runs in the job that `memsight run` started (see main)."""
    import time

    import torch

    import memsight
    from memsight import _auto

    sys.path.insert(0, str(NANOGPT))
    from model import GPT, GPTConfig

    flags = dict(a.split("=", 1) for a in (m[2:] for m in MODELS[model]))
    cfg = GPTConfig(block_size=int(flags["block_size"]), vocab_size=65, n_layer=int(flags["n_layer"]),
                    n_head=int(flags["n_head"]), n_embd=int(flags["n_embd"]), dropout=0.0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = GPT(cfg)
    opt = net.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    batch = int(flags["batch_size"])
    x = torch.randint(0, 65, (batch, cfg.block_size))

    def steps(n):
        t = []
        for _ in range(n):
            t0 = time.perf_counter()
            _, loss = net(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t.append(time.perf_counter() - t0)
        return statistics.median(t) * 1000

    steps(10)
    on, off, ratios = [], [], []
    for r in range(rounds):
        got = {}
        for auto in ([True, False] if r % 2 == 0 else [False, True]):
            state = _auto.install(torch, memsight._lib, {"steps": False, "phases": False}) if auto else None
            got[auto] = steps(40)
            if state is not None:
                state.remove()
        on.append(got[True])
        off.append(got[False])
        ratios.append(got[True] / got[False])
        print("round %d: auto %.3f ms, off %.3f ms, ratio %.4f" % (r, got[True], got[False], ratios[-1]),
              file=sys.stderr)
    print("| nanoGPT %s in one process, median step (ms) | auto steps off | auto steps on | median per-round ratio |"
          % model)
    print("|---|---:|---:|---:|")
    print("| %d rounds × 40 steps | %.3f | %.3f | %.4f× |" % (
        rounds, statistics.median(off), statistics.median(on), statistics.median(ratios)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--model", choices=sorted(MODELS), default="small")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inside:
        return in_process(a.rounds, a.model)
    if a.in_process:
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        with tempfile.TemporaryDirectory() as t:
            subprocess.run([str(MEMSIGHT), "run", "--no-auto-steps", "--report", os.path.join(t, "r.json"),
                            "--", sys.executable, __file__, "--inside", "--rounds", str(a.rounds),
                            "--model", a.model], env=env, check=True)
        return
    d = scratch()
    rows = {"auto": [], "off": []}
    ratios = []
    try:
        for r in range(a.rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            got = {}
            for auto in order:
                got[auto] = one_run(d, auto, a.iters, a.model)
            rows["auto"].append(got[True])
            rows["off"].append(got[False])
            ratios.append(got[True] / got[False])
            print("round %d: auto %.2f ms, off %.2f ms, ratio %.3f"
                  % (r, got[True], got[False], ratios[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("| nanoGPT %s, median step (ms) | auto steps off | auto steps on | median per-round ratio |"
          % a.model)
    print("|---|---:|---:|---:|")
    print("| %d rounds × %d iterations | %.2f | %.2f | %.3f× |" % (
        a.rounds, a.iters, statistics.median(rows["off"]), statistics.median(rows["auto"]),
        statistics.median(ratios)))


if __name__ == "__main__":
    main()
