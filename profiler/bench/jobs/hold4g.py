# The sidecar benchmark's data-loader job (sidecar-bench --job hold4g): a parent that allocates
# and touches a dataset of GIB GiB (default 4), forks two DataLoader-style workers that keep it
# shared copy-on-write, and then runs for SECONDS (default 30): at 10 Hz each worker reads a slice
# of the dataset and builds a small batch (1 MiB, freed the next tick), and the parent does a
# "step" (an 8 MiB temporary). Imports torch when the interpreter has it, so the processes map
# what a PyTorch job maps. Usage: hold4g.py [SECONDS] [GIB]
import os
import sys
import time

try:
    import torch  # noqa: F401  (mapped, not used: the job's processes look like a PyTorch job's)
except ImportError:
    pass

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
gib = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
size = int(gib * (1 << 30))
dataset = bytearray(b"\x01") * size  # every page written: resident
end = time.time() + seconds


def worker(k):
    batch = None
    i = k
    while time.time() < end:
        off = (i * (37 << 20)) % (size - (1 << 20))
        batch = bytes(dataset[off : off + (1 << 20)])  # reads a slice: no copy-on-write
        i += 2
        time.sleep(0.1)
    del batch
    os._exit(0)


kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        worker(k)
    kids.append(pid)
step = 0
while time.time() < end:
    tmp = bytearray(8 << 20)
    tmp[:: 4096] = b"\x02" * len(tmp[:: 4096])
    del tmp
    step += 1
    time.sleep(0.1)
for p in kids:
    os.waitpid(p, 0)
print(f"hold4g: {step} steps, {gib} GiB held", flush=True)
