//! A job whose memory has known owners: `hold_at_peak` holds 200 MiB at the peak, `leak_a_little`
//! keeps 256 KiB more each step, and `step_scratch` allocates and frees 8 MiB every step. Its
//! report's heap profile must name them. `sites_job [steps] [kill]`: with `kill` it SIGKILLs
//! itself after the last step instead of finishing its session.

use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// A vector of `n` bytes with every page filled, so nothing is optimized away and the bytes are
/// resident — allocated in the function that uses the macro (a site is the function whose code
/// allocated: a helper function would be the site of all three).
macro_rules! filled {
    ($n:expr, $byte:expr) => {{
        let n: usize = $n;
        let mut v = vec![0u8; n];
        for i in (0..n).step_by(4096) {
            v[i] = $byte;
        }
        black_box(v)
    }};
}

#[inline(never)]
fn hold_at_peak() -> Vec<Vec<u8>> {
    (0..50).map(|i| filled!(4 << 20, i as u8)).collect()
}

#[inline(never)]
fn leak_a_little(kept: &mut Vec<Vec<u8>>) {
    for i in 0..4 {
        kept.push(filled!(64 << 10, i));
    }
}

#[inline(never)]
fn step_scratch() -> usize {
    let v = filled!(8 << 20, 7);
    black_box(&v).len()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let steps: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(40);
    let kill = args.next().as_deref() == Some("kill");
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(20))
        .quiet()
        .start()
        .expect("session");
    let mut kept = Vec::new();
    for n in 0..steps {
        memsight::step(n);
        leak_a_little(&mut kept);
        black_box(step_scratch());
        if n == steps / 2 {
            let big = hold_at_peak();
            std::thread::sleep(Duration::from_millis(700));
            drop(black_box(big));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    memsight::step(steps);
    if kill {
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: signalling ourselves.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    black_box(&kept);
    session.finish().expect("report");
}
