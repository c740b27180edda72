"""A job whose `multiprocessing.Pool` (the `spawn` context, as on macOS and in CUDA jobs) computes in
two workers, each holding a known block (`WORKER_MIB`, default 40 and 80 MiB, every page touched),
and is left by its `with` block, which terminates the workers (SIGTERM) — the usual end of a pool.
Records the truth to argv[1] (JSON): each worker's pid, the MiB it held, and its exit code as
`multiprocessing` saw it (negative: killed by that signal). Exits 0; with `THEN_EXIT=N`, waits
half a second after the pool ended (its workers' ends are seen first) and exits N, as a job whose
evaluation fails after its pool did its work.
"""
import json
import multiprocessing as mp
import os
import sys
import time


def hold(mib):
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(0.5)
    return os.getpid(), mib


def main():
    ctx = mp.get_context("spawn")
    sizes = [int(s) for s in os.environ.get("WORKER_MIB", "40,80").split(",")]
    with ctx.Pool(len(sizes)) as pool:
        workers = list(pool._pool)
        held = pool.map(hold, sizes, chunksize=1)
    for w in workers:
        w.join(30)
    codes = {w.pid: w.exitcode for w in workers}
    truth = {
        "workers": [{"pid": pid, "mib": mib, "exit": codes.get(pid)} for pid, mib in held],
    }
    with open(sys.argv[1], "w") as f:
        json.dump(truth, f)
    print("pool done:", truth)
    code = int(os.environ.get("THEN_EXIT", "0"))
    if code:
        time.sleep(0.5)
        sys.exit(code)


if __name__ == "__main__":
    main()
