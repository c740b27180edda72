"""A CPU DDP training job (gloo), unmodified for memsight: no `import memsight`. Each rank holds a
known block at step 3 (rank r: (2 + r) × 64 MiB, every page touched), and there reads glibc's own
count of the bytes it has in use (mallinfo2), written to $DDP_OUT/rank<r>.json: the independent
figure the rank's report is checked against. With DDP_KILL_RANK=r, rank r SIGKILLs itself at step
5; with DDP_STEPS=n it trains n steps (default 8)."""
import json
import os
import signal
import sys

# glibc's count of the heap, shared with the Python jobs' truths.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python_jobs"))
import heap_truth  # noqa: E402

import torch
import torch.distributed as dist


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
                json.dump({"rank": rank, "pid": os.getpid(), "glibc_in_use": heap_truth.in_use()}, f)
        if step == 4:
            held = None
        if kill is not None and int(kill) == rank and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
