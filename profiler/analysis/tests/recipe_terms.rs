//! Each recipe flag is a term that moves the estimate the way its mechanism says: pure bf16 has
//! no master weights and mixed precision has 4 bytes more per parameter; NF4 stores 0.5 byte and
//! its constants; ZeRO stages shard states; a paged optimizer leaves the allocator's figures;
//! chunked cross-entropy and checkpointing cut activations; a quantised head is stored in 4 bits
//! and dequantised whole; a fused qkv makes one LoRA dropout copy; mixed precision keeps fp32
//! masters and moments of 2-byte adapters and steps from an fp32 copy of the gradients (one
//! ZeRO-3 sub-group at a time); ZeRO-3/FSDP holds gathered blocks in the forward and backward
//! but none at the optimizer step; the three figures are ordered.

use memsight_analysis::estimate::hf;
use memsight_analysis::estimate::lora::{Lora, Targets};
use memsight_analysis::estimate::recipe::{Checkpointing, Loss, Optim, Precision, Quant, Recipe};
use memsight_analysis::estimate::train::{self, ArchEstimate};

fn llama() -> memsight_analysis::estimate::arch::Arch {
    // Llama-2-7B's shape.
    hf::parse(
        r#"{"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":4096,
            "intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,
            "vocab_size":32000}"#,
    )
    .unwrap()
}

fn term(e: &ArchEstimate, prefix: &str) -> u64 {
    e.terms
        .iter()
        .find(|t| t.name.starts_with(prefix))
        .map(|t| t.bytes)
        .unwrap()
}

#[test]
fn llama_2_7b_has_its_published_parameter_count() {
    assert_eq!(llama().params(), 6_738_415_616);
}

#[test]
fn pure_bf16_keeps_no_master_weights_and_mixed_does() {
    let a = llama();
    let p = a.params();
    let mut r = Recipe::new(512);
    r.precision = Precision::Bf16;
    let pure = train::estimate(&a, &r);
    assert_eq!(term(&pure, "weights"), 2 * p);
    assert_eq!(
        term(&pure, "optimizer state"),
        4 * p,
        "AdamW moments in bf16"
    );
    r.precision = Precision::Mixed;
    let mixed = train::estimate(&a, &r);
    assert_eq!(term(&mixed, "weights"), 2 * p);
    assert_eq!(term(&mixed, "gradients"), 2 * p);
    assert_eq!(
        term(&mixed, "optimizer state"),
        12 * p,
        "fp32 master + two fp32 moments"
    );
    r.precision = Precision::Fp32;
    assert_eq!(term(&train::estimate(&a, &r), "optimizer state"), 8 * p);
}

#[test]
fn qlora_stores_half_a_byte_per_linear_weight_and_its_constants() {
    let a = llama();
    let mut r = Recipe::new(512);
    r.lora = Some(Lora {
        rank: 16,
        targets: Targets::AllLinear,
        dora: false,
    });
    r.quant = Quant::Nf4 { double_quant: true };
    let lin = a.linear_params();
    let lora = r.lora.as_ref().unwrap().params(&a);
    let e = train::estimate(&a, &r);
    let want = (lin as f64 * (0.5 + 1.0 / 64.0 + 4.0 / 16384.0)) as u64
        + (a.params() - lin) * 2
        + lora * 4;
    assert_eq!(term(&e, "weights"), want);
    r.quant = Quant::Nf4 {
        double_quant: false,
    };
    assert!(
        term(&train::estimate(&a, &r), "weights") > want,
        "fp32 absmax costs more"
    );
    assert_eq!(e.trainable_params, lora);
    assert!(term(&e, "dequantised") > 0);
}

#[test]
fn a_quantised_head_is_stored_in_four_bits_and_dequantised_whole() {
    // Fabric's bitsandbytes plugin quantises the untied LM head too, from fp16: the head's V·d
    // weights move from 2 bytes to NF4's 0.5625, and its dequantisation (fp16, then the cast to
    // bf16) is the largest transient, 4 bytes per weight.
    let a = llama();
    let mut r = Recipe::new(512);
    r.lora = Some(Lora {
        rank: 8,
        targets: Targets::QueryValue,
        dora: false,
    });
    r.quant = Quant::Nf4 {
        double_quant: false,
    };
    let plain = train::estimate(&a, &r);
    r.quant_head = true;
    r.dequant_bytes = 4;
    let fabric = train::estimate(&a, &r);
    let head = 32000 * 4096u64;
    let saved = term(&plain, "weights") - term(&fabric, "weights");
    let want = (head as f64 * (2.0 - 0.5625)) as u64;
    assert!(saved.abs_diff(want) <= 1, "{saved} vs {want}");
    assert_eq!(term(&fabric, "dequantised"), head * 4);
    assert_eq!(term(&plain, "dequantised"), 11008 * 4096 * 2);
}

#[test]
fn fused_qkv_makes_one_lora_dropout_copy_for_q_k_and_v() {
    // peft wraps q_proj, k_proj and v_proj separately, each with its own dropout: three dropped
    // copies and masks of the block's input; LitGPT's one qkv linear makes one.
    let a = llama();
    let mut r = Recipe::new(512);
    r.lora = Some(Lora {
        rank: 8,
        targets: Targets::AllLinear,
        dora: false,
    });
    r.lora_dropout = true;
    let separate = term(&train::estimate(&a, &r), "activations");
    r.fused_qkv = true;
    let fused = term(&train::estimate(&a, &r), "activations");
    // Two copies fewer per block and token: 2 · d · (2 bytes + a 1-byte mask).
    assert_eq!(separate - fused, 2 * 4096 * 3 * 32 * 512);
    r.lora_dropout = false;
    let no_dropout = term(&train::estimate(&a, &r), "activations");
    r.fused_qkv = false;
    assert_eq!(
        term(&train::estimate(&a, &r), "activations"),
        no_dropout,
        "without dropout the layout changes nothing"
    );
}

#[test]
fn zero_stages_shard_optimizer_then_gradients_then_weights() {
    let a = llama();
    let mut r = Recipe::new(512);
    r.precision = Precision::Mixed;
    r.parallel.dp = 8;
    let at = |stage: u8| {
        let mut r = r.clone();
        r.parallel.zero = stage;
        let e = train::estimate(&a, &r);
        (
            term(&e, "weights"),
            term(&e, "gradients"),
            term(&e, "optimizer state"),
        )
    };
    let p = a.params();
    assert_eq!(at(0), (2 * p, 2 * p, 12 * p));
    assert_eq!(at(1), (2 * p, 2 * p, (12 * p).div_ceil(8)));
    assert_eq!(at(2), (2 * p, (2 * p).div_ceil(8), (12 * p).div_ceil(8)));
    assert_eq!(at(3).0, (2 * p).div_ceil(8));
    r.parallel.zero = 2;
    r.parallel.offload_optimizer = true;
    assert_eq!(term(&train::estimate(&a, &r), "optimizer state"), 0);
}

/// ZeRO-3 (FSDP full shard) gathers blocks for the forward and the backward and reshards every
/// one before the optimizer steps (DeepSpeed's `step` calls `_partition_all_parameters()`
/// first; FSDP reshards each unit in its post-backward): the step's moment is the sharded states,
/// their gradients, the step's transient and the batch, and a block's backward holds the
/// gathered blocks on top of the sharded states.
#[test]
fn zero3_holds_gathered_blocks_in_the_backward_and_none_at_the_optimizer_step() {
    let a = llama();
    let mut r = Recipe::new(1024);
    r.precision = Precision::Mixed;
    r.checkpointing = Checkpointing::Full;
    r.parallel.zero = 3;
    r.parallel.dp = 2;
    let e = train::estimate(&a, &r);
    let moment = |name: &str| e.moments.iter().find(|m| m.name == name).unwrap().bytes;
    let gathered = term(&e, "ZeRO-3/FSDP gathered blocks");
    assert!(gathered > 0);
    let states = term(&e, "weights") + term(&e, "optimizer state (with master weights)");
    let batch = 16 * 1024;
    assert_eq!(
        moment("optimizer step"),
        states + term(&e, "gradients") + term(&e, "optimizer step transient") + batch
    );
    assert!(moment("backward, first block") > states + gathered + term(&e, "gradients"));
}

#[test]
fn paged_state_leaves_the_allocator_but_not_nvidia_smi() {
    let a = llama();
    let mut r = Recipe::new(512);
    r.optimizer = Optim::Adamw;
    let plain = train::estimate(&a, &r);
    r.paged = true;
    let paged = train::estimate(&a, &r);
    assert!(paged.figures.allocated < plain.figures.allocated);
    assert_eq!(term(&paged, "paged"), term(&plain, "optimizer state"));
    let f = paged.figures;
    assert!(f.allocated <= f.reserved && f.reserved < f.nvidia_smi);
}

#[test]
fn chunked_loss_and_checkpointing_cut_the_peak() {
    let a = llama();
    let mut r = Recipe::new(4096);
    r.batch = 4;
    let full = train::estimate(&a, &r).figures.allocated;
    r.loss = Loss::Chunked { positions: 1024 };
    let chunked = train::estimate(&a, &r).figures.allocated;
    assert!(chunked < full);
    r.checkpointing = Checkpointing::Selective;
    let selective = train::estimate(&a, &r).figures.allocated;
    r.checkpointing = Checkpointing::Full;
    let ckpt = train::estimate(&a, &r).figures.allocated;
    assert!(ckpt < selective && selective < chunked);
    // Optimizer-in-backward: at most one tensor's gradient at a time.
    r.optimizer_in_backward = true;
    let e = train::estimate(&a, &r);
    assert_eq!(term(&e, "gradients"), 32000 * 4096 * 2);
}

#[test]
fn tensor_parallel_splits_weights_and_activations() {
    let a = llama();
    let mut r = Recipe::new(2048);
    let one = train::estimate(&a, &r);
    r.parallel.tp = 4;
    let tp = train::estimate(&a, &r);
    assert_eq!(term(&tp, "weights"), term(&one, "weights") / 4);
    r.parallel.sp = true;
    let sp = train::estimate(&a, &r);
    assert!(sp.activations_per_layer < tp.activations_per_layer);
    assert!(tp.activations_per_layer < one.activations_per_layer);
}

#[test]
fn the_largest_suggested_micro_batch_fits_with_the_margin() {
    let a = llama();
    let mut r = Recipe::new(2048);
    r.lora = Some(Lora {
        rank: 16,
        targets: Targets::QueryValue,
        dora: false,
    });
    r.checkpointing = Checkpointing::Full;
    let device = 80u64 << 30;
    let f = train::fit(&a, &r, device, 0.1);
    assert!(f.max_micro_batch > 1);
    let mut at = r.clone();
    at.batch = f.max_micro_batch;
    let smi = train::estimate(&a, &at).figures.nvidia_smi as f64;
    assert!(smi * (1.0 + f.margin) <= device as f64 * 0.9);
    at.batch += 1;
    let next = train::estimate(&a, &at).figures.nvidia_smi as f64;
    assert!(next * (1.0 + f.margin) > device as f64 * 0.9);
}

#[test]
fn mixed_precision_steps_fp32_masters_from_an_fp32_gradient_copy() {
    let a = llama();
    let p = a.params();
    let mut r = Recipe::new(512);
    r.precision = Precision::Mixed;
    r.foreach = false;
    // ZeRO-2 on 4 GPUs: the step's transient adds 4 bytes per parameter of the partition
    // (DeepSpeed's `flat_grad_partition.to(fp32)`) to the per-tensor AdamW transient.
    r.parallel.zero = 2;
    r.parallel.dp = 4;
    let zero2 = term(&train::estimate(&a, &r), "optimizer step transient");
    r.precision = Precision::Bf16;
    let bf16 = term(&train::estimate(&a, &r), "optimizer step transient");
    assert_eq!(zero2, p.div_ceil(4) * 4 + bf16 * 2);
    // ZeRO-3 on one GPU: one sub-group of at most 1e9 elements at a time.
    r.precision = Precision::Mixed;
    r.parallel.zero = 3;
    r.parallel.dp = 1;
    let zero3 = term(&train::estimate(&a, &r), "optimizer step transient");
    assert_eq!(zero3 - bf16 * 2, 4_000_000_000);
    // 2-byte LoRA adapters under mixed precision: an fp32 master and two fp32 moments (12 bytes
    // per adapter parameter in the optimizer state), where pure bf16 keeps two 2-byte moments (4).
    r.parallel.zero = 0;
    r.lora = Some(Lora {
        rank: 64,
        targets: Targets::parse("all-linear").unwrap(),
        dora: false,
    });
    r.adapter_bytes = 2;
    let mixed = term(&train::estimate(&a, &r), "optimizer state");
    r.precision = Precision::Bf16;
    let pure = term(&train::estimate(&a, &r), "optimizer state");
    assert!(pure > 0);
    assert_eq!(mixed, pure * 3);
}
