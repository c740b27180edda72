//! Allocation workloads shared by every benchmark binary (each binary differs only in its
//! `#[global_allocator]`). Prints nanoseconds per operation measured inside the process, so a
//! tool's start-up (heaptrack) does not count.

use std::hint::black_box;
use std::time::Instant;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Runs `name` for `ops` operations per thread; returns ns per operation (per thread).
fn run_one(name: &str, ops: usize) -> f64 {
    let t = Instant::now();
    match name {
        // Box<[u8; 32]> alloc + free.
        "box32" => {
            for i in 0..ops {
                drop(black_box(Box::new([i as u8; 32])));
            }
        }
        // 1000 boxes alive, then freed: one op = one alloc + one free.
        "batch1000" => {
            let mut v: Vec<Box<[u8; 64]>> = Vec::with_capacity(1000);
            for _ in 0..ops / 1000 {
                for i in 0..1000 {
                    v.push(black_box(Box::new([i as u8; 64])));
                }
                v.clear();
            }
        }
        // Random sizes 8–4096 B, 64 kept alive in a ring.
        "mixed" => {
            let mut seed = 0x2545F4914F6CDD1Du64;
            let mut ring: Vec<Vec<u8>> = (0..64).map(|_| Vec::new()).collect();
            for i in 0..ops {
                let n = 8 + (xorshift(&mut seed) % 4089) as usize;
                ring[i % 64] = black_box(Vec::with_capacity(n));
            }
        }
        other => {
            eprintln!("unknown workload {other}: use box32, batch1000 or mixed");
            std::process::exit(2);
        }
    }
    t.elapsed().as_nanos() as f64 / ops as f64
}

/// `BIN WORKLOAD THREADS OPS` → prints `ns_per_op=<median over threads>`.
pub fn main_with_args() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 {
        eprintln!("usage: {} box32|batch1000|mixed THREADS OPS", a[0]);
        std::process::exit(2);
    }
    let name = a[1].clone();
    let threads: usize = a[2].parse().unwrap_or(1);
    let ops: usize = a[3].parse().unwrap_or(1_000_000);
    // Warm-up (thread caches, slot claim), then the measured run.
    run_one(&name, ops / 10 + 1000);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let n = name.clone();
            std::thread::spawn(move || run_one(&n, ops))
        })
        .collect();
    let mut per: Vec<f64> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or(f64::NAN))
        .collect();
    per.sort_by(f64::total_cmp);
    println!("ns_per_op={:.3}", per[per.len() / 2]);
}
