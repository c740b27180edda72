#!/usr/bin/env python3
"""Validates `memsight estimate` against real PyTorch training steps (CPU).

Each configuration trains a nanoGPT-style model (learned positions, pre-LayerNorm blocks with
biases, 4x MLP, LM head tied to the token embedding, nanoGPT's naive attention with its per-block
causal-mask buffer or `F.scaled_dot_product_attention`) for a few steps in a fresh process and
measures the peak of live tensor bytes of one steady-state optimizer step (all micro-steps, the
optimizer step and `zero_grad(set_to_none=True)`), then asks the built `memsight estimate --json`
for the same configuration and prints both.

How the peak is measured: the whole run, from before the model is built, happens under
`torch.profiler.profile(profile_memory=True)`. PyTorch's CPU allocator reports every allocation
and free (with its size) to the profiler, so the running sum of those events is exactly the bytes
of live tensor storage (plus any kernel scratch taken from the same allocator) at every moment.
Starting before the first tensor matters: the profiler cannot report the free of a block
allocated before it started. The peak is the largest running sum inside the `measured_step`
annotation (the third step; the first two create the optimizer state and, with kept logits,
leave the previous step's logits alive as a real loop does). `--self-test` checks the method on
tensors of known sizes.

Usage:
  scripts/estimate-validate.py --grid full            # the table of docs/estimate.md
  scripts/estimate-validate.py --grid quick           # a handful of small configurations
  scripts/estimate-validate.py --check-batch          # runs memsight's largest micro-batch
  scripts/estimate-validate.py --json ...             # machine-readable results
Options: --memsight PATH (default target/release/memsight), --python PATH (the torch venv's
python for the measuring processes; default this interpreter), --tolerance 0.10.
"""

import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# A configuration: shape, batch and the training loop's switches (optionally `positions`, the
# position table's and naive attention's mask size, when it is not `seq`). `memsight estimate
# --check-batch` runs `--measure` with configurations in this form.
DEFAULTS = dict(
    layers=2, hidden=128, heads=4, vocab=256, seq=128, batch=4, attention="naive",
    autocast=False, checkpointing=False, dropout=0.0, optimizer_impl="per-tensor",
    accum=1, keep_logits=True,
)


def cfg(**kw):
    c = dict(DEFAULTS)
    c.update(kw)
    return c


def full_grid():
    """The committed table: shapes x vocabularies x loop switches (SGD with momentum 0.9)."""
    g = []
    big = dict(vocab=50257)
    for shape in [dict(layers=2, hidden=128, heads=4), dict(layers=4, hidden=256, heads=8),
                  dict(layers=6, hidden=384, heads=6)]:
        for seq, batch in [(128, 4), (256, 2)]:
            g.append(cfg(**shape, seq=seq, batch=batch))
            g.append(cfg(**shape, seq=seq, batch=batch, **big))
    g += [
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, attention="sdpa"),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, attention="sdpa", **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, autocast=True),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, autocast=True, **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, autocast=True, attention="sdpa"),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, autocast=True, attention="sdpa",
            **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, checkpointing=True),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=8, checkpointing=True, **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, checkpointing=True,
            attention="sdpa"),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, dropout=0.1),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, dropout=0.1, attention="sdpa"),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, dropout=0.1, **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, dropout=0.1, autocast=True),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, optimizer_impl="foreach"),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, optimizer_impl="foreach", **big),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, optimizer_impl="fused", **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, accum=2),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, accum=3, **big),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, keep_logits=False, **big),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=4, keep_logits=False, autocast=True,
            **big),
        cfg(layers=2, hidden=512, heads=8, seq=64, batch=2, **big),
        cfg(layers=2, hidden=512, heads=8, seq=64, batch=1, optimizer_impl="foreach", **big),
        cfg(layers=2, hidden=512, heads=8, seq=64, batch=1, optimizer_impl="fused", **big),
        cfg(layers=2, hidden=512, heads=8, seq=64, batch=1, accum=2, autocast=True, **big),
        cfg(layers=4, hidden=256, heads=8, seq=128, batch=16, attention="sdpa"),
        cfg(layers=2, hidden=512, heads=8, seq=64, batch=1, optimizer="sgd", **big),
        cfg(layers=4, hidden=256, heads=8, seq=256, batch=4, optimizer="sgd",
            optimizer_impl="foreach", attention="sdpa", autocast=True),
        cfg(layers=4, hidden=256, heads=4, seq=512, batch=2, dropout=0.1, checkpointing=True,
            keep_logits=False, vocab=32000),
        cfg(layers=8, hidden=192, heads=6, seq=512, batch=1),
        cfg(layers=3, hidden=256, heads=4, seq=256, batch=2, attention="sdpa", dropout=0.1,
            autocast=True, checkpointing=True, accum=2, optimizer_impl="foreach", **big),
    ]
    return g


def quick_grid():
    """Small configurations for the test that `make test` runs (well under a minute)."""
    return [
        cfg(layers=2, hidden=64, heads=4, seq=64, batch=4),
        cfg(layers=2, hidden=64, heads=4, seq=64, batch=2, vocab=50257),
        cfg(layers=2, hidden=64, heads=4, seq=64, batch=4, attention="sdpa", autocast=True),
        cfg(layers=2, hidden=64, heads=4, seq=64, batch=4, dropout=0.1, checkpointing=True),
        cfg(layers=2, hidden=64, heads=4, seq=64, batch=2, vocab=8192, accum=2,
            optimizer_impl="foreach", keep_logits=False),
    ]


def random_grid(seed, count, vocabs=(65, 256, 1000, 8192, 32000, 50257)):
    """Configurations drawn at random (a held-out check: measure a seed the model was not tuned
    on). Shapes, vocabularies and every loop switch at random; sizes kept to seconds per run."""
    import random
    rng = random.Random(seed)
    g = []
    while len(g) < count:
        heads = rng.choice([1, 2, 3, 4, 6, 8])
        hidden = heads * rng.choice([8, 16, 24, 32, 48, 64])
        optimizer = rng.choice(["adamw", "adamw", "adamw", "sgd"])
        impls = ["per-tensor", "foreach"] + (["fused"] if optimizer == "adamw" else [])
        c = cfg(layers=rng.randint(1, 6), hidden=hidden, heads=heads,
                vocab=rng.choice(list(vocabs)),
                seq=rng.choice([32, 48, 64, 96, 128, 192, 256, 384]),
                batch=rng.randint(1, 8), attention=rng.choice(["naive", "sdpa"]),
                autocast=rng.random() < 0.35, checkpointing=rng.random() < 0.3,
                dropout=rng.choice([0.0, 0.0, 0.1, 0.2]), optimizer=optimizer,
                optimizer_impl=rng.choice(impls), accum=rng.choice([1, 1, 2, 3]),
                keep_logits=rng.random() < 0.6)
        # Keep each run to seconds on 2 cores: at most ~1.5 GB of logits work and scores.
        x = c["batch"] * c["seq"] * c["vocab"] * 16
        sc = c["layers"] * c["batch"] * c["heads"] * c["seq"] ** 2 * 8
        if x + sc > 1.5e9:
            continue
        g.append(c)
    return g


def label(c):
    parts = [f"L{c['layers']} d{c['hidden']} H{c['heads']} V{c['vocab']} S{c['seq']} B{c['batch']}",
             c["attention"]]
    if c.get("positions", c["seq"]) != c["seq"]:
        parts.insert(1, f"P{c['positions']}")
    if c["autocast"]:
        parts.append("bf16")
    if c["checkpointing"]:
        parts.append("ckpt")
    if c["dropout"]:
        parts.append(f"drop{c['dropout']}")
    if c.get("optimizer", "adamw") != "adamw":
        parts.append(c["optimizer"])
    parts.append(c["optimizer_impl"])
    if c["accum"] > 1:
        parts.append(f"accum{c['accum']}")
    parts.append("keep" if c["keep_logits"] else "drop-logits")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# The measuring process.

def measure(c):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["hidden"]
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.attn_dropout = nn.Dropout(c["dropout"])
            self.resid_dropout = nn.Dropout(c["dropout"])
            if c["attention"] == "naive":
                p = c.get("positions", c["seq"])
                self.register_buffer("bias", torch.tril(torch.ones(p, p)).view(1, 1, p, p))

        def forward(self, x):
            B, T, C = x.size()
            h = c["heads"]
            q, k, v = self.c_attn(x).split(C, dim=2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            if c["attention"] == "sdpa":
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=None, dropout_p=c["dropout"] if self.training else 0,
                    is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                att = self.attn_dropout(att)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["hidden"]
            self.ln_1 = nn.LayerNorm(d)
            self.attn = Attn()
            self.ln_2 = nn.LayerNorm(d)
            self.c_fc = nn.Linear(d, 4 * d)
            self.gelu = nn.GELU()
            self.mlp_proj = nn.Linear(4 * d, d)
            self.mlp_dropout = nn.Dropout(c["dropout"])

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp_dropout(self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["hidden"]
            self.wte = nn.Embedding(c["vocab"], d)
            self.wpe = nn.Embedding(c.get("positions", c["seq"]), d)
            self.drop = nn.Dropout(c["dropout"])
            self.h = nn.ModuleList([Block() for _ in range(c["layers"])])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, c["vocab"], bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx, targets):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long)
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                if c["checkpointing"]:
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
            return logits, loss

    def step(model, opt, x, y, state):
        for _ in range(c["accum"]):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c["autocast"]):
                out = model(x, y)
            if c["keep_logits"]:
                # As nanoGPT's loop: `logits` stays alive until the next forward replaces it.
                state["logits"], loss = out
            else:
                loss = out[1]
            del out
            (loss / c["accum"]).backward()
            del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = GPT()
        model.train()
        impl = c["optimizer_impl"]
        if c.get("optimizer", "adamw") == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9,
                                  foreach=impl == "foreach")
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                                    foreach=impl == "foreach", fused=impl == "fused" or None)
        x = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
        y = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
        state = {}
        step(model, opt, x, y, state)
        step(model, opt, x, y, state)
        with record_function("measured_step"):
            step(model, opt, x, y, state)
    events = prof.profiler.kineto_results.events()
    marks = [e for e in events if e.name() == "measured_step"]
    if not marks:
        raise RuntimeError("the profiler recorded no measured_step annotation")
    start, end = marks[0].start_ns(), marks[0].end_ns()
    mem = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events)
                 if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"))
    live, peak, at_start, peak_t = 0, 0, None, start
    for t, _, n in mem:
        if t >= start and at_start is None:
            at_start = live
            peak = live
        live += n
        if start <= t <= end and live > peak:
            peak, peak_t = live, t
    # The innermost operator running at the peak (for reading the table, not for the check).
    ops = [e for e in events if e.name() not in ("[memory]", "measured_step")
           and e.start_ns() <= peak_t <= e.end_ns()]
    op = min(ops, key=lambda e: e.end_ns() - e.start_ns()).name() if ops else ""
    return {"peak_bytes": peak, "live_at_step_start": at_start, "peak_op": op}


def self_test():
    """Checks the measuring method on tensors of known sizes."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    mib = 1 << 20
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(mib, dtype=torch.uint8)
        with record_function("measured_step"):
            b = torch.empty(2 * mib, dtype=torch.uint8)
            del a
            c_ = torch.empty(4 * mib, dtype=torch.uint8)  # live: 2 + 4 = 6 MiB
            del b, c_
            d = torch.ones(3 * mib // 4, dtype=torch.float32)  # 3 MiB
            del d
    events = prof.profiler.kineto_results.events()
    mark = [e for e in events if e.name() == "measured_step"][0]
    live, peak = 0, 0
    for t, _, n in sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events)
                          if e.name() == "[memory]"):
        live += n
        if mark.start_ns() <= t <= mark.end_ns():
            peak = max(peak, live)
    ok = peak == 6 * mib and live == 0
    print(f"self-test: peak {peak} B (expected {6 * mib}), end {live} B (expected 0):",
          "ok" if ok else "FAILED")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# The driver.

def estimate_args(c):
    a = ["estimate", "--layers", str(c["layers"]), "--hidden", str(c["hidden"]),
         "--heads", str(c["heads"]), "--vocab", str(c["vocab"]), "--seq", str(c["seq"]),
         "--batch", str(c["batch"]), "--device", "cpu",
         "--attention", "naive" if c["attention"] == "naive" else "efficient",
         "--dropout", str(c["dropout"]), "--optimizer", c.get("optimizer", "adamw"),
         "--optimizer-impl", c["optimizer_impl"],
         "--grad-accumulation", str(c["accum"]),
         "--keep-logits" if c["keep_logits"] else "--drop-logits", "--json"]
    if c["autocast"]:
        a.append("--autocast")
    if c["checkpointing"]:
        a.append("--checkpointing")
    if "positions" in c:
        a += ["--positions", str(c["positions"])]
    return a


def memsight_estimate(memsight, c, extra=()):
    out = subprocess.run([memsight, *estimate_args(c), *extra], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"memsight estimate failed: {out.stderr.strip()}")
    return json.loads(out.stdout)["estimate"]


CACHE = {}
CACHE_FILE = None


def run_measure(python, c):
    """Measures `c` in a fresh process (or takes the result from `--cache FILE`)."""
    return run_measure_many(python, [c])[0]


def run_measure_many(python, cs):
    """Measures the configurations not in the cache, one after another in one fresh process
    (each under its own profiler session, started before its model exists)."""
    keys = [json.dumps(c, sort_keys=True) for c in cs]
    todo = [c for c, k in zip(cs, keys) if k not in CACHE]
    if todo:
        out = subprocess.run([python, os.path.abspath(__file__), "--measure", json.dumps(todo)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"measuring failed: {out.stderr.strip()[-2000:]}")
        results = json.loads(out.stdout.strip().splitlines()[-1])
        for c, r in zip(todo, results):
            CACHE[json.dumps(c, sort_keys=True)] = r
        if CACHE_FILE:
            with open(CACHE_FILE, "w") as f:
                json.dump(CACHE, f, indent=0)
    return [CACHE[k] for k in keys]


def mib(b):
    return b / (1 << 20)


def validate(args, grid):
    rows, bad = [], 0
    if args.grid == "quick":
        # One process for the handful of small configurations: torch is imported once.
        run_measure_many(args.python, grid)
    if not args.json:
        print("| # | configuration | measured MiB | estimate MiB | error |")
        print("|---|---|---|---|---|")
    for n, c in enumerate(grid, 1):
        if args.cached_only and json.dumps(c, sort_keys=True) not in CACHE:
            continue
        r = run_measure(args.python, c)
        m = r["peak_bytes"]
        e = memsight_estimate(args.memsight, c)["peak_bytes"]
        err = e / m - 1
        ok = abs(err) <= args.tolerance
        bad += not ok
        est = memsight_estimate(args.memsight, c)
        rows.append(dict(config=c, label=label(c), measured=m, estimate=e, error=err, ok=ok,
                         measured_at=r["peak_op"], estimated_at=est["peak_moment"]))
        if not args.json:
            where = f" | {r['peak_op']} | {est['peak_moment']}" if args.verbose else ""
            print(f"| {n} | {label(c)} | {mib(m):.1f} | {mib(e):.1f} | {err * 100:+.1f}%"
                  f"{'' if ok else ' ✗'}{where} |", flush=True)
    within = len(rows) - bad
    if args.json:
        print(json.dumps(dict(rows=rows, within=within, total=len(rows)), indent=1))
    else:
        worst = sorted(rows, key=lambda r: -abs(r["error"]))[:3]
        print(f"\n{within} of {len(rows)} within ±{args.tolerance * 100:.0f}%; worst: " +
              ", ".join(f"{r['error'] * 100:+.1f}% ({r['label']})" for r in worst))
    return 0 if bad == 0 else 1


def check_batch(args):
    """Runs memsight's largest micro-batch for a small device and confirms it fits."""
    device = args.device_memory
    cases = [
        cfg(layers=4, hidden=256, heads=8, seq=256, vocab=50257),
        cfg(layers=4, hidden=256, heads=8, seq=256, vocab=50257, attention="sdpa",
            optimizer_impl="foreach", keep_logits=False),
        cfg(layers=6, hidden=384, heads=6, seq=256, vocab=8192, checkpointing=True,
            dropout=0.1),
    ]
    failed = 0
    if args.cases:
        cases = [cases[int(k) - 1] for k in args.cases.split(",")]
    for c in cases:
        e = memsight_estimate(args.memsight, c, ["--device-memory", str(device),
                                                 "--headroom", str(args.headroom)])
        b = e["max_micro_batch"]
        if not b:
            print(f"{label(c)}: memsight says not even one sample fits {mib(device):.0f} MiB")
            continue
        c = dict(c, batch=b)
        m = run_measure(args.python, c)["peak_bytes"]
        fits = m <= device
        failed += not fits
        print(f"{label(c)}: largest micro-batch {b} for {mib(device):.0f} MiB with "
              f"{args.headroom * 100:.0f}% headroom; measured peak {mib(m):.1f} MiB: "
              f"{'fits' if fits else 'DOES NOT FIT'}", flush=True)
    return 1 if failed else 0


def grid_of(args):
    if args.grid == "random":
        return random_grid(args.seed, args.count, [int(v) for v in args.vocabs.split(",")])
    return full_grid() if args.grid == "full" else quick_grid()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", choices=["quick", "full", "random"], default="quick")
    p.add_argument("--seed", type=int, default=1, help="--grid random: the draw's seed")
    p.add_argument("--count", type=int, default=29, help="--grid random: how many")
    p.add_argument("--vocabs", default="65,256,1000,8192,32000,50257",
                   help="--grid random: the vocabularies drawn from (small ones: activations "
                   "rather than the loss's logits make the peak)")
    p.add_argument("--check-batch", action="store_true")
    p.add_argument("--device-memory", type=int, default=2 << 30, help="bytes (check-batch; default 2 GiB)")
    p.add_argument("--headroom", type=float, default=0.15)
    p.add_argument("--cases", help="check-batch: only these cases (1-based, comma-separated)")
    p.add_argument("--memsight", default=os.path.join(ROOT, "target", "release", "memsight"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--cache", help="JSON file of measured peaks to reuse and extend (for "
                   "re-running the comparison after changing the estimator)")
    p.add_argument("--cached-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true",
                   help="also print the operator at the measured peak and the estimated moment")
    p.add_argument("--measure-only", action="store_true", help="measure the grid, no estimate")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    if args.measure:
        todo = json.loads(args.measure)
        one = isinstance(todo, dict)
        results = [measure(c) for c in ([todo] if one else todo)]
        print(json.dumps(results[0] if one else results))
        return 0
    if args.self_test:
        return self_test()
    global CACHE_FILE
    if args.cache:
        CACHE_FILE = args.cache
        if os.path.exists(args.cache):
            with open(args.cache) as f:
                CACHE.update(json.load(f))
    if args.measure_only:
        for c in grid_of(args):
            r = run_measure(args.python, c)
            print(f"{label(c)}: {mib(r['peak_bytes']):.2f} MiB at {r['peak_op']}", flush=True)
        return 0
    if args.check_batch:
        return check_batch(args)
    return validate(args, grid_of(args))


if __name__ == "__main__":
    sys.exit(main())
