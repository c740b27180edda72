//! Unit tests of the estimator: the seeds' numbers, the papers' per-layer formulas and the
//! mechanisms of the peak-moment model.

use super::*;

fn gpt(layers: u64, hidden: u64, heads: u64, seq: u64, batch: u64) -> EstimateInput {
    let mut i = EstimateInput::for_shape(ModelShape {
        layers,
        hidden,
        heads,
        vocab: 50257,
        positions: seq,
    });
    i.batch = batch;
    i
}

fn moment(e: &Estimate, name: &str) -> u64 {
    e.moments
        .iter()
        .find(|m| m.name == name)
        .map(|m| m.bytes)
        .unwrap_or_else(|| panic!("no moment {name}: {:?}", e.moments))
}

#[test]
fn autocast_keeps_the_residual_stream_in_fp32_and_softmax_by_device() {
    // B=1, S=4, d=8, H=2: one (B, S, d) tensor is 32 elements; 2 norms' mean and 1/std are
    // 4 fp32 rows each (64 B); the causal mask's bool is 16 B.
    let mut i = gpt(1, 8, 2, 4, 1);
    i.autocast = true;
    let e = estimate(&i);
    // CUDA: 2 fp32 tensors (128 B each) + 14 two-byte ones (64 B each) + scores 2·4·4·(4 + 2).
    assert_eq!(
        e.activations_per_layer_bytes,
        Some(2 * 128 + 14 * 64 + 192 + 64 + 16)
    );
    assert_eq!(e.activations_per_layer_checkpointed_bytes, Some(128));
    assert_eq!(e.attention_scores_bytes_per_layer, Some(192));
    // CPU autocast keeps softmax in bf16: scores 2·4·4·2.
    i.device = Device::Cpu;
    assert_eq!(estimate(&i).attention_scores_bytes_per_layer, Some(64));
    // Without autocast: all fp32, 16 tensors.
    i.autocast = false;
    assert_eq!(
        estimate(&i).activations_per_layer_bytes,
        Some(16 * 128 + 128 + 64 + 16)
    );
}

#[test]
fn korthikanti_34_sbh_plus_5_as2b_per_layer_with_dropout_on_cuda() {
    // Korthikanti et al. 2022, eq. (1): 2-byte activations, 1-byte dropout masks.
    let (s, b, h, a) = (512u64, 2u64, 256u64, 4u64);
    let mut i = gpt(1, h, a, s, b);
    i.dtype = Dtype::Bf16;
    i.activation_dtype = Dtype::Bf16;
    i.dropout = 0.1;
    let extra = 2 * 2 * b * s * 4 + s * s; // norm statistics and the causal mask's bool
    assert_eq!(
        estimate(&i).activations_per_layer_bytes,
        Some(s * b * h * 34 + 5 * a * s * s * b + extra)
    );
    // Without dropout: 32·sbh + 2·as²b (no masks, no dropped copy of the probabilities).
    i.dropout = 0.0;
    assert_eq!(
        estimate(&i).activations_per_layer_bytes,
        Some(s * b * h * 32 + 2 * a * s * s * b + extra)
    );
}

#[test]
fn fused_attention_keeps_its_output_once_and_a_log_sum_exp_per_row() {
    let mut i = gpt(1, 64, 4, 128, 2);
    i.attention = Attention::Efficient;
    let n = 2 * 128 * 64 * 4;
    assert_eq!(
        estimate(&i).activations_per_layer_bytes,
        Some(16 * n + 2 * 4 * 128 * 4 + 2 * 2 * 2 * 128 * 4)
    );
    assert_eq!(estimate(&i).buffers_bytes, 0);
}

#[test]
fn the_loss_backward_holds_16_bytes_per_logit_12_without_kept_logits_14_under_autocast() {
    let mut i = gpt(2, 128, 4, 128, 4);
    let x = 4 * 128 * 50257u64;
    let kept = estimate(&i);
    i.keep_logits = false;
    let dropped = estimate(&i);
    assert_eq!(kept.logits_bytes, Some(16 * x));
    assert_eq!(dropped.logits_bytes, Some(12 * x));
    assert_eq!(
        moment(&kept, "loss backward start") - moment(&dropped, "loss backward start"),
        4 * x
    );
    assert_eq!(kept.peak_moment, Some("loss backward start"));
    i.keep_logits = true;
    i.autocast = true;
    assert_eq!(estimate(&i).logits_bytes, Some(14 * x));
}

#[test]
fn the_optimizer_transient_follows_the_implementation() {
    let mut i = gpt(2, 128, 4, 128, 1);
    let p = estimate(&i).params;
    i.optimizer_impl = Some(OptimizerImpl::Foreach);
    assert_eq!(estimate(&i).optimizer_transient_bytes, 4 * p);
    i.optimizer_impl = Some(OptimizerImpl::PerTensor);
    assert_eq!(estimate(&i).optimizer_transient_bytes, 2 * 4 * 50257 * 128);
    let per_tensor = moment(&estimate(&i), "optimizer step");
    i.optimizer_impl = Some(OptimizerImpl::Fused);
    let fused = estimate(&i);
    assert_eq!(fused.optimizer_transient_bytes, 0);
    assert_eq!(
        per_tensor - moment(&fused, "optimizer step"),
        2 * 4 * 50257 * 128
    );
    // The device picks PyTorch's default.
    i.optimizer_impl = None;
    assert_eq!(estimate(&i).optimizer_transient_bytes, 4 * p);
    i.device = Device::Cpu;
    assert_eq!(estimate(&i).optimizer_transient_bytes, 2 * 4 * 50257 * 128);
}

#[test]
fn gradients_are_alive_in_forward_only_under_accumulation() {
    let mut i = gpt(2, 128, 4, 128, 4);
    let once = estimate(&i);
    i.grad_accumulation = 4;
    let acc = estimate(&i);
    assert_eq!(
        moment(&acc, "loss backward start") - moment(&once, "loss backward start"),
        once.gradients_bytes
    );
}

#[test]
fn checkpointing_does_not_stack_the_recomputed_block_on_the_loss_head() {
    let mut i = gpt(4, 128, 4, 128, 4);
    i.checkpointing = true;
    let e = estimate(&i);
    let kept = 4 * e.activations_per_layer_checkpointed_bytes.unwrap();
    let no_block = e.weights_bytes
        + e.buffers_bytes
        + e.optimizer_bytes
        + 2 * 4 * 128 * 8
        + kept
        + e.logits_bytes.unwrap();
    let head = moment(&e, "loss backward start");
    // The rest is the final norm's input and output and its statistics.
    assert_eq!(head - no_block, 2 * 4 * 128 * 128 * 4 + 2 * 4 * 128 * 4);
}

#[test]
fn chunked_efficient_attention_needs_its_block_workspace() {
    let mut i = gpt(2, 128, 4, 128, 16);
    i.attention = Attention::Efficient;
    let fused = estimate(&i);
    i.attention_block = Some(64);
    let chunked = estimate(&i);
    // 4 tensors of B·H·S·64 fp32 = 8 MiB more at the attention's backward.
    let at = |e: &Estimate| moment(e, "backward, last block's attention");
    assert_eq!(at(&chunked) - at(&fused), 4 * 16 * 4 * 128 * 64 * 4);
}

#[test]
fn seed_000_attention_scores_naive_and_efficient() {
    let mut i = gpt(12, 768, 12, 2048, 4);
    assert_eq!(
        estimate(&i).attention_scores_bytes_per_layer,
        Some(805_306_368)
    );
    // A fused kernel keeps its output (B·H·S·D) instead of the scores.
    i.attention = Attention::Efficient;
    assert_eq!(
        estimate(&i).attention_scores_bytes_per_layer,
        Some(25_165_824)
    );
}

#[test]
fn seed_002_32k_tokens_32_heads_is_128_gib_per_layer() {
    let i = gpt(32, 4096, 32, 32768, 1);
    assert_eq!(
        estimate(&i).attention_scores_bytes_per_layer,
        Some(128 << 30)
    );
}

#[test]
fn seeds_003_004_weights_are_params_times_dtype() {
    let mut i = EstimateInput::for_params(33_000_000_000);
    i.dtype = Dtype::Fp16;
    assert_eq!(estimate(&i).weights_bytes, 66_000_000_000);
    let mut i = EstimateInput::for_params(1_300_000_000);
    i.dtype = Dtype::Bf16;
    assert_eq!(estimate(&i).weights_bytes, 2_600_000_000);
}

#[test]
fn zero_shards_optimizer_gradients_then_weights() {
    let mut i = EstimateInput::for_params(1_000_000_000);
    i.gpus = 8;
    let base = estimate(&i);
    for (stage, o, g, w) in [
        (1u8, true, false, false),
        (2, true, true, false),
        (3, true, true, true),
    ] {
        i.zero_stage = stage;
        let e = estimate(&i);
        let shard = |b: u64, on: bool| if on { b.div_ceil(8) } else { b };
        assert_eq!(e.optimizer_bytes, shard(base.optimizer_bytes, o));
        assert_eq!(e.gradients_bytes, shard(base.gradients_bytes, g));
        assert_eq!(e.weights_bytes, shard(base.weights_bytes, w));
    }
}

#[test]
fn max_micro_batch_is_the_largest_that_fits() {
    for device in [Device::Cuda, Device::Cpu] {
        let mut i = gpt(12, 768, 12, 1024, 8);
        i.device = device;
        i.device_memory = Some(16 << 30);
        let m = estimate(&i).max_micro_batch.unwrap();
        assert!(m > 0);
        let budget = (16u64 << 30) as f64 * (1.0 - i.headroom);
        for (b, fits) in [(m, true), (m + 1, false)] {
            i.batch = b;
            let e = estimate(&i);
            let with_margin = e.peak_bytes as f64 * (1.0 + MODEL_MARGIN);
            assert_eq!(with_margin <= budget, fits, "batch {b}");
        }
        // The suggested batch fits the budget itself with the margin to spare.
        i.batch = m;
        assert_eq!(estimate(&i).fits, Some(true));
    }
}

#[test]
fn every_saving_lowers_the_peak() {
    let base = gpt(12, 768, 12, 1024, 8);
    let p = estimate(&base).peak_bytes;
    let variants: [fn(&mut EstimateInput); 7] = [
        |i| i.checkpointing = true,
        |i| i.attention = Attention::Efficient,
        |i| i.activation_dtype = Dtype::Bf16,
        |i| i.logits_to_keep = Some(1),
        |i| i.lora_rank = Some(8),
        |i| i.first_layers = Some(1),
        |i| i.keep_logits = false,
    ];
    for v in variants {
        let mut i = base.clone();
        v(&mut i);
        assert!(estimate(&i).peak_bytes < p, "{i:?}");
    }
}

#[test]
fn sdpa_math_fallback_peaks_in_the_checkpointed_recomputation() {
    // Issue 23's configuration: CPU, SDPA with dropout 0.1 (PyTorch's math fallback), autocast
    // bf16, checkpointing, AdamW foreach, logits kept. Measured with torch 2.11 (the harness):
    // 82,320,556 B at B = 32 and 146,930,860 B at B = 64, 2,019,072 B per sample, the peak at the
    // end of the recomputed last block's SDPA (the attention weights' cast back to bf16).
    let mut i = EstimateInput::for_shape(ModelShape {
        layers: 5,
        hidden: 144,
        heads: 6,
        vocab: 1000,
        positions: 96,
    });
    i.seq = 96;
    i.device = Device::Cpu;
    i.attention = Attention::Efficient;
    i.autocast = true;
    i.checkpointing = true;
    i.dropout = 0.1;
    i.optimizer_impl = Some(OptimizerImpl::Foreach);
    let mut at = |b: u64| {
        i.batch = b;
        estimate(&i)
    };
    let (e32, e64) = (at(32), at(64));
    assert_eq!(
        e64.peak_moment,
        Some("backward, last block's recomputed attention")
    );
    assert_eq!(e64.peak_bytes - e32.peak_bytes, 32 * 2_019_072);
    // Per sample: 76 B·S·d-sized bytes, 14 B·H·S² ones, the kept bf16 logits S·V·2, the batch
    // 2·S·8 and one norm's statistics S·8 (without the term: 78 and 12, the MLP's backward).
    let (n, sc) = (96 * 144, 6 * 96 * 96);
    assert_eq!(
        76 * n + 14 * sc + 96 * 1000 * 2 + 2 * 96 * 8 + 96 * 8,
        2_019_072
    );
    for (e, measured) in [(&e32, 82_320_556f64), (&e64, 146_930_860f64)] {
        let err = e.peak_bytes as f64 / measured - 1.0;
        assert!(err.abs() < 0.005, "{err}");
    }
    // Without autocast the fallback makes no casts: 5 fp32 B·H·S·D tensors and 3 score-sized
    // ones besides the q, k, v it is given, and the MLP's backward stays the peak (measured).
    i.autocast = false;
    i.batch = 64;
    let e = estimate(&i);
    assert_eq!(e.peak_moment, Some("backward, last block's MLP"));
}
