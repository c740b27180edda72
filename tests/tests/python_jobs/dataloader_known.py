"""An unmodified PyTorch training script (no memsight import) with a 2-worker DataLoader that holds
a known number of bytes: a 256 MiB buffer for the whole of training.

The truth it is checked against is glibc's own accounting of the heap (mallinfo2: in-use bytes of
every arena plus mmapped blocks), taken by the script after every step and written to argv[1] with
the largest value, together with the pids of its DataLoader workers.
"""

import json
import os
import sys

import heap_truth
import torch
from torch.utils.data import DataLoader, Dataset

HELD_BYTES = 256 << 20


class Tokens(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, generator=g)
        return x, (x.sum() > 0).long()


def main(out_path):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    held = torch.ones(HELD_BYTES, dtype=torch.uint8)  # the known bytes, every page touched
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Tokens(), batch_size=16, num_workers=2, persistent_workers=True)
    truth = heap_truth.in_use()
    workers = set()
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            truth = max(truth, heap_truth.in_use())
        workers.update(w.pid for w in loader._iterator._workers)
    import time
    time.sleep(3)  # the workers stay up: the sidecar reads the tree about once a second
    result = {"held_bytes": HELD_BYTES, "truth_peak_bytes": truth, "workers": sorted(workers),
              "checksum": int(held[::4096].sum())}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
