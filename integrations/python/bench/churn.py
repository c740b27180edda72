"""Python allocation churn, timed inside the process (a workload of overhead.py).

Builds and drops lists, dicts and bytes of mixed sizes with a sliding window of live objects
(fixed seed). Small objects are served by pymalloc; bytes over 512 B, list item arrays over 512 B
(> 64 items) and dict tables of more than a few dozen keys go to the C allocator (glibc's malloc),
which is what a preloaded library or memray's default mode sees. Prints one parseable line:

    BENCH churn median_s=<median chunk> min_s=<fastest chunk> loop_s=<all chunks> steps=<chunks>
"""

import argparse
import random

from timing import time_and_report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--per-chunk", type=int, default=20000)
    ap.add_argument("--window", type=int, default=2000)
    args = ap.parse_args()

    rng = random.Random(0)
    # Sizes chosen per operation from a fixed table: the same sequence in every run.
    byte_sizes = [16, 48, 200, 480, 600, 1500, 4096, 16384, 70000]
    list_lens = [4, 16, 60, 100, 400, 2000]
    dict_lens = [4, 10, 40, 200]
    plan = [(rng.randrange(3), rng.randrange(9), rng.randrange(6), rng.randrange(4))
            for _ in range(4096)]
    window = [None] * args.window

    def chunk(base: int) -> None:
        for i in range(args.per_chunk):
            kind, b, l, d = plan[(base + i) & 4095]
            if kind == 0:
                obj = bytes(byte_sizes[b])
            elif kind == 1:
                obj = list(range(list_lens[l]))
            else:
                obj = {k: k for k in range(dict_lens[d])}
            window[(base + i) % args.window] = obj
            # Transient churn too: a short string and a tuple that die at once.
            s = str(i) + "x"
            t = (s, i, obj)
            del s, t

    chunk(0)  # warm-up: fills the window
    time_and_report("churn", args.chunks, lambda i: chunk((i + 1) * args.per_chunk))


if __name__ == "__main__":
    main()
