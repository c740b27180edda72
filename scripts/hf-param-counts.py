#!/usr/bin/env python3
"""Regenerates profiler/analysis/tests/fixtures/hf-configs/params.json: the parameter counts that
`transformers` builds from each tiny config.json there (randomly initialised on CPU, no weights
downloaded), and the trainable counts `peft` gives LoRA (r=8) and DoRA on the q/v projections and
on all linear layers. `memsight estimate --hf-config` must reproduce every number exactly
(profiler/analysis/tests/hf_params.rs).

Usage: python scripts/hf-param-counts.py   (needs torch, transformers and peft; e.g. a venv made
with `pip install torch transformers peft`). Prints the versions it used into the file.
"""
import glob
import json
import os
import sys

import torch
import transformers
from transformers import CONFIG_MAPPING

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                    "profiler", "analysis", "tests", "fixtures", "hf-configs")

# The modules each family's q/v LoRA targets (peft's own defaults where it has them).
QV = {
    "gpt2": ["c_attn"], "gpt_neox": ["query_key_value"], "bert": ["query", "value"],
    "roberta": ["query", "value"], "t5": ["q", "v"], "phi3": ["qkv_proj"],
}


def count(model):
    return sum(p.numel() for p in model.parameters())


def lora(model_fn, targets, dora):
    import peft
    m = model_fn()
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, use_dora=dora)
    m = peft.get_peft_model(m, cfg)
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


def main():
    import peft
    torch.manual_seed(0)
    out = {"_note": "parameter counts built by transformers from each config here; regenerate "
                    "with scripts/hf-param-counts.py",
           "_versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "peft": peft.__version__}}
    for path in sorted(glob.glob(os.path.join(HERE, "*.json"))):
        name = os.path.basename(path)[:-5]
        if name == "params":
            continue
        raw = json.load(open(path))
        cls = getattr(transformers, raw["architectures"][0])

        def build():
            cfg = CONFIG_MAPPING[raw["model_type"]].from_json_file(path)
            return cls(cfg)

        model = build()
        row = {"class": raw["architectures"][0], "params": count(model)}
        qv = QV.get(raw["model_type"], ["q_proj", "v_proj"])
        if raw["model_type"] == "phi":
            qv = ["q_proj", "v_proj"]
        row["lora_r8_qv"] = lora(build, qv, False)
        row["lora_r8_all_linear"] = lora(build, "all-linear", False)
        try:
            row["dora_r8_all_linear"] = lora(build, "all-linear", True)
        except ValueError as e:  # peft: DoRA does not wrap fused expert parameters
            row["dora_r8_all_linear"] = None
            row["dora_error"] = str(e)
        out[name] = row
        print(name, row, file=sys.stderr)
    with open(os.path.join(HERE, "params.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
