"""A DataLoader job with 2 workers, unmodified for memsight, whose worker 1 grows its memory 32 MiB
a batch (every page touched) until the OOM killer ends it in the memory cgroup named by
$JOB_CGROUP (the job moves itself there first; its workers, forked later, are in it too). The main
process then fails with PyTorch's "DataLoader worker (pid N) is killed by signal" error."""
import os

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

cgroup = os.environ.get("JOB_CGROUP")
if cgroup:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))

hoard = []


class Growing(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        info = get_worker_info()
        if info is not None and info.id == 1:
            block = bytearray(32 << 20)
            for j in range(0, len(block), 4096):
                block[j] = 1
            hoard.append(block)
        return torch.zeros(16)


for step, batch in enumerate(DataLoader(Growing(), batch_size=1, num_workers=2)):
    pass
