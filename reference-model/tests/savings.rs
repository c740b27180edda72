//! Every memory switch's saving, measured with the libtorch CPU tensor hook (exact bytes of every
//! tensor storage) against the baseline and held to the estimator's prediction: a switch fails
//! its test when its measured saving falls more than 10% below what `memsight estimate` predicts
//! for the same shape (`ablate::estimate_for`, as the ablation table uses). The hook is
//! process-wide, so the tests run one at a time.

use memsight::devices::tensors;
use memsight_analysis::estimate;
use memsight_gpt::ablate::estimate_for;
use memsight_gpt::config::{Attention, Config, Preset};
use memsight_gpt::model::Gpt;
use memsight_gpt::{attention, data, step};
use std::hint::black_box;
use std::sync::{Mutex, MutexGuard};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

// Heap bytes too (file buffers), for the loading peaks.
#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

static HOOK: Mutex<()> = Mutex::new(());

/// The tensor hook, installed once, held for one measurement at a time.
fn hook() -> MutexGuard<'static, ()> {
    memsight_integrations::torch::install_cpu_hook().expect("libtorch CPU hook");
    HOOK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The ablation's shape (tiny preset, S=128, B=16).
fn base() -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.attention = Attention::Naive;
    c
}

/// Tensor peak of two training steps of `cfg` (model, AdamW, forward, backward, step) above
/// what was alive before the model was built: the ablation's tensor-peak column, in process.
fn train_peak(cfg: &Config) -> u64 {
    let before = tensors::stats().expect("hook installed").live_bytes;
    tensors::reset_peak();
    {
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let lora_vs = nn::VarStore::new(Device::Cpu);
        let lr = lora_vs.root();
        let m = Gpt::new(
            &vs.root(),
            (cfg.lora_rank > 0).then_some(&lr),
            cfg.lora_rank,
            cfg.shape,
            None,
        );
        let opt_vs = if cfg.lora_rank > 0 {
            let mut v = vs;
            v.freeze();
            black_box(v);
            &lora_vs
        } else {
            black_box(&vs);
            &vs
        };
        let mut opt = nn::adamw(0.9, 0.95, 0.1).build(opt_vs, 1e-3).unwrap();
        let tokens = data::encode(data::CORPUS);
        for it in 0..2 {
            let (x, y) =
                data::make_batch(&tokens, 3, it, cfg.batch_size, cfg.seq_len).tensors(Device::Cpu);
            let accum = cfg.accumulation();
            for i in 0..accum {
                let rows = |t: &tch::Tensor| t.narrow(0, i * cfg.micro_batch, cfg.micro_batch);
                let keep = cfg.keep();
                black_box(
                    step::forward_backward(&m, cfg, &rows(&x), &rows(&y), keep, 1.0 / accum as f64)
                        .unwrap(),
                );
            }
            opt.step();
            opt.zero_grad();
        }
    }
    tensors::stats().unwrap().peak_bytes.saturating_sub(before)
}

fn predicted(cfg: &Config) -> u64 {
    estimate::estimate(&estimate_for(cfg)).peak_bytes
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / 1048576.0)
}

/// Measures the baseline and `switched`, and fails when the measured saving is below 90% of the
/// estimator's predicted saving.
fn assert_saving(what: &str, switched: &Config) {
    assert_saving_from(what, &base(), switched)
}

fn assert_saving_from(what: &str, b: &Config, switched: &Config) {
    assert_saving_between(what, b, switched, 0.0)
}

/// As [`assert_saving`], with the prediction lowered by `cost` bytes the switch spends where the
/// estimator does not model it (said at the call).
fn assert_saving_less(what: &str, switched: &Config, cost: f64) {
    assert_saving_between(what, &base(), switched, cost)
}

fn assert_saving_between(what: &str, b: &Config, switched: &Config, cost: f64) {
    let _h = hook();
    let (mb, ms) = (train_peak(b), train_peak(switched));
    let (pb, ps) = (predicted(b), predicted(switched));
    let measured = mb as f64 - ms as f64;
    let want = pb as f64 - ps as f64 - cost;
    eprintln!(
        "{what}: measured {} → {} (saves {}), estimator {} → {} (saves {} less {} it does not model)",
        mib(mb as f64),
        mib(ms as f64),
        mib(measured),
        mib(pb as f64),
        mib(ps as f64),
        mib(want + cost),
        mib(cost)
    );
    assert!(want > 0.0, "{what}: the estimator predicts no saving");
    assert!(
        measured >= 0.9 * want,
        "{what} saves {} of tensor peak, the estimator predicts {}: more than 10% short",
        mib(measured),
        mib(want)
    );
}

#[test]
fn efficient_attention_saves_what_the_estimator_predicts() {
    let mut c = base();
    c.attention = Attention::Efficient;
    assert_saving("attention=efficient", &c);
}

#[test]
fn sdpa_saves_what_the_estimator_predicts() {
    let mut c = base();
    c.attention = Attention::Sdpa;
    assert_saving("attention=sdpa", &c);
}

#[test]
fn checkpointing_saves_what_the_estimator_predicts() {
    let mut c = base();
    c.checkpoint = true;
    assert_saving("checkpoint", &c);
}

#[test]
fn bf16_saves_what_the_estimator_predicts() {
    let mut c = base();
    c.bf16 = true;
    assert_saving("bf16", &c);
}

#[test]
fn micro_batches_save_what_the_estimator_predicts() {
    let mut c = base();
    c.micro_batch = 4;
    assert_saving("micro-batch 4", &c);
}

#[test]
fn lora_saves_what_the_estimator_predicts() {
    let mut c = base();
    c.lora_rank = 8;
    // The estimator's LoRA adapts the attention projections only; ours adapts the MLP's two as
    // well. Their cost comes off the predicted saving: the MLP adapters' weights, gradients and
    // two AdamW moments, and every adapter's kept rank-r activation (B·S·r fp32 per projection).
    let (d, r, layers) = (c.shape.n_embd, c.lora_rank, c.shape.n_layer);
    let mlp_adapters = layers * 2 * r * (d + 4 * d) * 4 * 4;
    let rank_activations = layers * 4 * c.micro_batch * c.seq_len * r * 4;
    assert_saving_less("LoRA r=8", &c, (mlp_adapters + rank_activations) as f64);
}

#[test]
fn logits_to_keep_saves_what_the_estimator_predicts_with_a_bpe_sized_vocabulary() {
    // GPT-2's 50 257-entry head: B·S·V fp32 logits are 98 MiB at B=4, S=128, and the loss's
    // backward holds several of them; keeping the last 8 positions leaves B·8·V. (With the byte
    // vocabulary's 256 entries the logits are 0.5 MiB and no saving can show.)
    let mut b = base();
    b.shape.vocab_size = 50257;
    b.batch_size = 4;
    b.micro_batch = 4;
    let mut k = b.clone();
    k.logits_to_keep = 8;
    assert_saving_from("logits_to_keep 8 of 128, V=50257", &b, &k);
}

/// Tensor peak above the inputs of one attention core's forward and backward at (B, H, S, D).
fn attention_peak(mode: Attention, (b, h, s, d): (i64, i64, i64, i64), block: i64) -> u64 {
    tch::manual_seed(2);
    let r = || Tensor::randn([b, h, s, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (q, k, v, g) = (r(), r(), r(), r().detach());
    let before = tensors::stats().unwrap().live_bytes;
    tensors::reset_peak();
    match mode {
        Attention::Efficient => {
            let o = attention::efficient_forward(&q, &k, &v, block);
            let _ = black_box(attention::efficient_backward(&q, &k, &v, &o, &g, block));
        }
        _ => {
            let o = attention::attend(&q, &k, &v, mode, block);
            (o * &g).sum(Kind::Float).backward();
            let _ = black_box(q.grad());
        }
    }
    tensors::stats().unwrap().peak_bytes.saturating_sub(before)
}

#[test]
fn efficient_attention_never_holds_the_s_by_s_scores() {
    let _h = hook();
    // B=1, H=4, S=1024, D=32: naive's fp32 scores are 16 MiB; a 64-row tile is 1 MiB.
    let shape = (1, 4, 1024, 32);
    let (b, h, s, d) = shape;
    let block = 64;
    let naive = attention_peak(Attention::Naive, shape, block);
    let eff = attention_peak(Attention::Efficient, shape, block);
    let scores = attention::score_bytes(Attention::Naive, b, h, s, block, 4) as u64;
    let tile = attention::score_bytes(Attention::Efficient, b, h, s, block, 4) as u64;
    let qsized = (b * h * s * d * 4) as u64;
    // The estimator's figure for attention by tiles: four tiles at once (scores, probabilities
    // and their gradients), besides q-sized buffers (scaled q, output, dq, dk, dv, temporaries).
    let bound = 4 * tile + 8 * qsized;
    eprintln!(
        "attention fwd+bwd peak: naive {}, efficient {} (bound {}, S×S scores {})",
        mib(naive as f64),
        mib(eff as f64),
        mib(bound as f64),
        mib(scores as f64)
    );
    assert!(naive >= scores, "naive holds its S×S scores");
    assert!(
        eff <= bound && eff < scores,
        "efficient attention's peak {} exceeds {} (4 tiles + 8 q-sized buffers): S×S scores kept?",
        mib(eff as f64),
        mib(bound as f64)
    );
    // Doubling S doubles the efficient peak (tiles grow with S), where naive's quadruples.
    let eff2 = attention_peak(Attention::Efficient, (b, h, 2 * s, d), block);
    assert!(
        (eff2 as f64) < 2.5 * eff as f64,
        "efficient peak grows faster than S: {} → {}",
        mib(eff as f64),
        mib(eff2 as f64)
    );
}

/// A tiny-preset model (4 heads) and a 512-token input for the map tests.
fn map_model() -> (nn::VarStore, Gpt, Tensor) {
    tch::manual_seed(5);
    let mut shape = Preset::Tiny.shape();
    shape.block_size = 512;
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Gpt::new(&vs.root(), None, 0, shape, Some(1));
    let tokens: Vec<i64> = data::encode(data::CORPUS)[..512]
        .iter()
        .map(|&b| b as i64)
        .collect();
    (vs, m, Tensor::from_slice(&tokens).view([1, -1]))
}

/// Tensor peak above what was alive before `f`.
fn peak_of(f: impl FnOnce()) -> u64 {
    let before = tensors::stats().unwrap().live_bytes;
    tensors::reset_peak();
    f();
    tensors::stats().unwrap().peak_bytes.saturating_sub(before)
}

fn chunk_peak(m: &Gpt, idx: &Tensor, chunk: i64) -> u64 {
    peak_of(|| {
        tch::no_grad(|| {
            let x = m.embed(idx, 0);
            m.blocks[0].for_each_map_chunk(&x, chunk, |_, t| {
                let _ = black_box(t);
            })
        })
    })
}

/// Tensor peak of what the map computations share without any map: the layer input and q, k, v.
fn no_map_peak(m: &Gpt, idx: &Tensor) -> u64 {
    peak_of(|| {
        tch::no_grad(|| {
            let x = m.embed(idx, 0);
            let _ = black_box(m.blocks[0].qkv(&x));
        })
    })
}

#[test]
fn head_chunked_maps_save_the_unchunked_share_of_the_map_memory() {
    let _h = hook();
    let (_vs, m, idx) = map_model();
    let h = m.shape.n_head;
    let base = no_map_peak(&m, &idx);
    let full = chunk_peak(&m, &idx, h);
    // The maps' own memory (scores, masked scores, probabilities of all heads at once), measured.
    let maps = (full - base) as f64;
    for chunk in [1, 2] {
        let peak = chunk_peak(&m, &idx, chunk);
        // Chunks of `chunk` heads hold chunk/H of it: the rest is saved. Concatenating the chunks
        // into (B, H, S, S) would keep all H heads' maps and lose most of the saving.
        let want = maps * (1.0 - chunk as f64 / h as f64);
        let saved = full as f64 - peak as f64;
        eprintln!(
            "maps in chunks of {chunk}: peak {} vs {} for all {h} heads, {} without maps (saves {}, ÷ H/chunk of the map memory predicts {})",
            mib(peak as f64),
            mib(full as f64),
            mib(base as f64),
            mib(saved),
            mib(want)
        );
        assert!(
            saved >= 0.9 * want,
            "chunks of {chunk} save {} of {} map memory, ÷ H/chunk predicts {}: full maps kept?",
            mib(saved),
            mib(maps),
            mib(want)
        );
    }
}

#[test]
fn sampling_mode_never_builds_the_full_maps() {
    let _h = hook();
    let (_vs, m, idx) = map_model();
    let (h, s, rows) = (m.shape.n_head, 512, 16);
    let base = no_map_peak(&m, &idx);
    let full = chunk_peak(&m, &idx, h);
    let sampled = peak_of(|| {
        let _ = black_box(memsight_gpt::analyze::sampled_maps(&m, &idx, 0, rows));
    });
    // rows of S query rows: rows/S of the maps' memory.
    let want = (full - base) as f64 * (1.0 - rows as f64 / s as f64);
    let saved = full as f64 - sampled as f64;
    eprintln!(
        "sampling {rows} of {s} rows: peak {} vs {} for the full maps, {} without maps (saves {}, predicted {})",
        mib(sampled as f64),
        mib(full as f64),
        mib(base as f64),
        mib(saved),
        mib(want)
    );
    assert!(
        saved >= 0.9 * want,
        "sampling saves {}, {rows}/{s} of the map memory predicts {}: full maps built?",
        mib(saved),
        mib(want)
    );
}

#[test]
fn first_layer_only_loading_reads_only_what_it_needs() {
    let _h = hook();
    // The small preset (6 layers × 384): the first layer is ~18% of the parameters.
    let shape = Preset::Small.shape();
    let dir = std::env::temp_dir().join(format!("memsight-gpt-savings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("small.safetensors");
    {
        tch::manual_seed(9);
        let vs = nn::VarStore::new(Device::Cpu);
        let _m = Gpt::new(&vs.root(), None, 0, shape, None);
        vs.save(&ckpt).unwrap();
    }
    let measure = |first: bool| {
        let heap0 = memsight::stats().live_bytes;
        memsight::reset_peak();
        let t = peak_of(|| {
            if first {
                black_box(memsight_gpt::analyze::load_first_layers(&ckpt, shape, 1).unwrap());
            } else {
                black_box(memsight_gpt::analyze::load_whole(&ckpt, shape).unwrap());
            }
        });
        let heap = memsight::stats().peak_bytes.saturating_sub(heap0);
        (t, heap)
    };
    let (t_full, h_full) = measure(false);
    let (t_first, h_first) = measure(true);
    std::fs::remove_dir_all(&dir).unwrap();
    let weights = |layers: Option<u64>| {
        let mut e = estimate::EstimateInput::for_shape(shape_of(shape));
        e.optimizer = estimate::Optimizer::None;
        e.first_layers = layers;
        estimate::estimate(&e).weights_bytes as f64
    };
    let want = weights(None) - weights(Some(1));
    let saved = t_full as f64 - t_first as f64;
    eprintln!(
        "loading: tensors {} → {}, heap {} → {} (estimator's weights saving {})",
        mib(t_full as f64),
        mib(t_first as f64),
        mib(h_full as f64),
        mib(h_first as f64),
        mib(want)
    );
    assert!(
        saved >= 0.9 * want,
        "first-layer loading saves {} of tensors, the estimator predicts {}",
        mib(saved),
        mib(want)
    );
    let (full, first) = ((t_full + h_full) as f64, (t_first + h_first) as f64);
    assert!(
        first <= 0.2 * full,
        "first-layer loading peak {} is not ≥ 80% below the whole model's {}",
        mib(first),
        mib(full)
    );
}

fn shape_of(s: memsight_gpt::config::ModelShape) -> estimate::ModelShape {
    s.to_estimate()
}

/// The estimator's attention-score bytes of one layer for `cfg` at sequence length `seq`.
fn predicted_scores(cfg: &Config, seq: i64) -> f64 {
    let mut e = estimate_for(cfg);
    e.seq = seq as u64;
    estimate::estimate(&e)
        .attention_scores_bytes_per_layer
        .unwrap_or(0) as f64
}

#[test]
fn eval_segments_save_what_the_estimator_predicts() {
    let _h = hook();
    let cfg = base();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Gpt::new(&vs.root(), None, 0, cfg.shape, None);
    let tokens = data::encode(data::CORPUS);
    let (x, y) = data::make_batch(&tokens, 4, 0, cfg.micro_batch, cfg.seq_len).tensors(Device::Cpu);
    let eval = |segment: i64| {
        peak_of(|| {
            black_box(step::evaluate(&m, &cfg, &x, &y, segment).unwrap());
        })
    };
    let (whole, seg) = (eval(cfg.seq_len), eval(32));
    // The estimator's forward-only peak models a forward that keeps its graph and a KV cache
    // (inference), not a no_grad evaluation, which keeps neither: the prediction held to here
    // is its score memory of one layer at S against the segment's (scores are what a naive
    // evaluation's peak is made of).
    let want = predicted_scores(&cfg, cfg.seq_len) - predicted_scores(&cfg, 32);
    let saved = whole as f64 - seg as f64;
    eprintln!(
        "evaluation in segments of 32 of {}: peak above the model {} → {} (saves {}, estimator {})",
        cfg.seq_len,
        mib(whole as f64),
        mib(seg as f64),
        mib(saved),
        mib(want)
    );
    assert!(want > 0.0);
    assert!(
        saved >= 0.9 * want,
        "segments save {}, the estimator predicts {}",
        mib(saved),
        mib(want)
    );
}

#[test]
fn weight_quantization_saves_what_the_estimator_predicts() {
    let _h = hook();
    let mut cfg = base();
    cfg.shape.n_embd = 64; // int4 packing needs in % 32 == 0 and out % 16 == 0
    for bits in [8u8, 4] {
        let before = tensors::stats().unwrap().live_bytes;
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut m = Gpt::new(&vs.root(), None, 0, cfg.shape, None);
        let fp32 = tensors::stats().unwrap().live_bytes - before;
        m.quantize(bits).unwrap();
        drop(vs);
        let quant = tensors::stats().unwrap().live_bytes - before;
        black_box(&m);
        let weights = |q: Option<u8>| {
            let mut e = estimate_for(&cfg);
            e.optimizer = estimate::Optimizer::None;
            e.quant_bits = q;
            estimate::estimate(&e).weights_bytes as f64
        };
        let want = weights(None) - weights(Some(bits));
        let saved = fp32 as f64 - quant as f64;
        eprintln!(
            "int{bits}: weights {} → {} (saves {}, estimator {})",
            mib(fp32 as f64),
            mib(quant as f64),
            mib(saved),
            mib(want)
        );
        assert!(
            saved >= 0.9 * want,
            "int{bits} saves {}, the estimator predicts {}",
            mib(saved),
            mib(want)
        );
    }
}
