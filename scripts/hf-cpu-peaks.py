#!/usr/bin/env python3
"""Measures the peak of live tensor bytes of a training step of tiny real-architecture models built
by `transformers` (and `peft`) from the configs in profiler/analysis/tests/fixtures/cpu-measured/,
on CPU, and writes them to measured.json there; profiler/analysis/tests/cpu_measured.rs compares
`memsight estimate --hf-config` with every row.

How the peak is counted: a TorchDispatchMode sees every aten op's outputs (forward, autograd's
backward and the optimizer's ops alike); each new storage is added when it first appears and
subtracted when it is freed (a weakref finalizer on the storage), so the running sum is exactly
the bytes of live tensor storages created since the counting began, plus the parameters, buffers,
gradients and optimizer state alive before it. The peak is taken over the third step (the first
two create the optimizer state and warm caches).

Usage: python scripts/hf-cpu-peaks.py [ID…]   (torch, transformers and peft; CPU only; with ids,
only those rows are measured again).
"""
import json
import os
import sys
import weakref

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import CONFIG_MAPPING

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                    "profiler", "analysis", "tests", "fixtures", "cpu-measured")


class Live(TorchDispatchMode):
    def __init__(self, start, known=()):
        super().__init__()
        self.live = start
        self.peak = start
        # Storages alive before counting began (parameters, optimizer state) are in `start`
        # already: a view of one (a weight's transpose) is not a new allocation.
        self.seen = {k: 0 for k in known}

    def _track(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        if key == 0 or key in self.seen:
            return
        n = st.nbytes()
        self.seen[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)

        def free(k=key, n=n, me=self):
            if me.seen.pop(k, None) is not None:
                me.live -= n
        try:
            weakref.finalize(st, free)
        except TypeError:
            self.seen.pop(key, None)
            self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            self._track(t)
        return out


def storage_bytes(tensors):
    seen = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def state_tensors(model, opt):
    ts = list(model.parameters()) + list(model.buffers())
    ts += [p.grad for p in model.parameters() if p.grad is not None]
    for s in opt.state.values():
        ts += [v for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return ts


def state_bytes(model, opt):
    return storage_bytes(state_tensors(model, opt))


def run(row):
    torch.manual_seed(0)
    cfg_path = os.path.join(HERE, row["config"] + ".json")
    raw = json.load(open(cfg_path))
    cfg = CONFIG_MAPPING[raw["model_type"]].from_json_file(cfg_path)
    cfg._attn_implementation = row.get("attn", "sdpa")
    model = getattr(transformers, raw["architectures"][0])(cfg)
    dtype = torch.bfloat16 if row["precision"] == "bf16" else torch.float32
    model = model.to(dtype)
    if row.get("lora_rank"):
        import peft
        targets = "all-linear" if row.get("lora_targets") == "all-linear" else None
        lc = peft.LoraConfig(r=row["lora_rank"], lora_alpha=16, target_modules=targets,
                             lora_dropout=0.0)
        model = peft.get_peft_model(model, lc, autocast_adapter_dtype=False)
    if row.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for m in model.modules():  # no dropout: masks are not modelled on CPU here
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    b, s = row["batch"], row["seq"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, raw["vocab_size"], (b, s), generator=g)
    kind = raw["architectures"][0]
    def step():
        if "SequenceClassification" in kind:
            out = model(input_ids=ids, labels=torch.zeros(b, dtype=torch.long))
        elif "ConditionalGeneration" in kind:
            out = model(input_ids=ids, labels=ids)
        else:
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out
    step()
    step()
    start = state_bytes(model, opt)
    known = {t.untyped_storage().data_ptr() for t in state_tensors(model, opt)}
    mode = Live(start, known)
    with mode:
        step()
    return mode.peak


def main():
    rows = json.load(open(os.path.join(HERE, "rows.json")))
    only = set(sys.argv[1:])  # re-measure only these ids, keeping the others' figures
    old = {}
    path = os.path.join(HERE, "measured.json")
    if only and os.path.exists(path):
        old = {r["id"]: r for r in json.load(open(path))["rows"]}
    out = {"_note": "peak live tensor bytes of the third training step on CPU, counted by "
                    "scripts/hf-cpu-peaks.py (TorchDispatchMode + storage finalizers)",
           "_versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "rows": []}
    for row in rows:
        if only and row["id"] not in only and row["id"] in old:
            out["rows"].append(old[row["id"]])
            continue
        peak = run(row)
        r = dict(row, measured_bytes=peak)
        out["rows"].append(r)
        print(row["id"], peak, file=sys.stderr)
    with open(os.path.join(HERE, "measured.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
