//! jemalloc's heap profiler switches (mallctl): is it compiled in and enabled, sampling on or off
//! now, the sampling rate, and writing a dump. With the `heap-profile` feature the binary carries
//! jemalloc's start-up configuration (`malloc_conf`: profiling on, one sample per 512 KiB), which
//! `MALLOC_CONF` still overrides; `MEMSIGHT_HEAP_SAMPLE` (`off` or a size, set by `memsight run`)
//! adjusts it when the session starts.

use std::path::Path;

/// How a process gets heap profiling.
pub const HOW_TO_ENABLE: &str = "build the job with memsight's `heap-profile` feature \
(memsight = { features = [\"heap-profile\"] })";

/// The default mean bytes between samples.
pub const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;

#[cfg(feature = "heap-profile")]
mod start_up {
    /// A C string pointer jemalloc reads at start-up.
    #[repr(transparent)]
    pub struct ConfPtr(*const std::ffi::c_char);
    // SAFETY: it points at a static, immutable C string.
    unsafe impl Sync for ConfPtr {}

    /// jemalloc's compiled-in options (it defines a weak `malloc_conf`, `_rjem_`-prefixed as all its
    /// symbols; this one wins), read before
    /// the first allocation: profiling on from the start, one sample per 512 KiB allocated.
    #[used]
    #[export_name = "_rjem_malloc_conf"]
    pub static MALLOC_CONF: ConfPtr =
        ConfPtr(c"prof:true,prof_active:true,lg_prof_sample:19".as_ptr());
}

#[cfg(feature = "heap-profile")]
mod imp {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use tikv_jemalloc_ctl::raw;

    pub fn enabled() -> bool {
        // SAFETY: `opt.prof` is a bool.
        unsafe { raw::read::<bool>(b"opt.prof\0") }.unwrap_or(false)
    }

    pub fn sample_bytes() -> Option<u64> {
        // SAFETY: `prof.lg_sample` is a size_t.
        let lg = unsafe { raw::read::<usize>(b"prof.lg_sample\0") }.ok()?;
        (lg < 64).then(|| 1u64 << lg)
    }

    pub fn sampling() -> Option<bool> {
        // SAFETY: `prof.active` is a bool.
        unsafe { raw::read::<bool>(b"prof.active\0") }.ok()
    }

    pub fn set_sampling(on: bool) -> Result<(), String> {
        // SAFETY: `prof.active` is a bool.
        unsafe { raw::write(b"prof.active\0", on) }
            .map_err(|e| format!("cannot switch heap sampling: {e}"))
    }

    pub fn reset(lg_sample: usize) -> Result<(), String> {
        // SAFETY: `prof.reset` takes a size_t (the new lg_prof_sample).
        unsafe { raw::write(b"prof.reset\0", lg_sample) }
            .map_err(|e| format!("cannot set the heap sampling rate: {e}"))
    }

    pub fn dump(path: &Path) -> Result<(), String> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("bad profile path {}", path.display()))?;
        // SAFETY: `prof.dump` takes a NUL-terminated path that outlives the call.
        unsafe { raw::write(b"prof.dump\0", c.as_ptr()) }
            .map_err(|e| format!("jemalloc could not write {}: {e}", path.display()))
    }
}

#[cfg(not(feature = "heap-profile"))]
mod imp {
    use std::path::Path;

    pub fn enabled() -> bool {
        false
    }
    pub fn sample_bytes() -> Option<u64> {
        None
    }
    pub fn sampling() -> Option<bool> {
        None
    }
    pub fn set_sampling(_: bool) -> Result<(), String> {
        Err("memsight was built without its `heap-profile` feature".into())
    }
    pub fn reset(_: usize) -> Result<(), String> {
        Err("memsight was built without its `heap-profile` feature".into())
    }
    pub fn dump(_: &Path) -> Result<(), String> {
        Err("memsight was built without its `heap-profile` feature".into())
    }
}

/// Why there is no heap profiling in this process, and how to get it.
fn not_enabled() -> String {
    #[cfg(not(feature = "jemalloc"))]
    if crate::alloc::foreign::installed() {
        return "allocation sites are not recorded in a job memsight is preloaded into (its heap \
                is counted exactly, without sites)"
            .into();
    }
    format!("heap profiling is not enabled: {HOW_TO_ENABLE}")
}

/// Whether jemalloc's heap profiler is enabled in this process (`prof:true` at start).
pub fn enabled() -> bool {
    imp::enabled()
}

/// Mean bytes between samples, when profiling is enabled.
pub fn sample_bytes() -> Option<u64> {
    imp::sample_bytes()
}

/// Whether allocations are being sampled now.
pub fn sampling() -> Option<bool> {
    imp::sampling()
}

/// Switches allocation sampling on or off (profiling must be enabled at start).
pub fn set_sampling(on: bool) -> Result<(), String> {
    if !enabled() {
        return Err(not_enabled());
    }
    imp::set_sampling(on)
}

/// Applies `MEMSIGHT_HEAP_SAMPLE` (`off`, or the mean bytes between samples, rounded down to a
/// power of two) and says what is in effect: `Ok(Some(bytes))` sampling, `Ok(None)` off.
pub fn configure_from_env() -> Result<Option<u64>, String> {
    if !enabled() {
        return Err(not_enabled());
    }
    match std::env::var("MEMSIGHT_HEAP_SAMPLE") {
        Ok(v) if v.trim() == "off" => {
            imp::set_sampling(false)?;
            Ok(None)
        }
        Ok(v) => {
            let bytes = memsight_format::units::parse_size(v.trim())
                .ok()
                .filter(|b| *b >= 1)
                .ok_or_else(|| format!("MEMSIGHT_HEAP_SAMPLE={v:?} is neither `off` nor a size"))?;
            let lg = 63 - bytes.leading_zeros() as usize;
            if sample_bytes() != Some(1 << lg) {
                imp::reset(lg)?;
            }
            imp::set_sampling(true)?;
            Ok(sample_bytes())
        }
        Err(_) => Ok(if sampling() == Some(true) {
            sample_bytes()
        } else {
            None
        }),
    }
}

/// Writes a heap profile to `path`, complete or not at all (written beside it, then renamed).
pub fn dump(path: &Path) -> Result<(), String> {
    if !enabled() {
        return Err(not_enabled());
    }
    let tmp = memsight_format::safe_file::Pending::new(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    imp::dump(tmp.tmp_path())?;
    tmp.commit()
        .map(drop)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
