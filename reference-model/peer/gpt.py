"""The PyTorch peer of memsight-gpt: the same GPT-2-style model, corpus, batches (SplitMix64
windows), evaluation and switches, in plain PyTorch (torch 2.11.0, the wheel scripts/setup.sh
installs), so the ablation can put memsight's tch loop side by side with PyTorch, both measured by
the same instrument: each runs under `memsight run`, and this script marks its steps and phases
(`train`, `train/optimizer`, `eval`) with `import memsight` and records the process heap and RSS
from the session's snapshot when training starts (the baseline each increment is taken over).

    memsight run -- python reference-model/peer/gpt.py --preset tiny --steps 30 --json out.json

Switches mirror `memsight-gpt train`: --attention naive|efficient|sdpa, --checkpoint, --bf16,
--micro-batch N, --vocab-size V, --logits-to-keep N, --eval-segment N, --eval-every N,
--eval-batches N, --cleanup-every N, --cleanup-eval-every N, --lora-rank R, --threads N,
--interop-threads N. What differs, by design of the two stacks: --workers/--prefetch are accepted
and ignored (batches are built in-process, no loader threads); cleanup is glibc's malloc_trim(0)
plus torch.cuda.empty_cache() (PyTorch runs on glibc's malloc, not jemalloc: MALLOC_CONF does not
apply; the ablation's eager-purge row sets glibc's nearest tunables instead); CPU autocast follows
PyTorch's CPU policy; the efficient attention streams over key blocks (memsight-gpt's over query
tiles).
"""

import argparse
import contextlib
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
        xs.append(list(w[:-1]))
        ys.append(list(w[1:]))
    return torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


class EfficientAttention(torch.autograd.Function):
    """Streaming softmax over key blocks; saves q, k, v, out and log-sum-exp only."""

    @staticmethod
    def forward(ctx, q, k, v, block):
        s, scale = q.shape[2], 1.0 / math.sqrt(q.shape[-1])
        qf = q.float()
        m = torch.full(q.shape[:3] + (1,), float("-inf"), device=q.device)
        l = torch.zeros(q.shape[:3] + (1,), device=q.device)
        o = torch.zeros(q.shape[:3] + (q.shape[3],), device=q.device)
        rows = torch.arange(s, device=q.device).unsqueeze(1)
        for j0 in range(0, s, block):
            j1 = min(j0 + block, s)
            sj = qf @ k[:, :, j0:j1].float().transpose(-2, -1) * scale
            sj = sj.masked_fill(torch.arange(j0, j1, device=q.device).unsqueeze(0) > rows, float("-inf"))
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
        rows = torch.arange(s, device=q.device).unsqueeze(1)
        for j0 in range(0, s, block):
            j1 = min(j0 + block, s)
            kj, vj = k[:, :, j0:j1].float(), v[:, :, j0:j1].float()
            sj = qf @ kj.transpose(-2, -1) * scale
            sj = sj.masked_fill(torch.arange(j0, j1, device=q.device).unsqueeze(0) > rows, float("-inf"))
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
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            o = att.softmax(-1, dtype=torch.float32).to(v.dtype) @ v
        x = x + self.attn_proj(o.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x.float())), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d, block_size, rank, attention, block, ckpt, vocab, keep):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.wpe = nn.Parameter(torch.randn(block_size, d) * 0.02)
        self.h = nn.ModuleList(Block(d, n_head, n_layer, rank, attention, block) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.ckpt, self.keep = ckpt, keep

    def forward(self, idx, targets):
        x = self.wte[idx] + self.wpe[: idx.shape[1]]
        for b in self.h:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt and self.training else b(x)
        if self.keep and self.training:
            # logits_to_keep: the head and the loss see the last `keep` positions only.
            x, targets = x[:, -self.keep :], targets[:, -self.keep :]
        logits = F.linear(self.ln_f(x.float()), self.wte)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def marks():
    """memsight's step/phase marks and snapshot under `memsight run` (the package is on
    PYTHONPATH there); stand-ins that do nothing elsewhere."""
    try:
        import memsight

        return memsight
    except ImportError:

        class Absent:
            @staticmethod
            def step(n):
                pass

            @staticmethod
            def phase(name):
                return contextlib.nullcontext()

            @staticmethod
            def snapshot():
                return None

        return Absent


def baseline(ms):
    """The process heap and RSS now, from the memsight session's snapshot (None outside one)."""
    s = ms.snapshot()
    if not s:
        return None, None
    return s["heap"]["live_bytes"], (s.get("process") or {}).get("rss")


def cleanup(libc, device):
    """The peer's cleanup: CUDA's cached blocks back (empty_cache) and glibc's free memory back
    to the system (malloc_trim(0); MALLOC_CONF purging is jemalloc's, which PyTorch does not run)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    libc.malloc_trim(0)


def evaluate(model, a, ms, val, micro, seq, device, libc):
    """Mean validation loss over --eval-batches batches of the micro-batch size, each sequence in
    segments of at most --eval-segment tokens (memsight-gpt's step::evaluate)."""
    seg = a.eval_segment if 0 < a.eval_segment < seq else seq
    total = 0.0
    with ms.phase("eval"), torch.no_grad():
        model.eval()
        for i in range(max(a.eval_batches, 1)):
            x, y = make_batch(val, a.seed ^ 0x5EED, i, micro, seq)
            x, y = x.to(device), y.to(device)
            s, n = 0.0, 0
            for p0 in range(0, seq, seg):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.bf16):
                    loss = model(x[:, p0 : p0 + seg], y[:, p0 : p0 + seg])
                ln = min(seg, seq - p0)
                s += loss.item() * ln
                n += ln
            total += s / n
            if a.cleanup_eval_every and (i + 1) % a.cleanup_eval_every == 0:
                cleanup(libc, device)
        model.train()
    return total / max(a.eval_batches, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--logits-to-keep", type=int, default=0)
    p.add_argument("--block-size", type=int, default=0)
    p.add_argument("--attention", default="sdpa", choices=["naive", "efficient", "sdpa"])
    p.add_argument("--attention-block", type=int, default=64)
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--eval-segment", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--cleanup-every", type=int, default=0)
    p.add_argument("--cleanup-eval-every", type=int, default=0)
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--interop-threads", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    ms = marks()
    device = torch.device(a.device)
    if device.type == "cuda":
        try:
            import memsight.torch

            memsight.torch.install()
        except ImportError:
            pass
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.interop_threads:
        torch.set_num_interop_threads(a.interop_threads)
    torch.manual_seed(a.seed)
    n_layer, n_head, d, block_size = PRESETS[a.preset]
    block_size = a.block_size or block_size
    seq = a.seq_len or block_size
    micro = a.micro_batch or a.batch_size
    corpus = os.path.join(os.path.dirname(__file__), "..", "data", "rust-book.txt")
    tokens = open(corpus, "rb").read()
    cut = len(tokens) * 9 // 10
    train, val = tokens[:cut], tokens[cut:]
    model = GPT(
        n_layer, n_head, d, block_size, a.lora_rank, a.attention, a.attention_block, a.checkpoint,
        a.vocab_size, a.logits_to_keep,
    )
    model.to(device)
    if a.lora_rank:
        for n, prm in model.named_parameters():
            prm.requires_grad = "lora_" in n
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    libc = ctypes.CDLL("libc.so.6")
    times, loss_v, val_loss = [], 0.0, None
    heap0, rss0 = baseline(ms)
    for it in range(a.steps):
        ms.step(it)
        t0 = time.perf_counter()
        total = 0.0
        with ms.phase("train"):
            xb, yb = make_batch(train, a.seed, it, a.batch_size, seq)
            xb, yb = xb.to(device), yb.to(device)
            for i in range(a.batch_size // micro):
                x, y = xb[i * micro : (i + 1) * micro], yb[i * micro : (i + 1) * micro]
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.bf16):
                    loss = model(x, y)
                (loss * micro / a.batch_size).backward()
                total += loss.item()
            with ms.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if it > 0:
            times.append((time.perf_counter() - t0) * 1000)
        loss_v = total / (a.batch_size // micro)
        if a.cleanup_every and (it + 1) % a.cleanup_every == 0:
            cleanup(libc, device)
        last = it + 1 == a.steps
        if (a.eval_every and (it + 1) % a.eval_every == 0) or last:
            val_loss = evaluate(model, a, ms, val, micro, seq, device, libc)
        if not a.quiet and ((it + 1) % 10 == 0 or last):
            print("step %5d/%d | loss %.4f | %.1f ms" % (it + 1, a.steps, loss_v, times[-1] if times else 0.0))
    if a.cleanup_every or a.cleanup_eval_every:
        cleanup(libc, device)
    times.sort()
    out = {
        "baseline_heap_bytes": heap0,
        "baseline_rss_bytes": rss0,
        "rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_ms_median": times[len(times) // 2] if times else 0.0,
        "final_loss": loss_v,
        "val_loss": val_loss,
    }
    with open(a.json, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
