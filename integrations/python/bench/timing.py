"""The timed loop both workloads share, and the one line the driver (overhead.py) parses."""

import statistics
import time


def time_and_report(name, runs, one):
    """Calls ``one(i)`` for i in range(runs), timing each, and prints the ``BENCH`` line."""
    times = []
    t_loop = time.perf_counter()
    for i in range(runs):
        t0 = time.perf_counter()
        one(i)
        times.append(time.perf_counter() - t0)
    loop = time.perf_counter() - t_loop
    print(
        f"BENCH {name} median_s={statistics.median(times):.9f} min_s={min(times):.9f} "
        f"loop_s={loop:.9f} steps={runs}",
        flush=True,
    )
