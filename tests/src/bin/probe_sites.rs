//! A job linked with memsight exactly as the README shows (no feature), whose memory has known
//! owners in another crate (`memsight_e2e::probe`): 200 MiB held at the peak by
//! `hold_two_hundred_mib_here`, 64 MiB copied by C code (`strdup`) for
//! `c_library_allocates_here`, 256 KiB more each step kept by `leak_a_little_here`.
//! `probe_sites [steps]`.

use memsight_e2e::probe;
use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(20))
        .report_path("probe-report.json")
        .quiet()
        .start()?;
    let text = std::ffi::CString::new(vec![b'm'; 64 << 20])?;
    let mut kept = Vec::new();
    for n in 0..steps {
        memsight::step(n);
        probe::leak_a_little_here(&mut kept);
        if n == steps / 2 {
            let copy = probe::c_library_allocates_here(&text);
            let big = probe::hold_two_hundred_mib_here();
            std::thread::sleep(Duration::from_millis(600));
            drop(black_box(big));
            // SAFETY: strdup's copy, freed once.
            unsafe { libc::free(copy.cast()) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    memsight::step(steps);
    black_box(&kept);
    session.finish()?;
    Ok(())
}
