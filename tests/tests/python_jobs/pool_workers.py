"""A job whose memory is in its workers: a `ProcessPoolExecutor` of two workers (`forkserver` or
`spawn`, argv[2]) holding 48 and 96 MiB at once (each holds its block until both hold theirs),
while the parent holds little. Records the truth to argv[1] (JSON): the parent's pid and, per
worker, its pid and the bytes it held."""
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def hold(mib, barrier):
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    barrier.wait(timeout=60)  # both workers hold their blocks now
    time.sleep(1.0)  # a few samples while they both do
    return os.getpid(), len(block)


if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[2])
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as ex:
            held = list(ex.map(hold, [48, 96], [barrier, barrier]))
    with open(sys.argv[1], "w") as f:
        json.dump({"parent": os.getpid(), "workers": held}, f)
    print("workers held", [b for _, b in held], flush=True)
