"""A small PyTorch training loop (an MLP on synthetic data, built in code) that changes its own
environment the way real jobs do, and records the truth to argv[1] (JSON): its pid, the optimizer
steps it took, the step at which it held a known block (`HOLD_MIB` MiB of tensor storage, allocated
after the forward of step `HOLD_STEP` and freed at its end), the allocator's own in-use bytes while the
block was held (tcmalloc's, jemalloc's or glibc's), and its own maximum resident size.

`ACTION` (environment) is done just before the first step:
- `closerange`: closes every descriptor above 2 (`os.closerange`), as daemonizing code does;
- `chdir`: changes the working directory to a new temporary one;
- `setsid`: starts a new session;
- `setuid`: drops to `nobody` (uid 65534) when root;
- `rlimit`: limits its address space (`RLIMIT_AS`) to its current size + `LIMIT_MIB` MiB, so the
  block at `HOLD_STEP` raises (a `RuntimeError` from PyTorch's allocator, or `MemoryError`); the
  job then exits 3 after recording the failure (with `RAISE` set, the error is raised again:
  exit 1 with a traceback).
`STEPS` (default 6), `HOLD_STEP` (3), `HOLD_MIB` (128), `STEP_SLEEP` (seconds, 0.05); `HOLD_IN=forward`
takes the block inside the model's forward instead (a forward hook of its ReLU), so a failure
happens in the forward phase.
"""
import ctypes
import json
import os
import resource
import sys
import tempfile
import time

import torch

truth_path = os.path.abspath(sys.argv[1])
steps = int(os.environ.get("STEPS", "6"))
hold_step = int(os.environ.get("HOLD_STEP", "3"))
hold_mib = int(os.environ.get("HOLD_MIB", "128"))
sleep = float(os.environ.get("STEP_SLEEP", "0.05"))
action = os.environ.get("ACTION", "")
torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("THREADS", "1")))


def allocator_in_use():
    """The in-use bytes by the allocator's own count: tcmalloc's or jemalloc's when one is loaded
    (their own statistics interface), else glibc's (heap_truth.py), plus memsight's sampled blocks."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import heap_truth

    me = ctypes.CDLL(None)
    if hasattr(me, "MallocExtension_GetNumericProperty"):
        v = ctypes.c_size_t(0)
        me.MallocExtension_GetNumericProperty(b"generic.current_allocated_bytes", ctypes.byref(v))
        return {"allocator": "tcmalloc", "in_use": v.value + heap_truth.sampled_mapped()}
    if hasattr(me, "mallctl"):
        epoch = ctypes.c_uint64(1)
        sz = ctypes.c_size_t(8)
        me.mallctl(b"epoch", None, None, ctypes.byref(epoch), sz)
        v = ctypes.c_size_t(0)
        me.mallctl(b"stats.allocated", ctypes.byref(v), ctypes.byref(sz), None, ctypes.c_size_t(0))
        return {"allocator": "jemalloc", "in_use": v.value + heap_truth.sampled_mapped()}
    return {"allocator": "glibc", "in_use": heap_truth.in_use()}


model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(512, 64)
labels = torch.randint(0, 10, (512,))
truth = {"pid": os.getpid(), "action": action}

if action == "closerange":
    os.closerange(3, 65536)
elif action == "chdir":
    os.chdir(tempfile.mkdtemp())
    truth["cwd"] = os.getcwd()
elif action == "setsid":
    os.setsid()
elif action == "setuid" and os.getuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
elif action == "rlimit":
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = size + int(os.environ.get("LIMIT_MIB", "64")) * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    truth["rlimit_as"] = limit

taken = 0
hold_in = os.environ.get("HOLD_IN", "")
current = {"step": 0, "block": None}


def take_block(step):
    """The known block of `hold_mib` MiB, or the recorded failure and exit 3 (raise with RAISE)."""
    try:
        return torch.ones(hold_mib << 18)  # float32: hold_mib MiB
    except (RuntimeError, MemoryError) as e:
        truth["failed"] = {"step": step, "in": hold_in or "between", "error": type(e).__name__,
                           "message": str(e)[:200]}
        truth["steps"] = taken
        with open(truth_path, "w") as f:
            json.dump(truth, f)
        print(f"step {step}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        if os.environ.get("RAISE"):
            raise
        sys.exit(3)


if hold_in == "forward":
    def hold_hook(module, inputs, output):
        if current["step"] == hold_step:
            current["block"] = take_block(current["step"])

    model[1].register_forward_hook(hold_hook)

for step in range(1, steps + 1):
    x = data[(step * 32) % 512:][:32]
    y = labels[(step * 32) % 512:][:32]
    current["step"] = step
    block = None
    out = model(x)
    if step == hold_step:
        block = current["block"] if hold_in == "forward" else take_block(step)
        current["block"] = None
        truth["held"] = {"step": step, "bytes": block.numel() * 4, "allocator": allocator_in_use()}
    loss = torch.nn.functional.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    taken += 1
    time.sleep(sleep)
    del block

truth["steps"] = taken
truth["maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open(truth_path, "w") as f:
    json.dump(truth, f)
print("done", taken, flush=True)
