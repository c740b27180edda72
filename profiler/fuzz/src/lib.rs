//! Fuzz targets for every parser memsight feeds untrusted bytes to — a report (`check`, `summary`,
//! `view`), a budget file, a flight-recorder ring, the sidecar's socket stream (into the viewer's
//! state) and a jemalloc heap profile (into sites, folded stacks and pprof) — and [`run`], a
//! mutation driver on stable Rust: seeds, byte- and token-level mutations, a pool of inputs that
//! still parse, and a crash (a panic) recorded with its input. Each target returns whether the
//! input was accepted; any panic is a crash. The diagnose log parser has its own harness
//! (`profiler/tests/diagnose_fuzz.rs`).

mod mutate;
mod targets;

pub use targets::Target;

/// What a run found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Inputs tried.
    pub executions: u64,
    /// Inputs the target accepted (parsed without error).
    pub accepted: u64,
    /// Inputs that made the target panic, with the panic message.
    pub crashes: Vec<(Vec<u8>, String)>,
}

/// Runs `target` on `executions` inputs derived from its seeds (deterministic for one `seed`).
pub fn run(target: Target, executions: u64, seed: u64) -> Outcome {
    let mut ctx = targets::Context::new();
    let seeds = target.seeds();
    let mut rng = mutate::Rng::new(seed ^ (target as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Inputs that were accepted are worth mutating further: they reach deeper than raw seeds.
    let mut pool: Vec<Vec<u8>> = seeds.clone();
    let mut out = Outcome::default();
    let quiet = QuietPanics::install();
    for _ in 0..executions {
        let base = &pool[rng.below(pool.len())];
        let other = &seeds[rng.below(seeds.len())];
        let input = mutate::mutate(base, other, target.dictionary(), &mut rng);
        out.executions += 1;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            target.exec(&input, &mut ctx)
        }));
        match result {
            Ok(true) => {
                out.accepted += 1;
                if pool.len() < 256 {
                    pool.push(input);
                } else {
                    let i = rng.below(pool.len() - seeds.len()) + seeds.len();
                    pool[i] = input;
                }
            }
            Ok(false) => {}
            Err(p) => {
                if out.crashes.len() < 16 {
                    out.crashes.push((input, panic_message(&*p)));
                }
            }
        }
    }
    drop(quiet);
    out
}

/// A panic hook, as `std::panic::take_hook` returns it.
type Hook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Runs `target` on one saved input: whether it was accepted, or the panic message.
pub fn replay(target: Target, input: &[u8]) -> Result<bool, String> {
    let mut ctx = targets::Context::new();
    let quiet = QuietPanics::install();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        target.exec(input, &mut ctx)
    }));
    drop(quiet);
    r.map_err(|p| panic_message(&*p))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Silences the panic message of caught panics while a run lasts (they are collected instead).
struct QuietPanics {
    previous: Option<Hook>,
}

impl QuietPanics {
    fn install() -> Self {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        QuietPanics {
            previous: Some(previous),
        }
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        if let Some(p) = self.previous.take() {
            std::panic::set_hook(p);
        }
    }
}
