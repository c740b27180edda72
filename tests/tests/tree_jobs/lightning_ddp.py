"""A Lightning `Trainer(strategy="ddp", devices=2)` CPU job, unmodified for memsight: the script the
user runs is rank 0 and starts rank 1 itself (Lightning's subprocess launcher), setting LOCAL_RANK,
NODE_RANK and WORLD_SIZE in its own environment first. Each rank holds a known block at step 3
(rank r: (2 + r) × 64 MiB, every page touched) and there writes glibc's own count of the bytes it
has in use to $LT_OUT/rank<r>.json: the independent figure its report is checked against."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python_jobs"))
import heap_truth  # noqa: E402

import lightning as L  # noqa: E402
import torch  # noqa: E402


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(128, 128)
        self.held = None

    def training_step(self, batch, i):
        if i == 3:
            self.held = bytearray((2 + self.global_rank) * (64 << 20))
            for j in range(0, len(self.held), 4096):
                self.held[j] = 1
            out = os.path.join(os.environ["LT_OUT"], f"rank{self.global_rank}.json")
            with open(out, "w") as f:
                json.dump({"rank": self.global_rank, "pid": os.getpid(),
                           "glibc_in_use": heap_truth.in_use()}, f)
        if i == 4:
            self.held = None
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(384, 128)),
                                       batch_size=32)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False)
    trainer.fit(Model(), data)


if __name__ == "__main__":
    main()
