//! A real (small) training job under memsight: a 3-layer MLP learns y = sin(x) with SGD +
//! momentum, fed by a data-loader thread with a bounded prefetch queue, with forward / backward /
//! optimizer / eval phases. It is the demo until the tch reference model lands.
//!
//! `cargo run --release -p memsight --example train_mlp -- [STEPS] [REPORT]`

use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const BATCH: usize = 512;
const HIDDEN: usize = 256;
const EVAL_BATCH: usize = 16_384;

struct Linear {
    w: Vec<f32>, // [out, in]
    b: Vec<f32>,
    vw: Vec<f32>, // momentum
    vb: Vec<f32>,
    n_in: usize,
    n_out: usize,
}

impl Linear {
    fn new(n_in: usize, n_out: usize, seed: &mut u64) -> Self {
        let scale = (2.0 / n_in as f32).sqrt();
        let w = (0..n_in * n_out)
            .map(|_| (rand(seed) * 2.0 - 1.0) * scale)
            .collect();
        Linear {
            w,
            b: vec![0.0; n_out],
            vw: vec![0.0; n_in * n_out],
            vb: vec![0.0; n_out],
            n_in,
            n_out,
        }
    }

    /// y[B, out] = x[B, in] · Wᵀ + b
    fn forward(&self, x: &[f32], batch: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; batch * self.n_out];
        for r in 0..batch {
            let xr = &x[r * self.n_in..(r + 1) * self.n_in];
            for o in 0..self.n_out {
                let wr = &self.w[o * self.n_in..(o + 1) * self.n_in];
                y[r * self.n_out + o] =
                    xr.iter().zip(wr).map(|(a, b)| a * b).sum::<f32>() + self.b[o];
            }
        }
        y
    }

    /// Returns (dx, dW, db) for upstream gradient dy.
    fn backward(&self, x: &[f32], dy: &[f32], batch: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut dx = vec![0.0f32; batch * self.n_in];
        let mut dw = vec![0.0f32; self.n_in * self.n_out];
        let mut db = vec![0.0f32; self.n_out];
        for r in 0..batch {
            let xr = &x[r * self.n_in..(r + 1) * self.n_in];
            for o in 0..self.n_out {
                let g = dy[r * self.n_out + o];
                db[o] += g;
                let wr = &self.w[o * self.n_in..(o + 1) * self.n_in];
                let dwr = &mut dw[o * self.n_in..(o + 1) * self.n_in];
                let dxr = &mut dx[r * self.n_in..(r + 1) * self.n_in];
                for i in 0..self.n_in {
                    dwr[i] += g * xr[i];
                    dxr[i] += g * wr[i];
                }
            }
        }
        (dx, dw, db)
    }

    fn sgd(&mut self, dw: &[f32], db: &[f32], lr: f32) {
        for ((w, v), g) in self.w.iter_mut().zip(&mut self.vw).zip(dw) {
            *v = 0.9 * *v + g;
            *w -= lr * *v;
        }
        for ((b, v), g) in self.b.iter_mut().zip(&mut self.vb).zip(db) {
            *v = 0.9 * *v + g;
            *b -= lr * *v;
        }
    }
}

fn rand(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed >> 40) as f32 / (1u64 << 24) as f32
}

fn target(x: f32) -> f32 {
    x.sin()
}

fn batch(seed: &mut u64, n: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..n)
        .map(|_| (rand(seed) * 2.0 - 1.0) * std::f32::consts::PI)
        .collect();
    let y = x.iter().map(|&v| target(v)).collect();
    (x, y)
}

fn relu(v: &mut [f32]) {
    v.iter_mut().for_each(|x| *x = x.max(0.0));
}

struct Mlp {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}

impl Mlp {
    fn predict(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut h1 = self.l1.forward(x, n);
        relu(&mut h1);
        let mut h2 = self.l2.forward(&h1, n);
        relu(&mut h2);
        self.l3.forward(&h2, n)
    }
}

fn mse(pred: &[f32], y: &[f32]) -> f32 {
    pred.iter()
        .zip(y)
        .map(|(p, t)| (p - t) * (p - t))
        .sum::<f32>()
        / y.len() as f32
}

/// One training step inside the `train` phase; every buffer of the step is freed before it ends.
fn train_step(
    model: &mut Mlp,
    rx: &std::sync::mpsc::Receiver<(Vec<f32>, Vec<f32>)>,
    lr: f32,
) -> Result<f32, Box<dyn std::error::Error>> {
    let _train = memsight::phase("train");
    let (x, y) = rx.recv()?;
    let (h1, h2, pred) = {
        let _g = memsight::phase("forward");
        let mut h1 = model.l1.forward(&x, BATCH);
        relu(&mut h1);
        let mut h2 = model.l2.forward(&h1, BATCH);
        relu(&mut h2);
        let pred = model.l3.forward(&h2, BATCH);
        (h1, h2, pred)
    };
    let loss = mse(&pred, &y);
    let grads = {
        let _g = memsight::phase("backward");
        let dpred: Vec<f32> = pred.iter().zip(&y).map(|(p, t)| 2.0 * (p - t)).collect();
        let (mut dh2, dw3, db3) = model.l3.backward(&h2, &dpred, BATCH);
        dh2.iter_mut().zip(&h2).for_each(|(g, h)| {
            if *h <= 0.0 {
                *g = 0.0
            }
        });
        let (mut dh1, dw2, db2) = model.l2.backward(&h1, &dh2, BATCH);
        dh1.iter_mut().zip(&h1).for_each(|(g, h)| {
            if *h <= 0.0 {
                *g = 0.0
            }
        });
        let (_dx, dw1, db1) = model.l1.backward(&x, &dh1, BATCH);
        [(dw1, db1), (dw2, db2), (dw3, db3)]
    };
    {
        let _g = memsight::phase("optimizer");
        let [(dw1, db1), (dw2, db2), (dw3, db3)] = grads;
        model.l1.sgd(&dw1, &db1, lr);
        model.l2.sgd(&dw2, &db2, lr);
        model.l3.sgd(&dw3, &db3, lr);
    }
    Ok(loss)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(300);
    let report = args.next().unwrap_or_else(|| "memsight-report.json".into());
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(50))
        .report_path(&report)
        .start()?;

    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut model = {
        let _g = memsight::phase("init");
        Mlp {
            l1: Linear::new(1, HIDDEN, &mut seed),
            l2: Linear::new(HIDDEN, HIDDEN, &mut seed),
            l3: Linear::new(HIDDEN, 1, &mut seed),
        }
    };

    // Data loader: one worker thread, prefetch depth 4.
    let (tx, rx) = sync_channel::<(Vec<f32>, Vec<f32>)>(4);
    let loader = std::thread::Builder::new()
        .name("data-loader".into())
        .spawn(move || {
            let mut seed = 12345u64;
            while tx.send(batch(&mut seed, BATCH)).is_ok() {}
        })?;

    let t0 = Instant::now();
    let lr = 0.02 / BATCH as f32;
    for step in 0..steps {
        memsight::step(step);
        let loss = train_step(&mut model, &rx, lr)?;
        if step % 50 == 49 || step + 1 == steps {
            let _g = memsight::phase("eval");
            let (ex, ey) = batch(&mut seed, EVAL_BATCH);
            let eval = mse(&model.predict(&ex, EVAL_BATCH), &ey);
            let s = memsight::stats();
            println!(
                "step {:>4} | loss {loss:.4} | eval {eval:.4} | {:.0} ms/step | live {} | peak {}",
                step + 1,
                t0.elapsed().as_secs_f64() * 1000.0 / (step + 1) as f64,
                memsight::units::fmt_bytes(s.live_bytes),
                memsight::units::fmt_bytes(s.peak_bytes)
            );
        }
    }
    drop(rx);
    let _ = loader.join();
    let r = session.finish()?;
    for t in &r.tips {
        println!("tip: {}", t.title);
    }
    println!("{report}");
    Ok(())
}
