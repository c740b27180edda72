"""The PyTorch peer of memsight-gpt: the same GPT-2-style model, corpus, batches (SplitMix64
windows) and switches, in plain PyTorch (torch 2.11.0, the wheel scripts/setup.sh installs), so the
ablation can put memsight's tch loop side by side with PyTorch: peak RSS and median step time.

    python reference-model/peer/gpt.py --preset tiny --steps 30 --json out.json [switches...]

Switches mirror `memsight-gpt train`: --attention naive|efficient|sdpa, --checkpoint, --bf16,
--micro-batch N, --eval-segment N, --cleanup-every N, --lora-rank R, --threads N,
--interop-threads N; --workers/--prefetch are accepted and ignored (batches are built in-process).
"""

import argparse
import ctypes
import json
import math
import os
import resource
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

PRESETS = {"tiny": (4, 4, 128, 128), "small": (6, 6, 384, 256), "gpt2": (12, 12, 768, 1024)}
MASK64 = (1 << 64) - 1


def split_mix(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def make_batch(tokens, seed, n, batch, seq):
    st = seed ^ ((n * 0xA24BAED4963EE407) & MASK64)
    span = max(len(tokens) - seq - 1, 1)
    xs, ys = [], []
    for _ in range(batch):
        st, r = split_mix(st)
        i = r % span
        w = tokens[i : i + seq + 1]
        xs.append(w[:-1])
        ys.append(w[1:])
    return torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


class EfficientAttention(torch.autograd.Function):
    """Streaming softmax over key blocks; saves q, k, v, out and log-sum-exp only."""

    @staticmethod
    def forward(ctx, q, k, v, block):
        s, scale = q.shape[2], 1.0 / math.sqrt(q.shape[-1])
        qf = q.float()
        m = torch.full(q.shape[:3] + (1,), float("-inf"))
        l = torch.zeros(q.shape[:3] + (1,))
        o = torch.zeros(q.shape[:3] + (q.shape[3],))
        rows = torch.arange(s).unsqueeze(1)
        for j0 in range(0, s, block):
            j1 = min(j0 + block, s)
            sj = qf @ k[:, :, j0:j1].float().transpose(-2, -1) * scale
            sj = sj.masked_fill(torch.arange(j0, j1).unsqueeze(0) > rows, float("-inf"))
            m_new = torch.maximum(m, sj.amax(-1, keepdim=True))
            p = torch.exp(sj - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1, keepdim=True)
            o = o * alpha + p @ v[:, :, j0:j1].float()
            m = m_new
        out = (o / l).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, m + torch.log(l))
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o, lse = ctx.saved_tensors
        s, scale, block = q.shape[2], 1.0 / math.sqrt(q.shape[-1]), ctx.block
        qf, dof = q.float(), dout.float()
        dd = (dof * o.float()).sum(-1, keepdim=True)
        dq = torch.zeros_like(qf)
        dks, dvs = [], []
        rows = torch.arange(s).unsqueeze(1)
        for j0 in range(0, s, block):
            j1 = min(j0 + block, s)
            kj, vj = k[:, :, j0:j1].float(), v[:, :, j0:j1].float()
            sj = qf @ kj.transpose(-2, -1) * scale
            sj = sj.masked_fill(torch.arange(j0, j1).unsqueeze(0) > rows, float("-inf"))
            p = torch.exp(sj - lse)
            dvs.append(p.transpose(-2, -1) @ dof)
            ds = p * (dof @ vj.transpose(-2, -1) - dd)
            dq += ds @ kj * scale
            dks.append(ds.transpose(-2, -1) @ qf * scale)
        return dq.to(q.dtype), torch.cat(dks, 2).to(k.dtype), torch.cat(dvs, 2).to(v.dtype), None


class Linear(nn.Linear):
    def __init__(self, din, dout, std, rank):
        super().__init__(din, dout)
        nn.init.normal_(self.weight, 0.0, std)
        nn.init.zeros_(self.bias)
        self.rank = rank
        if rank > 0:
            bound = 1.0 / math.sqrt(din)
            self.lora_a = nn.Parameter(torch.empty(rank, din).uniform_(-bound, bound))
            self.lora_b = nn.Parameter(torch.zeros(dout, rank))

    def forward(self, x):
        y = super().forward(x)
        if self.rank > 0:
            y = y + F.linear(F.linear(x, self.lora_a), self.lora_b) * 2.0
        return y


class Block(nn.Module):
    def __init__(self, d, h, n_layer, rank, attention, block):
        super().__init__()
        proj = 0.02 / math.sqrt(2 * n_layer)
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn = Linear(d, 3 * d, 0.02, rank)
        self.attn_proj = Linear(d, d, proj, rank)
        self.c_fc = Linear(d, 4 * d, 0.02, rank)
        self.mlp_proj = Linear(4 * d, d, proj, rank)
        self.h, self.attention, self.block = h, attention, block

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x.float())).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.attention == "efficient":
            o = EfficientAttention.apply(q, k, v, self.block)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            o = att.softmax(-1, dtype=torch.float32).to(v.dtype) @ v
        x = x + self.attn_proj(o.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x.float())), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d, block_size, rank, attention, block, ckpt):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(256, d) * 0.02)
        self.wpe = nn.Parameter(torch.randn(block_size, d) * 0.02)
        self.h = nn.ModuleList(Block(d, n_head, n_layer, rank, attention, block) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.ckpt = ckpt

    def forward(self, idx, targets):
        x = self.wte[idx] + self.wpe[: idx.shape[1]]
        for b in self.h:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt and self.training else b(x)
        logits = F.linear(self.ln_f(x.float()), self.wte)
        return F.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=0)
    p.add_argument("--attention", default="sdpa", choices=["naive", "efficient", "sdpa"])
    p.add_argument("--attention-block", type=int, default=64)
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--eval-segment", type=int, default=0)
    p.add_argument("--cleanup-every", type=int, default=0)
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--interop-threads", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.interop_threads:
        torch.set_num_interop_threads(a.interop_threads)
    torch.manual_seed(a.seed)
    n_layer, n_head, d, block_size = PRESETS[a.preset]
    seq = a.seq_len or block_size
    micro = a.micro_batch or a.batch_size
    corpus = os.path.join(os.path.dirname(__file__), "..", "data", "rust-book.txt")
    tokens = list(open(corpus, "rb").read())
    train = tokens[: len(tokens) * 9 // 10]
    model = GPT(n_layer, n_head, d, block_size, a.lora_rank, a.attention, a.attention_block, a.checkpoint)
    if a.lora_rank:
        for n, prm in model.named_parameters():
            prm.requires_grad = "lora_" in n
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    libc = ctypes.CDLL("libc.so.6")
    times, loss_v, batch_n = [], 0.0, 0
    for it in range(a.steps):
        t0 = time.perf_counter()
        total = 0.0
        xb, yb = make_batch(train, a.seed, batch_n, a.batch_size, seq)
        batch_n += 1
        for i in range(a.batch_size // micro):
            x, y = xb[i * micro : (i + 1) * micro], yb[i * micro : (i + 1) * micro]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                loss = model(x, y)
            (loss * micro / a.batch_size).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it > 0:
            times.append((time.perf_counter() - t0) * 1000)
        loss_v = total / (a.batch_size // micro)
        if a.cleanup_every and (it + 1) % a.cleanup_every == 0:
            libc.malloc_trim(0)
    times.sort()
    out = {
        "rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_ms_median": times[len(times) // 2] if times else 0.0,
        "final_loss": loss_v,
    }
    json.dump(out, open(a.json, "w"))


if __name__ == "__main__":
    main()
