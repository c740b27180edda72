//! A varying-batch CUDA workload for the caching allocator's fragmentation: an MLP trained on
//! batches whose size changes every step (as with variable-length sequences or bucketing), under a
//! memsight session. Run it twice, with and without
//! `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, and compare the reports' device peaks,
//! fragmentation and segment maps (docs/gpu.md).
//!
//! `varying_batch [STEPS] [REPORT]` — prints one JSON line of the allocator's figures at the end.
//! Without a CUDA device it says so and exits 0.

use memsight_integrations::torch;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const WIDTH: i64 = 1024;
const HIDDEN: i64 = 8192;

/// Batch sizes from 64 to 4096 rows in a fixed pseudo-random order (the same in every run).
fn batch_sizes(steps: u64) -> impl Iterator<Item = i64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..steps).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        64 + (x % 4033) as i64
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let report = args
        .next()
        .unwrap_or_else(|| "varying-batch-report.json".into());
    let installed = memsight_integrations::install();
    if torch::cuda_device_count() == 0 {
        println!("varying_batch: no CUDA device here; nothing to measure");
        return Ok(());
    }
    for line in installed.describe() {
        eprintln!("{line}");
    }
    let session = memsight::Session::builder()
        .report_path(&report)
        .quiet()
        .start()?;
    let dev = Device::Cuda(0);
    let vs = nn::VarStore::new(dev);
    let net = nn::seq()
        .add(nn::linear(
            vs.root() / "fc1",
            WIDTH,
            HIDDEN,
            Default::default(),
        ))
        .add_fn(|x| x.relu())
        .add(nn::linear(
            vs.root() / "fc2",
            HIDDEN,
            WIDTH,
            Default::default(),
        ));
    let mut opt = nn::Adam::default().build(&vs, 1e-4)?;
    let mut worst_gap = 0u64;
    for (step, b) in batch_sizes(steps).enumerate() {
        memsight::step(step as u64);
        let x = Tensor::randn([b, WIDTH], (Kind::Float, dev));
        let y = Tensor::randn([b, WIDTH], (Kind::Float, dev));
        let loss = {
            let _f = memsight::phase("forward");
            net.forward(&x).mse_loss(&y, tch::Reduction::Mean)
        };
        {
            let _b = memsight::phase("backward");
            opt.backward_step(&loss);
        }
        if let Some(s) = torch::device_stats(0) {
            let gap = s.reserved_bytes.unwrap_or(0) - s.allocated_bytes.unwrap_or(0);
            worst_gap = worst_gap.max(gap);
        }
    }
    tch::Cuda::synchronize(0);
    let s = torch::device_stats(0).ok_or("no device statistics")?;
    let segments = torch::segment_map(0);
    let seg_bytes: u64 = segments.iter().map(|m| m.bytes).sum();
    let seg_alloc: u64 = segments.iter().map(|m| m.allocated_bytes).sum();
    println!(
        "{}",
        serde_json::json!({
            "alloc_conf": memsight_integrations::alloc_conf::read().map(|(_, v)| v),
            "steps": steps,
            "peak_allocated_bytes": s.peak_allocated_bytes,
            "peak_reserved_bytes": s.peak_reserved_bytes,
            "reserved_bytes": s.reserved_bytes,
            "allocated_bytes": s.allocated_bytes,
            "inactive_split_bytes": s.inactive_split_bytes,
            "alloc_retries": s.alloc_retries,
            "worst_reserved_minus_allocated_bytes": worst_gap,
            "largest_segments": segments.len(),
            "largest_segments_bytes": seg_bytes,
            "largest_segments_allocated_bytes": seg_alloc,
        })
    );
    session.finish()?;
    Ok(())
}
