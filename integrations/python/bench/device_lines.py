"""What reading the device memory by line and Python's arenas costs, on this machine's CPU.

A benchmark driver, not a test. Without a GPU, ``torch.cuda.memory._snapshot()`` itself (PyTorch
copying its history into Python) and the history's recording (PyTorch: about 2 µs per allocation
with Python stacks) cannot be timed here; what memsight adds on top can:

- the attribution (memsight/_device_lines.py) of a snapshot in PyTorch's format whose history holds
  ``--entries`` actions of a training loop (tests/cuda_snapshot.py's allocator, with Python stacks
  ``--depth`` frames deep), at the peak (the history replayed) and at an OOM: median ms per read
  and ns per history entry;
- one read of Python's small-object arenas (memsight/_pymalloc.py) with 2, ~100 and ~1000 arenas
  allocated: median µs per read.

    $VENV/bin/python integrations/python/bench/device_lines.py [--rounds 7] [--entries 100000]
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

import cuda_snapshot as cs  # noqa: E402

from memsight import _device_lines as dl  # noqa: E402
from memsight import _pymalloc  # noqa: E402


def history(entries, depth):
    """An allocator whose history holds about ``entries`` actions: a loop of steps allocating and
    freeing activations under stacks ``depth`` frames deep (the same frame dicts reused, as
    PyTorch's symbolizer shares them per traceback)."""
    a = cs.Allocator()
    a.recording = True
    stacks = []
    for k in range(64):
        frames = [cs.frame(cs.TORCH + "/nn/modules/module.py", 1784 + i, "_call_impl") for i in range(depth - 2)]
        stacks.append([cs.frame(cs.TORCH + "/nn/functional.py", 2000 + k, "op")] + frames
                      + [cs.frame(cs.TRAIN, 300, "<module>")])
    params = [a.alloc(32 * cs.MIB, cs.to_device(210)) for _ in range(8)]
    step = 0
    while len(a.trace) < entries:
        live = [a.alloc((1 + (i % 7)) * cs.MIB, stacks[(i + step) % len(stacks)]) for i in range(200)]
        for x in live:
            a.free(x)
        step += 1
    del params
    return a


def median_time(fn, rounds):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--depth", type=int, default=24)
    args = ap.parse_args()

    a = history(args.entries, args.depth)
    snap = a.snapshot(max_entries=args.entries)
    n = len(snap["device_traces"][0])
    print("device lines: %d history entries, stacks %d frames deep" % (n, args.depth))
    for moment in ("peak", "oom"):
        t = median_time(lambda: dl.device_lines(snap, 0, moment, library_paths=cs.LIBRARY_PATHS), args.rounds)
        print("  %-4s  median %8.1f ms per read  %6.0f ns per entry" % (moment, t * 1e3, t * 1e9 / n))

    print("Python arenas (one read of _PyObject_DebugMallocStats):")
    held = []
    for target in (0, 100, 1000):
        while (_pymalloc.stats() or {}).get("arenas", 0) < target:
            held.append([object() for _ in range(65536)])
        s = _pymalloc.stats()
        if s is None:
            print("  no pymalloc in this interpreter")
            return
        t = median_time(_pymalloc.stats, args.rounds)
        print("  %5d arenas (%7.1f MiB)  median %8.1f us per read" % (s["arenas"], s["bytes"] / 2**20, t * 1e6))


if __name__ == "__main__":
    main()
