//! jemalloc's own statistics: allocated, active, resident, mapped, retained, metadata.
//! One epoch advance per read (5–20 µs), so this is sampled, never called on a hot path.

use memsight_format::host::JemallocStats;

#[cfg(feature = "jemalloc")]
mod imp {
    use super::JemallocStats;
    use tikv_jemalloc_ctl::{epoch, epoch_mib, stats};

    /// Reads jemalloc statistics through MIBs resolved once.
    pub struct JemallocReader {
        epoch: epoch_mib,
        allocated: stats::allocated_mib,
        active: stats::active_mib,
        resident: stats::resident_mib,
        mapped: stats::mapped_mib,
        retained: stats::retained_mib,
        metadata: stats::metadata_mib,
    }

    impl JemallocReader {
        /// Resolves the statistics' names; the reason when jemalloc lacks them.
        pub fn open() -> Result<Self, String> {
            let e =
                |err: tikv_jemalloc_ctl::Error| format!("jemalloc statistics unavailable: {err}");
            Ok(JemallocReader {
                epoch: epoch::mib().map_err(e)?,
                allocated: stats::allocated::mib().map_err(e)?,
                active: stats::active::mib().map_err(e)?,
                resident: stats::resident::mib().map_err(e)?,
                mapped: stats::mapped::mib().map_err(e)?,
                retained: stats::retained::mib().map_err(e)?,
                metadata: stats::metadata::mib().map_err(e)?,
            })
        }

        /// Advances the epoch and reads every statistic.
        pub fn read(&self) -> Result<JemallocStats, String> {
            let e = |err: tikv_jemalloc_ctl::Error| format!("jemalloc read failed: {err}");
            self.epoch.advance().map_err(e)?;
            Ok(JemallocStats {
                allocated: self.allocated.read().map_err(e)? as u64,
                active: self.active.read().map_err(e)? as u64,
                resident: self.resident.read().map_err(e)? as u64,
                mapped: self.mapped.read().map_err(e)? as u64,
                retained: self.retained.read().map_err(e)? as u64,
                metadata: self.metadata.read().map_err(e)? as u64,
            })
        }
    }
}

#[cfg(not(feature = "jemalloc"))]
mod imp {
    use super::JemallocStats;

    /// Without the `jemalloc` feature there is nothing to read.
    pub struct JemallocReader;

    impl JemallocReader {
        /// Always the reason: built without jemalloc.
        pub fn open() -> Result<Self, String> {
            if crate::alloc::foreign::installed() {
                return Err(crate::alloc::foreign::WHY_NO_JEMALLOC.into());
            }
            Err("memsight was built without the `jemalloc` feature".into())
        }

        /// Unreachable in practice: `open` never succeeds.
        pub fn read(&self) -> Result<JemallocStats, String> {
            Err("memsight was built without the `jemalloc` feature".into())
        }
    }
}

pub use imp::JemallocReader;

/// Returns every arena's unused dirty and muzzy pages to the OS now (`arena.<all>.purge`):
/// the host-side counterpart of CUDA's empty-cache, for periodic cleanup.
pub fn purge() -> Result<(), String> {
    #[cfg(feature = "jemalloc")]
    {
        // MALLCTL_ARENAS_ALL is 4096 in jemalloc 5; the control takes neither input nor output.
        let name = c"arena.4096.purge";
        // SAFETY: a NUL-terminated name and null old/new pointers, as this control requires.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("jemalloc purge failed: error {rc}"))
        }
    }
    #[cfg(not(feature = "jemalloc"))]
    {
        Err("memsight was built without the `jemalloc` feature".into())
    }
}
