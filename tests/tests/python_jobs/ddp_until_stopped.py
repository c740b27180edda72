"""A DDP training loop (gloo, CPU) that trains until it is stopped from outside: each rank writes
its latest step to DIR/rank<N>.step (argv[1]); rank r holds (r + 1) × 32 MiB from step 3."""
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
keep = None
for step in range(1, 1_000_000):
    if step == 3:
        keep = torch.ones((rank + 1) * (32 << 18))
    loss = model(torch.randn(16, 64)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(os.path.join(sys.argv[1], f"rank{rank}.step.tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(sys.argv[1], f"rank{rank}.step.tmp"),
               os.path.join(sys.argv[1], f"rank{rank}.step"))
    time.sleep(0.05)
