//! Every parity claim of the reference model's switches, on small CPU shapes in fp32: attention
//! modes agree (forward and gradients), checkpointing and the segmented efficient-attention path
//! give the plain run's gradients, gradient accumulation equals the big batch, logits_to_keep's
//! loss equals the full loss on those positions, chunked evaluation equals evaluating each segment,
//! bf16 autocast keeps LayerNorm/softmax/loss in fp32, LoRA trains only its adapters, and the data
//! loader's batches do not depend on its workers or prefetch.

use memsight_gpt::attention::{self, efficient_backward, efficient_forward};
use memsight_gpt::config::{Attention, Config, Preset};
use memsight_gpt::data::{self, Loader};
use memsight_gpt::model::{self, Gpt};
use memsight_gpt::step;
use std::sync::{Arc, Mutex, MutexGuard};

/// libtorch's generator is process-wide: tests that seed it and draw from it run one at a time.
static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|p| p.into_inner())
}
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn qkv(seed: i64) -> (Tensor, Tensor, Tensor) {
    tch::manual_seed(seed);
    let r = || Tensor::randn([2, 3, 37, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    (r(), r(), r())
}

fn grads_of(mode: Attention, g: &Tensor) -> (Tensor, [Tensor; 3]) {
    let (q, k, v) = qkv(7);
    let o = attention::attend(&q, &k, &v, mode, 8);
    (o * g).sum(Kind::Float).backward();
    let o = tch::no_grad(|| attention::attend(&q, &k, &v, mode, 8));
    (o, [q.grad(), k.grad(), v.grad()])
}

#[test]
fn attention_modes_agree_forward_and_gradients() {
    let _rng = rng();
    tch::manual_seed(3);
    let g = Tensor::randn([2, 3, 37, 8], (Kind::Float, Device::Cpu));
    let (o_naive, g_naive) = grads_of(Attention::Naive, &g);
    for mode in [Attention::Efficient, Attention::Sdpa] {
        let (o, gr) = grads_of(mode, &g);
        assert!(max_diff(&o, &o_naive) < 1e-5, "{mode:?} forward differs");
        for (a, b) in gr.iter().zip(&g_naive) {
            assert!(
                max_diff(a, b) < 1e-5,
                "{mode:?} gradient differs: {}",
                max_diff(a, b)
            );
        }
    }
    // The efficient path's own backward (no autograd through the block loop) gives the same grads.
    // Tiles of one row, of rows that do not divide S, and one tile larger than S.
    let (q, k, v) = qkv(7);
    for block in [1, 5, 8, 64] {
        let o = efficient_forward(&q, &k, &v, block);
        assert!(max_diff(&o, &o_naive) < 1e-5, "block {block}: forward");
        let (dq, dk, dv) = efficient_backward(&q, &k, &v, &o, &g, block);
        for (a, b) in [dq, dk, dv].iter().zip(&g_naive) {
            assert!(
                max_diff(a, b) < 1e-5,
                "block {block}: efficient backward differs: {}",
                max_diff(a, b)
            );
        }
    }
}

#[test]
fn seed_000_score_memory_claim() {
    let _rng = rng();
    // B=4, S=2048, H=12, fp32: 805 MB of scores per layer naive, 25 MB with 64-key blocks.
    assert_eq!(
        attention::score_bytes(Attention::Naive, 4, 12, 2048, 64, 4),
        805_306_368
    );
    assert_eq!(
        attention::score_bytes(Attention::Efficient, 4, 12, 2048, 64, 4),
        25_165_824
    );
}

fn tiny_cfg() -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.shape.n_layer = 2;
    c.shape.n_embd = 32;
    c.shape.n_head = 4;
    c.shape.block_size = 24;
    c.seq_len = 24;
    c.batch_size = 4;
    c.micro_batch = 4;
    c.attention = Attention::Naive;
    c.attention_block = 5;
    c
}

fn model(cfg: &Config, rank: i64) -> (nn::VarStore, nn::VarStore, Gpt) {
    tch::manual_seed(11);
    let vs = nn::VarStore::new(Device::Cpu);
    let lora = nn::VarStore::new(Device::Cpu);
    let lr = lora.root();
    let m = Gpt::new(&vs.root(), (rank > 0).then_some(&lr), rank, cfg.shape, None);
    (vs, lora, m)
}

fn batch(cfg: &Config, n: u64, rows: i64) -> (Tensor, Tensor) {
    let tokens = data::encode(data::CORPUS);
    data::make_batch(&tokens, 5, n, rows, cfg.seq_len).tensors(Device::Cpu)
}

/// Gradients of every parameter after one forward/backward of `cfg` on batch 0.
fn grads(cfg: &Config) -> Vec<(String, Tensor)> {
    let (vs, _l, m) = model(cfg, 0);
    let (x, y) = batch(cfg, 0, cfg.batch_size);
    step::forward_backward(&m, cfg, &x, &y, None, 1.0).unwrap();
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, t)| (k, t.grad().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn assert_same_grads(a: &[(String, Tensor)], b: &[(String, Tensor)], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len());
    for ((na, ga), (_, gb)) in a.iter().zip(b) {
        let d = max_diff(ga, gb);
        assert!(d < tol, "{what}: gradient of {na} differs by {d}");
    }
}

#[test]
fn checkpointing_and_efficient_training_give_the_plain_gradients() {
    let _rng = rng();
    let plain = grads(&tiny_cfg());
    assert!(
        plain.iter().any(|(n, _)| n == "h.0.attn.c_attn.weight"),
        "GPT-2 names"
    );
    for (ckpt, mode) in [
        (true, Attention::Naive),
        (true, Attention::Sdpa),
        (false, Attention::Efficient),
        (true, Attention::Efficient),
    ] {
        let mut c = tiny_cfg();
        c.checkpoint = ckpt;
        c.attention = mode;
        assert_same_grads(
            &plain,
            &grads(&c),
            1e-5,
            &format!("checkpoint={ckpt} {mode:?}"),
        );
    }
}

#[test]
fn gradient_accumulation_equals_the_big_batch() {
    let _rng = rng();
    let cfg = tiny_cfg();
    let (vs_big, _a, m_big) = model(&cfg, 0);
    let (x, y) = batch(&cfg, 0, 4);
    step::forward_backward(&m_big, &cfg, &x, &y, None, 1.0).unwrap();
    let (vs_acc, _b, m_acc) = model(&cfg, 0);
    for i in 0..2 {
        let (xs, ys) = (x.narrow(0, 2 * i, 2), y.narrow(0, 2 * i, 2));
        step::forward_backward(&m_acc, &cfg, &xs, &ys, None, 0.5).unwrap();
    }
    let big = vs_big.variables();
    for (name, t) in vs_acc.variables() {
        let d = max_diff(&t.grad(), &big[&name].grad());
        assert!(d < 1e-5, "{name}: accumulated gradient differs by {d}");
    }
}

#[test]
fn logits_to_keep_gives_the_same_loss_on_those_positions() {
    let _rng = rng();
    let cfg = tiny_cfg();
    let (_vs, _l, m) = model(&cfg, 0);
    let (x, y) = batch(&cfg, 1, 2);
    tch::no_grad(|| {
        let full = m.forward(&x, cfg.attention, 5, None);
        let kept = m.forward(&x, cfg.attention, 5, Some(3));
        assert_eq!(kept.size(), vec![2, 3, 256]);
        let tail = full.narrow(1, 21, 3);
        assert!(max_diff(&kept, &tail) < 1e-6);
        let l_kept = model::loss(&kept, &y.narrow(1, 21, 3)).double_value(&[]);
        let l_tail = model::loss(&tail, &y.narrow(1, 21, 3)).double_value(&[]);
        assert!((l_kept - l_tail).abs() < 1e-6);
    });
}

#[test]
fn chunked_evaluation_equals_evaluating_each_segment() {
    let _rng = rng();
    let cfg = tiny_cfg();
    let (_vs, _l, m) = model(&cfg, 0);
    let (x, y) = batch(&cfg, 2, 2);
    let chunked = step::evaluate(&m, &cfg, &x, &y, 10).unwrap();
    // Segments of 10, 10 and 4 tokens, each its own sequence, weighted by length.
    let mut want = 0.0;
    for (p0, len) in [(0, 10), (10, 10), (20, 4)] {
        let l = tch::no_grad(|| {
            let logits = m.forward(&x.narrow(1, p0, len), cfg.attention, 5, None);
            model::loss(&logits, &y.narrow(1, p0, len)).double_value(&[])
        });
        want += l * len as f64 / 24.0;
    }
    assert!((chunked - want).abs() < 1e-6, "{chunked} vs {want}");
    let whole = step::evaluate(&m, &cfg, &x, &y, 24).unwrap();
    let direct =
        tch::no_grad(|| model::loss(&m.forward(&x, cfg.attention, 5, None), &y).double_value(&[]));
    assert!((whole - direct).abs() < 1e-6);
}

#[test]
fn bf16_autocast_keeps_norms_softmax_and_loss_in_fp32() {
    let _rng = rng();
    let cfg = tiny_cfg();
    let (_vs, _l, m) = model(&cfg, 0);
    let (x, y) = batch(&cfg, 3, 2);
    let mut bf = cfg.clone();
    bf.bf16 = true;
    let fp32 =
        tch::no_grad(|| model::loss(&m.forward(&x, cfg.attention, 5, None), &y).double_value(&[]));
    let (kinds, l16) = tch::no_grad(|| {
        step::maybe_autocast(&bf, Device::Cpu, || {
            let e = m.embed(&x, 0);
            let (q, _, _) = m.blocks[0].qkv(&e);
            let logits = m.forward(&x, cfg.attention, 5, None);
            let l = model::loss(&logits, &y);
            ((q.kind(), logits.kind(), l.kind()), l.double_value(&[]))
        })
        .unwrap()
    });
    assert_eq!(kinds.0, Kind::BFloat16, "projections run in bf16");
    assert_eq!(kinds.1, Kind::BFloat16, "the LM head runs in bf16");
    assert_eq!(kinds.2, Kind::Float, "the loss is fp32");
    assert!(
        (fp32 - l16).abs() < 0.05,
        "bf16 loss {l16} far from fp32 {fp32}"
    );
    assert!(
        !memsight_integrations::torch::autocast_enabled(Device::Cpu),
        "autocast restored"
    );
    // LayerNorm and softmax stay fp32 under autocast, whatever their input's dtype.
    let (ln, probs) = step::maybe_autocast(&bf, Device::Cpu, || {
        let vs = nn::VarStore::new(Device::Cpu);
        let norm = model::LayerNorm::new(&vs.root(), 32);
        let xb = Tensor::randn([2, 5, 32], (Kind::BFloat16, Device::Cpu));
        let q = Tensor::randn([1, 2, 5, 8], (Kind::BFloat16, Device::Cpu));
        let p = attention::causal_probs(&q, &q, &attention::positions(&q));
        (norm.forward(&xb).kind(), p.kind())
    })
    .unwrap();
    assert_eq!(
        (ln, probs),
        (Kind::Float, Kind::Float),
        "LayerNorm output, softmax probabilities"
    );
    // Gradients: fp32 (the parameters' dtype) and close to the fp32 run's, on the plain and the
    // segmented (efficient + checkpoint) paths.
    let fp32_grads = grads(&cfg);
    for (ckpt, mode) in [(false, Attention::Naive), (true, Attention::Efficient)] {
        let mut c = bf.clone();
        c.checkpoint = ckpt;
        c.attention = mode;
        for ((n, g16), (_, g32)) in grads(&c).iter().zip(&fp32_grads) {
            assert_eq!(g16.kind(), Kind::Float, "{n}'s gradient dtype");
            let rel =
                (g16 - g32).norm().double_value(&[]) / g32.norm().double_value(&[]).max(1e-12);
            assert!(
                rel < 0.05,
                "{mode:?} bf16 gradient of {n} off by {rel:.3} (relative)"
            );
        }
    }
}

#[test]
fn lora_trains_only_the_adapters_and_starts_equal_to_the_base() {
    let _rng = rng();
    let cfg = tiny_cfg();
    let (mut vs_lora, lora, m_lora) = model(&cfg, 4);
    let (mut vs_base, _l, m_base) = model(&cfg, 0);
    vs_base.copy(&vs_lora).unwrap();
    let (x, y) = batch(&cfg, 4, 2);
    tch::no_grad(|| {
        let a = m_lora.forward(&x, cfg.attention, 5, None);
        let b = m_base.forward(&x, cfg.attention, 5, None);
        assert!(max_diff(&a, &b) < 1e-6, "adapters start at zero");
    });
    vs_lora.freeze();
    let names: Vec<String> = lora.variables().into_keys().collect();
    assert_eq!(
        names.len(),
        2 * 4 * 2,
        "A and B on c_attn, c_proj, c_fc, mlp c_proj of 2 layers"
    );
    assert!(names.iter().all(|n| n.contains("lora_")));
    assert!(
        vs_lora.variables().values().all(|t| !t.requires_grad()),
        "the base is frozen"
    );
    let base_w = vs_lora.variables()["h.0.attn.c_attn.weight"].copy();
    // The segmented path (checkpoint + efficient attention) gives the adapters the same gradients.
    let mut seg = cfg.clone();
    seg.checkpoint = true;
    seg.attention = Attention::Efficient;
    step::forward_backward(&m_lora, &seg, &x, &y, None, 1.0).unwrap();
    let seg_grads: Vec<(String, Tensor)> = lora
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.grad().copy()))
        .collect();
    for t in lora.variables().values() {
        let _ = t.grad().zero_();
    }
    let mut opt = nn::adamw(0.9, 0.95, 0.0).build(&lora, 1e-2).unwrap();
    step::forward_backward(&m_lora, &cfg, &x, &y, None, 1.0).unwrap();
    let vars = lora.variables();
    for (n, g) in &seg_grads {
        let d = max_diff(g, &vars[n].grad());
        assert!(
            d < 1e-5,
            "LoRA gradient of {n} differs by {d} on the segmented path"
        );
    }
    opt.step();
    assert_eq!(
        max_diff(&base_w, &vs_lora.variables()["h.0.attn.c_attn.weight"]),
        0.0
    );
    let b_after = &lora.variables()["h.0.attn.c_attn.lora_b"];
    assert!(
        b_after.abs().sum(Kind::Float).double_value(&[]) > 0.0,
        "the adapter moved"
    );
}

#[test]
fn loader_batches_do_not_depend_on_workers_or_prefetch() {
    let _rng = rng();
    let tokens = Arc::new(data::encode(data::CORPUS));
    let take = |workers, prefetch| {
        let mut l = Loader::new(Arc::clone(&tokens), 9, 3, 16, workers, prefetch);
        (0..7)
            .map(|_| l.next_batch().unwrap().x)
            .collect::<Vec<_>>()
    };
    let one = take(1, 1);
    assert_eq!(one, take(3, 4));
    assert_eq!(one, take(2, 1));
    assert_eq!(data::decode(&data::encode("héllo")), "héllo");
}

#[test]
fn kv_cache_modes_generate_the_same_tokens_and_prealloc_matches_the_estimate() {
    use memsight_gpt::generate::{estimated_cache_bytes, generate, CacheMode};
    let _rng = rng();
    let cfg = tiny_cfg();
    let (_vs, _l, m) = model(&cfg, 0);
    let prompt: Vec<i64> = data::encode("let x = ").iter().map(|&b| b as i64).collect();
    let none = generate(&m, &prompt, 12, CacheMode::None);
    assert_eq!(none.tokens.len(), 20);
    for mode in [CacheMode::Prealloc, CacheMode::Grow] {
        let g = generate(&m, &prompt, 12, mode);
        assert_eq!(g.tokens, none.tokens, "{mode:?} generated other tokens");
        let d = max_diff(
            g.last_logits.as_ref().unwrap(),
            none.last_logits.as_ref().unwrap(),
        );
        assert!(d < 1e-5, "{mode:?} logits differ by {d}");
        // Prealloc holds all 20 positions from the start; grow ends with the 19 it was fed
        // (the last generated token is never fed back). 2 · layers · len · n_embd · 4 bytes.
        let len = if mode == CacheMode::Prealloc { 20 } else { 19 };
        assert_eq!(
            g.cache_bytes as u64,
            estimated_cache_bytes(&cfg.shape, len),
            "{mode:?}"
        );
    }
    assert_eq!(estimated_cache_bytes(&cfg.shape, 20), 2 * 2 * 20 * 32 * 4);
}

#[test]
fn first_layer_loading_head_chunks_and_sampling_reproduce_the_full_maps() {
    use memsight_gpt::analyze;
    let _rng = rng();
    let cfg = tiny_cfg();
    let (vs, _l, full) = model(&cfg, 0);
    let dir = std::env::temp_dir().join(format!("memsight-gpt-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("full.safetensors");
    vs.save(&ckpt).unwrap();
    let (_vs1, first, bytes) = analyze::load_first_layers(&ckpt, cfg.shape, 1).unwrap();
    assert_eq!(first.blocks.len(), 1);
    let full_bytes: i64 = vs.variables().values().map(|t| t.numel() as i64 * 4).sum();
    let block_bytes = (full_bytes - bytes) as f64;
    // 2 layers → 1 layer: exactly one block's parameters fewer.
    assert!(block_bytes > 0.0 && bytes < full_bytes);
    let (x, _) = batch(&cfg, 6, 2);
    let reference = analyze::maps(&full, &x, 0, 4);
    // Layer 0 of the first-layer-only model equals the full model's; chunks of 1, 3 or 4 heads agree.
    for chunk in [1, 3, 4] {
        let m = analyze::maps(&first, &x, 0, chunk);
        assert_eq!(m.size(), vec![2, 4, 24, 24]);
        assert!(max_diff(&m, &reference) < 1e-6, "chunk {chunk}");
    }
    // Rows sum to one; the future is masked.
    let sums = reference.sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
    assert!((sums - 1.0).abs().max().double_value(&[]) < 1e-5);
    assert_eq!(reference.double_value(&[0, 0, 0, 1]), 0.0);
    // Sampling mode: 6 of 24 rows, equal to the full maps' rows.
    let (sampled, picks) = analyze::sampled_maps(&first, &x, 0, 6);
    assert_eq!(picks, vec![0, 4, 8, 12, 16, 20]);
    assert!(analyze::sampling_error(&reference, &sampled, &picks) < 1e-6);
    // Heatmaps: one PGM per head.
    let files = analyze::write_heatmaps(&reference, 0, &dir).unwrap();
    assert_eq!(files.len(), 4);
    let pgm = std::fs::read(&files[0]).unwrap();
    assert!(pgm.starts_with(b"P5\n24 24\n255\n") && pgm.len() == 13 + 24 * 24);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn int8_and_int4_weight_only_quantization_keep_logits_close() {
    let _rng = rng();
    let mut cfg = tiny_cfg();
    cfg.shape.n_embd = 64; // int4 packing needs in % 32 == 0 and out % 16 == 0
    let (_vs, _l, reference) = model(&cfg, 0);
    let (x, _) = batch(&cfg, 7, 2);
    let want = tch::no_grad(|| reference.forward(&x, Attention::Sdpa, 64, None));
    let scale = want.abs().max().double_value(&[]);
    for (bits, tol) in [(8u8, 0.01), (4u8, 0.15)] {
        let (_vs, _l, mut m) = model(&cfg, 0);
        m.quantize(bits).unwrap();
        assert_eq!(m.blocks[0].qkv(&m.embed(&x, 0)).0.kind(), Kind::Float);
        let got = tch::no_grad(|| m.forward(&x, Attention::Sdpa, 64, None));
        let err = max_diff(&got, &want) / scale;
        println!("int{bits}: max logits error {err:.4} of the largest logit");
        assert!(err < tol, "int{bits} logits error {err}");
        assert!(err > 0.0, "int{bits} changed nothing");
    }
}

#[test]
fn cleanups_are_recorded_between_steps_between_eval_batches_and_at_the_end() {
    let _rng = rng();
    let mut cfg = tiny_cfg();
    cfg.steps = 3;
    cfg.batch_size = 2;
    cfg.micro_batch = 2;
    cfg.eval_every = 0;
    cfg.eval_batches = 4;
    cfg.cleanup_every = 2;
    cfg.cleanup_eval_every = 2;
    let s = memsight_gpt::train::train(&cfg, None, false).unwrap();
    // After step 2; after eval batches 2 and 4 of the one evaluation (at the end); and once more
    // after the last step, whatever the step count.
    assert_eq!(s.cleanups.len(), 1);
    assert_eq!(s.eval_cleanups.len(), 2);
    assert!(s.final_cleanup.is_some());
    cfg.cleanup_every = 0;
    cfg.cleanup_eval_every = 0;
    let s = memsight_gpt::train::train(&cfg, None, false).unwrap();
    assert!(s.cleanups.is_empty() && s.eval_cleanups.is_empty() && s.final_cleanup.is_none());
}
