"""A DataLoader job with 2 workers, unmodified for memsight, whose worker 1 grows its memory 32 MiB
a batch (every page touched) until the OOM killer ends it in the memory cgroup named by
$JOB_CGROUP (the job moves itself there first; its workers, started later, are in it too). The main
process then fails with PyTorch's "DataLoader worker (pid N) is killed by signal" error. The
workers are forked, or started as $JOB_MP_CONTEXT says (`spawn`, `forkserver`)."""
import os

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


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


if __name__ == "__main__":
    cgroup = os.environ.get("JOB_CGROUP")
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    loader = DataLoader(
        Growing(),
        batch_size=1,
        num_workers=2,
        multiprocessing_context=os.environ.get("JOB_MP_CONTEXT") or None,
    )
    for step, batch in enumerate(loader):
        pass
