//! `attention-bench`: efficient (tiled, causal tiles skipped) vs naive attention on the CPU — one
//! layer's attention core forward + backward, and a whole training step of the reference model —
//! at S = 1024 by default. Rounds alternate the two modes; each cell is the median over rounds and
//! the ratio is the median of the within-round ratios (this machine is shared and drifts). Prints
//! a markdown table; nothing asserts on time.
//!
//! Usage: `attention-bench [ROUNDS] [SEQ] [THREADS]` (default 7 rounds, S = 1024, libtorch's
//! default intra-op threads).

use memsight_gpt::attention::{self, efficient_backward, efficient_forward};
use memsight_gpt::config::{Attention, Config, Preset};
use memsight_gpt::model::Gpt;
use memsight_gpt::{data, step};
use std::hint::black_box;
use std::time::Instant;
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

fn median(v: &[f64]) -> f64 {
    memsight_gpt::train::median(v)
}

/// Milliseconds of one call of `f`.
fn time(mut f: impl FnMut()) -> f64 {
    let t0 = Instant::now();
    f();
    t0.elapsed().as_secs_f64() * 1000.0
}

/// One attention core, forward and backward: (B, H, S, D) q, k, v and an output gradient.
fn core(mode: Attention, qkv: &(Tensor, Tensor, Tensor), g: &Tensor, block: i64) {
    let (q, k, v) = qkv;
    match mode {
        Attention::Efficient => {
            let o = efficient_forward(q, k, v, block);
            let _ = black_box(efficient_backward(q, k, v, &o, g, block));
        }
        _ => {
            let o = attention::attend(q, k, v, mode, block);
            (o * g).sum(Kind::Float).backward();
            let _ = black_box((q.grad(), k.grad(), v.grad()));
            for t in [q, k, v] {
                let _ = t.grad().zero_();
            }
        }
    }
}

/// A training step (forward, backward, AdamW) of `cfg`'s model, built once per mode.
struct StepBench {
    cfg: Config,
    model: Gpt,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl StepBench {
    fn new(mode: Attention, seq: i64) -> Result<StepBench, String> {
        let mut cfg = Config::preset(Preset::Tiny);
        cfg.shape.block_size = seq;
        cfg.seq_len = seq;
        cfg.batch_size = 4;
        cfg.micro_batch = 4;
        cfg.attention = mode;
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let model = Gpt::new(&vs.root(), None, 0, cfg.shape, None);
        let opt = nn::adamw(0.9, 0.95, 0.1)
            .build(&vs, 1e-3)
            .map_err(|e| e.to_string())?;
        let tokens = data::encode(data::CORPUS);
        let (x, y) = data::make_batch(&tokens, 1, 0, cfg.micro_batch, seq).tensors(Device::Cpu);
        Ok(StepBench {
            cfg,
            model,
            opt,
            x,
            y,
            _vs: vs,
        })
    }

    fn step(&mut self) -> Result<(), String> {
        let l = step::forward_backward(&self.model, &self.cfg, &self.x, &self.y, None, 1.0)
            .map_err(|e| e.to_string())?;
        black_box(l);
        self.opt.step();
        self.opt.zero_grad();
        Ok(())
    }
}

/// Per-round times of naive and efficient, alternating which goes first.
fn rounds(n: usize, mut run: impl FnMut(Attention) -> Result<f64, String>) -> Result<Row, String> {
    let (mut naive, mut eff) = (Vec::new(), Vec::new());
    // One untimed call of each: thread pools, allocator caches, oneDNN primitives.
    run(Attention::Naive)?;
    run(Attention::Efficient)?;
    for r in 0..n {
        let order = if r % 2 == 0 {
            [Attention::Naive, Attention::Efficient]
        } else {
            [Attention::Efficient, Attention::Naive]
        };
        for mode in order {
            let ms = run(mode)?;
            match mode {
                Attention::Naive => naive.push(ms),
                _ => eff.push(ms),
            }
        }
    }
    let ratios: Vec<f64> = eff.iter().zip(&naive).map(|(e, n)| e / n).collect();
    Ok(Row {
        naive: median(&naive),
        efficient: median(&eff),
        ratio: median(&ratios),
        lo: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        hi: ratios.iter().copied().fold(0.0, f64::max),
    })
}

struct Row {
    naive: f64,
    efficient: f64,
    ratio: f64,
    lo: f64,
    hi: f64,
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let n: usize = match args.next() {
        Some(a) => a
            .parse()
            .map_err(|_| format!("ROUNDS `{a}`: expected a number"))?,
        None => 7,
    };
    let seq: i64 = match args.next() {
        Some(a) => a
            .parse()
            .map_err(|_| format!("SEQ `{a}`: expected a number"))?,
        None => 1024,
    };
    if let Some(a) = args.next() {
        let t: i32 = a
            .parse()
            .map_err(|_| format!("THREADS `{a}`: expected a number"))?;
        tch::set_num_threads(t.max(1));
    }
    if n == 0 || seq < 2 {
        return Err("ROUNDS must be ≥ 1 and SEQ ≥ 2".into());
    }
    println!(
        "attention-bench: {n} rounds, S = {seq}, {} intra-op threads",
        tch::get_num_threads()
    );
    println!(
        "\n| workload | naive ms | efficient ms | efficient ÷ naive (median of rounds) | range |"
    );
    println!("|---|---:|---:|---:|---:|");
    let print = |what: &str, r: &Row| {
        println!(
            "| {what} | {:.1} | {:.1} | {:.3}× | {:.2}–{:.2}× |",
            r.naive, r.efficient, r.ratio, r.lo, r.hi
        );
    };
    tch::manual_seed(0);
    for (b, h, d, block) in [(4, 12, 64, 64), (4, 12, 64, 128)] {
        let r =
            || Tensor::randn([b, h, seq, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let qkv = (r(), r(), r());
        let g = Tensor::randn([b, h, seq, d], (Kind::Float, Device::Cpu));
        let row = rounds(n, |mode| Ok(time(|| core(mode, &qkv, &g, block))))?;
        print(
            &format!("one layer's attention, fwd + bwd, B={b} H={h} D={d}, block {block}"),
            &row,
        );
    }
    let mut benches = [
        StepBench::new(Attention::Naive, seq)?,
        StepBench::new(Attention::Efficient, seq)?,
    ];
    let row = rounds(n, |mode| {
        let b = &mut benches[usize::from(mode == Attention::Efficient)];
        let t0 = Instant::now();
        b.step()?;
        Ok(t0.elapsed().as_secs_f64() * 1000.0)
    })?;
    print(
        "training step, tiny preset (4 layers, 4 heads, 128 wide), B=4, block 64",
        &row,
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("attention-bench: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
