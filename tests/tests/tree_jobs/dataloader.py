# A PyTorch job with a two-worker DataLoader over a 200 MiB dataset held by the main process
# (the workers are forked and share it copy-on-write). With the workers running, measures the
# tree's distinct physical bytes while holding still (frames.hold_and_measure), writing to argv[1].
import json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frames import hold_and_measure
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __init__(self):
        self.data = torch.ones(1024, 50 << 10)  # 1024 rows of 200 KiB: 200 MiB

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        time.sleep(0.01)
        return self.data[i].sum()


loader = DataLoader(Rows(), batch_size=8, num_workers=2, persistent_workers=True)
written = False
start = time.time()
for epoch in range(20):
    for i, batch in enumerate(loader):
        if not written and i == 10:
            hold_and_measure(sys.argv[1])  # the workers idle meanwhile (their prefetch is full)
            written = True
    if time.time() - start > 4:
        break
