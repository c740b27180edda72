"""A CPU DDP training job (gloo), unmodified for memsight: no `import memsight`. Each rank holds a
known block at step 3 (rank r: (2 + r) × 64 MiB, every page touched), and there reads glibc's own
count of the bytes it has in use (mallinfo2), written to $DDP_OUT/rank<r>.json: the independent
figure the rank's report is checked against. With DDP_KILL_RANK=r, rank r SIGKILLs itself at step
5; with DDP_STEPS=n it trains n steps (default 8)."""
import ctypes
import json
import os
import signal

import torch
import torch.distributed as dist


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


# Blocks memsight's heap sampler serves itself (one sample per 512 KiB allocated) are not
# glibc's: the kernel's count of the mappings in the sampler's address range (64-65 TiB) adds
# them (a page at most over each block's own size).
SAMPLED_RANGE = (64 << 40, 65 << 40)


def sampled_mapped():
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if SAMPLED_RANGE[0] <= start < SAMPLED_RANGE[1]:
                total += end - start
    return total


def glibc_in_use():
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd + sampled_mapped()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kill = os.environ.get("DDP_KILL_RANK")
    held = None
    for step in range(int(os.environ.get("DDP_STEPS", "8"))):
        x = torch.randn(64, 256)
        y = torch.randint(0, 10, (64,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 3:
            held = bytearray((2 + rank) * (64 << 20))
            for i in range(0, len(held), 4096):
                held[i] = 1
            with open(os.path.join(os.environ["DDP_OUT"], f"rank{rank}.json"), "w") as f:
                json.dump({"rank": rank, "pid": os.getpid(), "glibc_in_use": glibc_in_use()}, f)
        if step == 4:
            held = None
        if kill is not None and int(kill) == rank and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
