//! `memsight estimate --hf-config config.json`: any Hugging Face model the estimator describes,
//! trained with a recipe given as flags; prints each term, the moments of a step, the three
//! figures (allocated, reserved, nvidia-smi) with their assumptions, and the fit to a device.

use crate::estimate::{both, fail, name, Args};
use memsight_analysis::estimate::lora::{Lora, Targets};
use memsight_analysis::estimate::recipe::{
    AttnImpl, Checkpointing, Loss, Optim, Parallel, Precision, Quant, Recipe,
};
use memsight_analysis::estimate::{hf, train, Attention, OptimizerImpl};
use memsight_format::units::{fmt_bytes, parse_size};
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of the `--hf-config` path (the recipe; the shared ones are --seq, --batch, --optimizer,
/// --optimizer-impl, --attention, --dropout, --grad-accumulation, --lora-rank, --checkpointing,
/// --zero-stage, --gpus, --device-memory, --headroom, --json).
#[derive(clap::Args)]
pub struct HfArgs {
    /// A Hugging Face config.json (read offline): gpt2, gpt_neox, llama, mistral, qwen2, qwen3,
    /// gemma, phi, phi3, mixtral, bert, roberta, t5; the head from `architectures`.
    #[arg(long, value_name = "PATH")]
    pub hf_config: Option<PathBuf>,
    /// With --hf-config: fp32, bf16 (pure: no master copy), amp (autocast over fp32 weights) or
    /// mixed (2-byte weights, fp32 master weights in the optimizer).
    #[arg(long, default_value = "bf16", value_parser = Precision::parse, requires = "hf_config")]
    precision: Precision,
    /// With --hf-config: base weights none, nf4, nf4-dq (QLoRA, double quantisation) or int8.
    #[arg(long, default_value = "none", value_parser = Quant::parse, requires = "hf_config")]
    quant: Quant,
    /// peft's prepare_model_for_kbit_training: the unquantised weights (embeddings, norms, head)
    /// in fp32 (with --quant).
    #[arg(long, requires = "quant")]
    prepare_kbit: bool,
    /// With --quant: the untied LM head is quantised like the blocks' linears (and is then the
    /// largest linear dequantised). Use it for Lightning Fabric's bitsandbytes plugin (LitGPT's
    /// `--quantize bnb.*`), which replaces every nn.Linear, the head included; transformers/peft
    /// keep the head unquantised (the default).
    #[arg(long, requires = "quant")]
    quant_head: bool,
    /// With --quant: bytes per weight a quantised linear's dequantisation allocates (1-8): the
    /// dtype the weights were quantised from, plus the cast to the compute dtype when they differ.
    /// 2 (default): quantised from the compute dtype (transformers/peft); 4: quantised from fp16
    /// and run in bf16 (Lightning Fabric / LitGPT: 2 + 2); 6: quantised from fp32, run in bf16.
    #[arg(long, value_name = "N", value_parser = parse_dequant_bytes, requires = "quant")]
    dequant_bytes: Option<u64>,
    /// LoRA targets: qv, all-linear, or module names (q_proj,k_proj,v_proj,o_proj).
    #[arg(long, default_value = "qv", value_parser = Targets::parse, requires = "hf_config")]
    lora_targets: Targets,
    /// DoRA instead of LoRA (a magnitude vector per wrapped linear).
    #[arg(long, requires = "lora_rank")]
    dora: bool,
    /// LoRA dropout on the adapters' inputs (each wrapped module keeps a dropped copy).
    #[arg(long, requires = "lora_rank")]
    lora_dropout: bool,
    /// With --lora-rank: q, k and v are one linear with one LoRA dropout (LitGPT's fused `attn`
    /// wrapped by one LoRAQKVLinear), so a block keeps one dropped copy of its input for them
    /// where peft's separate q_proj/k_proj/v_proj keep one each. Use it for LitGPT; peft on a
    /// config with separate projections is the default.
    #[arg(long, requires = "lora_rank")]
    fused_qkv: bool,
    /// Adapter dtype: fp32 (peft's default) or bf16.
    #[arg(long, default_value = "fp32", requires = "lora_rank")]
    adapter_dtype: String,
    /// Paged optimizer state (bitsandbytes paged_*): in unified memory, outside the allocator.
    #[arg(long, requires = "hf_config")]
    paged: bool,
    /// Step each parameter in backward and free its gradient (optimizer-in-backward).
    #[arg(long, requires = "hf_config")]
    optimizer_in_backward: bool,
    /// Loss: fp32 (transformers: logits cast to fp32), native (in the logits' dtype) or
    /// chunked[:N] (fused/chunked cross-entropy, N positions at a time).
    #[arg(long, default_value = "fp32", value_parser = Loss::parse, requires = "hf_config")]
    loss: Loss,
    /// Selective recomputation (the attention core) instead of --checkpointing's full blocks.
    #[arg(long, requires = "hf_config", conflicts_with = "checkpointing")]
    selective: bool,
    /// Gradients stay allocated between steps (zero_grad(set_to_none=False)).
    #[arg(long, requires = "hf_config")]
    grads_persist: bool,
    /// Offload optimizer state (and master weights) to the CPU.
    #[arg(long, requires = "hf_config")]
    offload_optimizer: bool,
    /// Offload weights to the CPU (ZeRO-3).
    #[arg(long, requires = "hf_config")]
    offload_params: bool,
    /// Tensor-parallel degree.
    #[arg(long, default_value_t = 1, requires = "hf_config")]
    tp: u64,
    /// Sequence parallelism with --tp.
    #[arg(long, requires = "hf_config")]
    sp: bool,
    /// CUDA context (and loaded kernels) per process, in nvidia-smi's figure.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "hf_config")]
    cuda_context: Option<u64>,
}

/// `--dequant-bytes`: a whole number of bytes per weight, 1 to 8.
fn parse_dequant_bytes(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n @ 1..=8) => Ok(n),
        _ => Err(format!(
            "`{s}` is not a byte count per weight from 1 to 8 (2: quantised from the compute \
             dtype; 4: from fp16 run in bf16, as Lightning Fabric does; 6: from fp32 run in bf16)"
        )),
    }
}

fn recipe(a: &Args, h: &HfArgs) -> Result<Recipe, String> {
    let mut r = Recipe::new(a.seq.unwrap_or(2048));
    if r.seq == 0 || a.batch == 0 {
        return Err("--seq and --batch must be at least 1".into());
    }
    if a.gpus == 0 || h.tp == 0 {
        return Err("--gpus and --tp must be at least 1".into());
    }
    if !(0.0..1.0).contains(&a.headroom) {
        return Err(format!("--headroom {} must be in [0, 1)", a.headroom));
    }
    r.batch = a.batch;
    r.precision = h.precision;
    r.quant = h.quant;
    r.kbit_fp32_rest = h.prepare_kbit;
    r.quant_head = h.quant_head;
    if let Some(n) = h.dequant_bytes {
        r.dequant_bytes = n;
    }
    r.lora = a.lora_rank.map(|rank| Lora {
        rank,
        targets: h.lora_targets.clone(),
        dora: h.dora,
    });
    if r.quant == Quant::None && (h.quant_head || h.dequant_bytes.is_some()) {
        return Err(
            "--quant-head and --dequant-bytes describe quantised weights: give --quant nf4, nf4-dq or int8"
                .into(),
        );
    }
    if r.quant != Quant::None && r.lora.is_none() {
        return Err("--quant trains nothing without --lora-rank (the base is frozen)".into());
    }
    r.adapter_bytes = match h.adapter_dtype.as_str() {
        "fp32" => 4,
        "bf16" | "fp16" => 2,
        o => return Err(format!("--adapter-dtype {o}: use fp32 or bf16")),
    };
    r.lora_dropout = h.lora_dropout;
    r.fused_qkv = h.fused_qkv;
    r.optimizer = Optim::parse(&a.optimizer)?;
    r.paged = h.paged;
    r.optimizer_in_backward = h.optimizer_in_backward;
    r.foreach = !matches!(
        a.optimizer_impl,
        Some(OptimizerImpl::PerTensor | OptimizerImpl::Fused)
    );
    r.loss = h.loss;
    r.checkpointing = match (a.checkpointing, h.selective) {
        (true, _) => Checkpointing::Full,
        (_, true) => Checkpointing::Selective,
        _ => Checkpointing::None,
    };
    r.attention = match a.attention {
        Some(Attention::Naive) => AttnImpl::Eager,
        _ => AttnImpl::Sdpa,
    };
    r.dropout = a.dropout > 0.0;
    r.grad_accumulation = a.grad_accumulation.max(1);
    r.grads_persist = h.grads_persist;
    r.parallel = Parallel {
        dp: a.gpus,
        zero: a.zero_stage,
        offload_optimizer: h.offload_optimizer,
        offload_params: h.offload_params,
        tp: h.tp,
        sp: h.sp,
    };
    if let Some(c) = h.cuda_context {
        r.device.context = c;
    }
    Ok(r)
}

/// `--lora-targets` names that match no linear of the model: an error when none matches (peft
/// refuses them: "Target modules … not found in the base model"), else a warning naming those
/// left out. Either way the model's own names are said.
fn lora_targets(l: &Lora, arch: &memsight_analysis::estimate::arch::Arch) -> Result<(), String> {
    let unmatched = l.unmatched(arch);
    if unmatched.is_empty() {
        return Ok(());
    }
    let mut names: Vec<String> = Vec::new();
    for lin in arch.linears() {
        if !names.contains(&lin.name) {
            names.push(lin.name);
        }
    }
    let said = format!(
        "--lora-targets {}: no linear of this model's blocks has that name (its linears: {})",
        unmatched.join(","),
        names.join(",")
    );
    if l.wrapped(arch).is_empty() {
        return Err(said);
    }
    eprintln!("memsight estimate: {said}; left out of the adapters");
    Ok(())
}

/// Runs the `--hf-config` estimate.
pub fn run(a: &Args, hf: &HfArgs) -> ExitCode {
    let Some(path) = &hf.hf_config else {
        return fail("no --hf-config");
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return fail(format!("{}: {e}", path.display())),
    };
    let arch = match hf::parse(&text) {
        Ok(x) => x,
        Err(e) => return fail(format!("{}: {e}", path.display())),
    };
    let r = match recipe(a, hf) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Err(err) = r.lora.as_ref().map_or(Ok(()), |l| lora_targets(l, &arch)) {
        return fail(err);
    }
    let e = train::estimate(&arch, &r);
    if let Err(err) = crate::estimate::device_memory(a).and_then(|()| {
        let f = e.figures;
        let terms = e.terms.iter().map(|t| t.bytes);
        let largest = terms.chain([f.allocated, f.reserved, f.nvidia_smi]).max();
        crate::estimate::representable(largest.unwrap_or(0))
    }) {
        return fail(err);
    }
    let fit = a
        .device_memory
        .map(|d| train::fit(&arch, &r, d, a.headroom));
    if a.json {
        let v = serde_json::json!({ "arch": arch, "recipe": r, "estimate": e, "fit": fit });
        return match serde_json::to_string_pretty(&v) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(err) => fail(err),
        };
    }
    println!(
        "memsight estimate: {} ({}), {} params ({} trainable); seq {}, micro-batch {}",
        arch.class, arch.family, e.params, e.trainable_params, r.seq, r.batch
    );
    println!(
        "  {} precision, weights {}, optimizer {}{}, loss {}, checkpointing {}, attention {}",
        name(r.precision),
        match r.quant {
            Quant::None => "unquantised",
            Quant::Nf4 { double_quant: true } => "NF4 with double quantisation",
            Quant::Nf4 {
                double_quant: false,
            } => "NF4",
            Quant::Int8 => "int8",
        },
        name(r.optimizer),
        if r.paged { " (paged)" } else { "" },
        serde_json::to_value(r.loss)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_string))
            .unwrap_or_default(),
        name(r.checkpointing),
        name(r.attention)
    );
    let layout: Vec<String> = [
        r.quant_head
            .then(|| "LM head quantised with the blocks".to_string()),
        (r.quant != Quant::None)
            .then(|| format!("dequantised at {} bytes per weight", r.dequant_bytes)),
        r.fused_qkv
            .then(|| "q, k and v fused (one LoRA dropout)".to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !layout.is_empty() {
        println!("  {}", layout.join(", "));
    }
    if r.parallel.dp > 1 || r.parallel.tp > 1 {
        println!(
            "  {} data-parallel ranks (ZeRO-{}{}{}), tensor parallel {}{}",
            r.parallel.dp,
            r.parallel.zero,
            if r.parallel.offload_optimizer {
                ", optimizer offloaded"
            } else {
                ""
            },
            if r.parallel.offload_params {
                ", weights offloaded"
            } else {
                ""
            },
            r.parallel.tp,
            if r.parallel.sp {
                " with sequence parallel"
            } else {
                ""
            }
        );
    }
    println!("\n  per device:");
    for t in e.terms.iter().filter(|t| t.bytes > 0) {
        println!("  {:<52}{}", t.name, both(t.bytes));
    }
    println!(
        "  {:<52}{}",
        "activations one block keeps",
        both(e.activations_per_layer)
    );
    println!("\n  moments of a step (live bytes):");
    for m in &e.moments {
        let mark = if m.name == e.peak_moment {
            "  ← peak"
        } else {
            ""
        };
        println!("    {:<50}{}{mark}", m.name, both(m.bytes));
    }
    println!(
        "\n  {:<52}{}",
        "ALLOCATED peak (max_memory_allocated)",
        both(e.figures.allocated)
    );
    println!(
        "  {:<52}{}",
        "RESERVED by the caching allocator",
        both(e.figures.reserved)
    );
    println!("  {:<52}{}", "NVIDIA-SMI shows", both(e.figures.nvidia_smi));
    println!("\n  assumptions:");
    for s in &e.assumptions {
        println!("    - {s}");
    }
    match fit {
        Some(f) => println!(
            "\n  device {} with {:.0}% headroom: {} · largest micro-batch that fits: {} \
             (nvidia-smi figure plus {:.0}% for the estimate's own error; {} free at it by the estimate)",
            fmt_bytes(f.device),
            f.headroom * 100.0,
            if f.fits { "fits" } else { "does NOT fit" },
            f.max_micro_batch,
            f.margin * 100.0,
            fmt_bytes(f.free_at_max)
        ),
        None => println!("\n  pass --device-memory SIZE for the fit and the largest micro-batch"),
    }
    ExitCode::SUCCESS
}
