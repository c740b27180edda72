//! Issue 38's job, linked: a 200-step loop whose peak is a 192 MiB spike held 30 ms at step 123
//! (`attention_spike`); each step allocates and frees 8 MiB and keeps 64 KiB. Its session runs at
//! the default interval, under `memsight run` when started by it.

use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// The spike: 192 MiB, every page touched, held 30 ms.
#[inline(never)]
fn attention_spike() -> u64 {
    let mut v = vec![0u8; 192 << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    std::thread::sleep(Duration::from_millis(30));
    black_box(&v)
        .iter()
        .step_by(1 << 20)
        .map(|&x| x as u64)
        .sum()
}

/// A step's ordinary work: 8 MiB of activations, freed.
#[inline(never)]
fn ordinary_step() -> u64 {
    let acts = black_box(vec![1u8; 8 << 20]);
    acts[4096] as u64
}

fn main() {
    let session = memsight::Session::builder()
        .quiet()
        .start()
        .expect("session");
    let mut kept = Vec::new();
    for n in 0..200u64 {
        session.step(n);
        black_box(ordinary_step());
        if n == 123 {
            black_box(attention_spike());
        }
        kept.push(black_box(vec![2u8; 64 << 10]));
        std::thread::sleep(Duration::from_millis(1));
    }
    black_box(&kept);
    session.finish().expect("report");
}
