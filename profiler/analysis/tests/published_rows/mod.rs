//! What the published-peak tests share: a row's `args` read as the estimator's recipe (the CLI's
//! flags, by name), a config read from a fixture directory, and the seeded split's hash.

use memsight_analysis::estimate::hf;
use memsight_analysis::estimate::lora::{Lora, Targets};
use memsight_analysis::estimate::recipe::{
    AttnImpl, Checkpointing, Loss, Optim, Precision, Quant, Recipe,
};
use serde_json::Value;
use std::path::Path;

/// FNV-1a 64: the split's hash.
pub fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether a row is in the held-out half: its seeded hash is odd.
pub fn held_out(seed: &str, id: &str) -> bool {
    fnv(&format!("{seed}{id}")) % 2 == 1
}

/// The recipe a row's `args` describe (the CLI's flags, by name).
pub fn recipe(a: &Value) -> Recipe {
    let s = |k: &str| a.get(k).and_then(Value::as_str);
    let u = |k: &str| a.get(k).and_then(Value::as_u64);
    let b = |k: &str| a.get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut r = Recipe::new(u("seq").unwrap());
    r.batch = u("batch").unwrap_or(1);
    if let Some(p) = s("precision") {
        r.precision = Precision::parse(p).unwrap();
    }
    if let Some(q) = s("quant") {
        r.quant = Quant::parse(q).unwrap();
    }
    if let Some(o) = s("optimizer") {
        r.optimizer = Optim::parse(o).unwrap();
    }
    r.foreach = a.get("foreach").and_then(Value::as_bool).unwrap_or(true);
    r.paged = b("paged");
    r.keep_logits = b("keep_logits");
    if let Some(l) = s("loss") {
        r.loss = Loss::parse(l).unwrap();
    }
    if let Some(c) = s("checkpointing") {
        r.checkpointing = Checkpointing::parse(c).unwrap();
    }
    r.attention = match s("attention") {
        Some("eager") => AttnImpl::Eager,
        _ => AttnImpl::Sdpa,
    };
    r.dropout = b("dropout");
    r.grad_accumulation = u("grad_accumulation").unwrap_or(1);
    r.grads_persist = b("grads_persist");
    if let Some(rank) = u("lora_rank") {
        r.lora = Some(Lora {
            rank,
            targets: Targets::parse(s("lora_targets").unwrap_or("qv")).unwrap(),
            dora: b("dora"),
        });
    }
    r.adapter_bytes = u("adapter_bytes").unwrap_or(4);
    r.lora_dropout = b("lora_dropout");
    r.fused_qkv = b("fused_qkv");
    r.kbit_fp32_rest = b("prepare_kbit");
    r.quant_head = b("quant_head");
    if let Some(n) = u("dequant_bytes") {
        r.dequant_bytes = n;
    }
    r.frozen_inputs_saved = b("frozen_inputs_saved");
    if let Some(z) = u("zero_stage") {
        r.parallel.zero = u8::try_from(z).unwrap();
    }
    r.parallel.dp = u("gpus").unwrap_or(1);
    r.parallel.offload_params = b("offload_params");
    r.parallel.offload_optimizer = b("offload_optimizer");
    if let Some(c) = u("cuda_context_mib") {
        r.device.context = c << 20;
    }
    r
}

/// The architecture a fixture config in `dir` describes.
pub fn arch(dir: &Path, name: &str) -> memsight_analysis::estimate::arch::Arch {
    let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
    hf::parse(&text).unwrap()
}
