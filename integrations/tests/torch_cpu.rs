//! The libtorch CPU tensor hook on a real libtorch: tensor bytes appear in memsight's tensor series
//! with the tensors' sizes, phases attribute them, and without a driver every GPU backend says
//! absent with its reason. One test function: the hook and the counters are process-wide.
#![cfg(feature = "tch")]

use memsight::devices::tensors;
use memsight_integrations::torch;
use tch::{Device, Kind, Tensor};

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn live() -> u64 {
    tensors::stats().expect("tensor series enabled").live_bytes
}

#[test]
fn tensor_bytes_are_counted_attributed_and_gpu_backends_explain_absence() {
    let installed = memsight_integrations::install();
    let cpu = installed
        .statuses
        .iter()
        .find(|s| s.name == "libtorch-cpu")
        .unwrap();
    assert!(cpu.available, "{cpu:?}");

    // Exact sizes: a 1 MiB + 4 KiB f32 tensor is one block of at least that many bytes, and at most
    // one jemalloc size class (≤ 25% for large sizes) above it.
    let n: i64 = (1 << 18) + 1024;
    let want = (n * 4) as u64;
    let before = live();
    let t = Tensor::ones([n], (Kind::Float, Device::Cpu));
    let grown = live() - before;
    assert!(
        grown >= want && grown <= want + want / 4,
        "grew {grown}, tensor is {want}"
    );
    drop(t);
    assert_eq!(live(), before, "freeing the tensor returns its bytes");

    // A training step: forward/backward/optimizer tensors show in the phases' tensor peaks.
    let session = memsight::Session::builder().quiet().start().unwrap();
    let w = Tensor::randn([512, 512], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    memsight::step(0);
    let grad_bytes;
    {
        let _f = memsight::phase("forward");
        let x = Tensor::randn([256, 512], (Kind::Float, Device::Cpu));
        let y = x.matmul(&w).relu().sum(Kind::Float);
        drop(_f);
        let _b = memsight::phase("backward");
        y.backward();
        grad_bytes = (w.grad().numel() * 4) as u64;
    }
    memsight::step(1);
    let report = session.finish().unwrap();
    let phase = |name: &str| {
        report
            .phases
            .iter()
            .find(|p| p.path == name)
            .and_then(|p| p.tensor_peak_bytes)
            .unwrap_or_else(|| panic!("phase {name} has no tensor peak: {:?}", report.phases))
    };
    // Forward holds the input (512 KiB) and x·w (512 KiB) beyond w itself (1 MiB).
    assert!(phase("forward") >= (1 << 20) + (1 << 19) + (1 << 19));
    // Backward adds w's gradient (1 MiB).
    assert!(phase("backward") >= grad_bytes + (1 << 20));
    let peak = report
        .peaks
        .tensor_peak_bytes
        .expect("tensor peak in the report");
    assert!(peak >= phase("backward"));
    assert_eq!(report.peaks.tensor_peak_step, Some(0));
    assert!(report.timeline.iter().all(|s| s.tensors.is_some()));

    // No GPU here: the CUDA, NVML and cudarc backends are absent and say why.
    if torch::cuda_device_count() == 0 {
        assert!(report
            .sources
            .iter()
            .any(|s| s.name == "libtorch-cpu" && s.available));
        for name in ["libtorch-cuda", "nvml", "cudarc"] {
            let s = report
                .sources
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name} missing from sources: {:?}", report.sources));
            assert!(!s.available && !s.detail.is_empty(), "{s:?}");
        }
        println!("no CUDA device: GPU backends absent as expected");
    }
}
