"""A seed-003-like job: an HF-style LoRA fine-tune loop in plain PyTorch — a frozen base model with
low-rank adapters, gradient accumulation, a learning-rate schedule, a 2-worker DataLoader with
prefetching, and an evaluation pass every N optimizer steps — marked for memsight with one import.

    memsight run -- python lora_finetune.py [--steps 24] [--eval-every 8]
"""

import argparse
import math

import memsight
import memsight.torch
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (B @ A), as peft does it."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: int = 16):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale


class TinyLM(nn.Module):
    def __init__(self, vocab=2048, dim=256, layers=4, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids, labels):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        h = self.blocks(self.embed(ids), mask=mask, is_causal=True)
        logits = self.head(h)
        return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def add_lora(model: nn.Module, rank: int):
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.blocks.layers:  # the MLP's projections (attention reads its weights directly)
        layer.linear1 = LoRALinear(layer.linear1, rank)
        layer.linear2 = LoRALinear(layer.linear2, rank)


class Corpus(Dataset):
    def __init__(self, n, seq, vocab):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def evaluate(model, loader):
    # No dropout to switch off, and eval mode would take nn.TransformerEncoderLayer's fast path,
    # which reads the adapted layers' weights directly.
    with memsight.phase("eval"), torch.no_grad():
        losses = [model(b["input_ids"], b["labels"]).item() for b in loader]
    return sum(losses) / len(losses)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=8)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    memsight.torch.install()

    with memsight.phase("load"):
        model = TinyLM()
        add_lora(model, rank=8)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=2e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    train = DataLoader(Corpus(4096, args.seq, 2048), batch_size=args.batch, shuffle=True,
                       num_workers=2, prefetch_factor=2, persistent_workers=True)
    val = DataLoader(Corpus(32, args.seq, 2048), batch_size=args.batch, num_workers=0)

    batches = iter(train)
    for step in range(args.steps):
        memsight.step(step)
        with memsight.phase("train"):
            for _ in range(args.accumulation):
                batch = next(batches)
                with memsight.phase("forward"):
                    loss = model(batch["input_ids"], batch["labels"]) / args.accumulation
                with memsight.phase("backward"):
                    loss.backward()
            with memsight.phase("optimizer"):
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
        if (step + 1) % args.eval_every == 0:
            print(f"step {step + 1}: eval loss {evaluate(model, val):.3f}", flush=True)


if __name__ == "__main__":
    main()
