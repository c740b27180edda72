//! The heap sampler's switches: is it available, sampling on or off now, the sampling rate, and
//! writing a profile. The sampler is memsight's own (`crate::alloc::sampling`), in every build with
//! the default `jemalloc` feature and in the preloaded library (the `sampling` feature); a session turns it on at its start (one sample per 512 KiB
//! allocated, or `MEMSIGHT_HEAP_SAMPLE`: `off` or a size, set by `memsight run --heap-sample` /
//! `--no-heap-profile`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How a process gets heap profiling.
pub const HOW_TO_ENABLE: &str = "link memsight with its default `jemalloc` feature and start a \
session (memsight::Session, or run the job under `memsight run`)";

/// The default mean bytes between samples.
pub const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;
#[cfg(feature = "sampling")]
const _: () = assert!(DEFAULT_SAMPLE_BYTES == crate::alloc::sampling::DEFAULT_RATE);

/// The rate sampling runs at when switched on (the last one configured).
static CONFIGURED: AtomicU64 = AtomicU64::new(DEFAULT_SAMPLE_BYTES);

#[cfg(feature = "sampling")]
mod imp {
    use crate::alloc::sampling;
    use std::path::Path;

    pub fn enabled() -> bool {
        sampling::available()
    }

    pub fn start(rate: u64) -> Result<(), String> {
        sampling::enable(rate).map_err(|e| format!("the heap sampler cannot run: {e}"))
    }

    pub fn stop() {
        sampling::disable()
    }

    pub fn sampling() -> bool {
        sampling::rate().is_some()
    }

    pub fn dump(path: &Path, rate: u64, at_peak: bool) -> Result<(), String> {
        let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(failed)?);
        sampling::write_profile(&mut out, rate, at_peak).map_err(failed)?;
        out.into_inner()
            .map_err(|e| failed(e.into_error()))
            .map(drop)
    }
}

#[cfg(not(feature = "sampling"))]
mod imp {
    use std::path::Path;

    pub const NO: &str =
        "memsight was built without its `sampling` feature (part of `jemalloc`), which the heap sampler is";

    pub fn enabled() -> bool {
        false
    }
    pub fn start(_: u64) -> Result<(), String> {
        Err(NO.into())
    }
    pub fn stop() {}
    pub fn sampling() -> bool {
        false
    }
    pub fn dump(_: &Path, _: u64, _: bool) -> Result<(), String> {
        Err(NO.into())
    }
}

/// Why there is no heap profiling in this process, and how to get it.
fn not_enabled() -> String {
    #[cfg(not(feature = "sampling"))]
    if crate::alloc::foreign::installed() {
        return "allocation sites are not recorded in a job memsight is preloaded into (its heap \
                is counted exactly, without sites)"
            .into();
    }
    format!("heap profiling is not enabled: {HOW_TO_ENABLE}")
}

/// Whether the heap sampler can run in this process (a session started it at least once).
pub fn enabled() -> bool {
    imp::enabled()
}

/// Mean bytes between samples (the rate sampling runs or would run at), when the sampler exists.
pub fn sample_bytes() -> Option<u64> {
    enabled().then(|| CONFIGURED.load(Relaxed))
}

/// Whether allocations are being sampled now.
pub fn sampling() -> Option<bool> {
    enabled().then(imp::sampling)
}

/// Switches allocation sampling on (at the configured rate) or off.
pub fn set_sampling(on: bool) -> Result<(), String> {
    if !enabled() {
        return Err(not_enabled());
    }
    if on {
        imp::start(CONFIGURED.load(Relaxed))
    } else {
        imp::stop();
        Ok(())
    }
}

/// Starts the sampler as `MEMSIGHT_HEAP_SAMPLE` says (`off`: ready but not sampling; a size: the
/// mean bytes between samples; unset: one sample per 512 KiB) and says what is in effect:
/// `Ok(Some(bytes))` sampling, `Ok(None)` off.
pub fn configure_from_env() -> Result<Option<u64>, String> {
    #[cfg(not(feature = "sampling"))]
    return Err(if crate::alloc::foreign::installed() {
        not_enabled()
    } else {
        imp::NO.into()
    });
    #[cfg(feature = "sampling")]
    {
        let wanted = crate::alloc::sampling::rate_from_env(CONFIGURED.load(Relaxed))?;
        if let Some(rate) = wanted {
            CONFIGURED.store(rate, Relaxed);
        }
        imp::start(CONFIGURED.load(Relaxed))?;
        if wanted.is_none() {
            imp::stop();
        }
        Ok(wanted)
    }
}

/// Writes a heap profile of the sampled blocks live now as `name` in the open directory `dir`,
/// complete or not at all (written beside it, then renamed; nothing reached by path again).
pub fn dump(
    dir: &std::sync::Arc<memsight_format::safe_dir::Dir>,
    name: &std::ffi::OsStr,
) -> Result<(), String> {
    write(dir, name, false)
}

/// As [`dump`], of the sampled blocks live at the process heap's latest peak (the session's peak):
/// the sites at the exact peak, however long ago it was.
pub fn dump_peak(
    dir: &std::sync::Arc<memsight_format::safe_dir::Dir>,
    name: &std::ffi::OsStr,
) -> Result<(), String> {
    write(dir, name, true)
}

fn write(
    dir: &std::sync::Arc<memsight_format::safe_dir::Dir>,
    name: &std::ffi::OsStr,
    at_peak: bool,
) -> Result<(), String> {
    let path = dir.path().join(name);
    if !enabled() {
        return Err(not_enabled());
    }
    let tmp = memsight_format::safe_file::Pending::in_dir(std::sync::Arc::clone(dir), name)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    imp::dump(&tmp.tmp_path(), CONFIGURED.load(Relaxed), at_peak)?;
    tmp.commit()
        .map(drop)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
