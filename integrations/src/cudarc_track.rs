//! cudarc (feature `cudarc`): a tracked allocation layer for Rust CUDA code. [`Tracked`] wraps a
//! stream; its `alloc`/`alloc_zeros`/`clone_htod` return [`TrackedSlice`]s that count their bytes
//! per device while alive (live and peak) and record their own free. Also cuMemGetInfo. cudarc
//! panics when the driver library is absent, so every entry point checks for it first.

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use memsight::collect::SourceStatus;
use memsight::devices::{self, DeviceSample, DeviceSource};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

const MAX_DEVICES: usize = 64;
static LIVE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static PEAK: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// True when the CUDA driver library can be loaded (cudarc would panic otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Live and peak tracked bytes on `device`.
pub fn tracked(device: usize) -> (u64, u64) {
    let d = device.min(MAX_DEVICES - 1);
    (LIVE[d].load(Relaxed), PEAK[d].load(Relaxed))
}

/// A device buffer whose bytes count in memsight until it is dropped.
pub struct TrackedSlice<T> {
    slice: CudaSlice<T>,
    device: usize,
    bytes: u64,
}

impl<T> TrackedSlice<T> {
    /// The cudarc slice.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The cudarc slice, mutably.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for TrackedSlice<T> {
    fn drop(&mut self) {
        let _ = LIVE[self.device]
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(self.bytes)));
    }
}

/// A stream whose allocations are tracked.
pub struct Tracked {
    stream: Arc<CudaStream>,
    device: usize,
}

impl Tracked {
    /// Tracks allocations made on `stream` (of device `device`).
    pub fn new(stream: Arc<CudaStream>, device: usize) -> Self {
        Tracked {
            stream,
            device: device.min(MAX_DEVICES - 1),
        }
    }

    fn track<T>(&self, slice: CudaSlice<T>, n: usize) -> TrackedSlice<T> {
        let bytes = (n * std::mem::size_of::<T>()) as u64;
        let live = LIVE[self.device].fetch_add(bytes, Relaxed) + bytes;
        PEAK[self.device].fetch_max(live, Relaxed);
        TrackedSlice {
            slice,
            device: self.device,
            bytes,
        }
    }

    /// Uninitialised device memory for `n` elements.
    ///
    /// # Safety
    /// As `CudaStream::alloc`: the contents are uninitialised.
    pub unsafe fn alloc<T: DeviceRepr>(
        &self,
        n: usize,
    ) -> Result<TrackedSlice<T>, cudarc::driver::DriverError> {
        let s = self.stream.alloc::<T>(n)?;
        Ok(self.track(s, n))
    }

    /// Zeroed device memory for `n` elements.
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<TrackedSlice<T>, cudarc::driver::DriverError> {
        let s = self.stream.alloc_zeros::<T>(n)?;
        Ok(self.track(s, n))
    }

    /// A host → device copy.
    pub fn clone_htod<T: DeviceRepr>(
        &self,
        src: &[T],
    ) -> Result<TrackedSlice<T>, cudarc::driver::DriverError> {
        let s = self.stream.clone_htod(src)?;
        Ok(self.track(s, src.len()))
    }
}

/// (free, total) device memory from cuMemGetInfo for the current context.
pub fn mem_get_info() -> Option<(u64, u64)> {
    if !driver_present() {
        return None;
    }
    cudarc::driver::result::mem_get_info()
        .ok()
        .map(|(f, t)| (f as u64, t as u64))
}

struct CudarcSource;

impl DeviceSource for CudarcSource {
    fn name(&self) -> &str {
        "cudarc"
    }

    fn status(&self) -> SourceStatus {
        SourceStatus {
            name: "cudarc".into(),
            available: true,
            detail: "tracked allocations through memsight_integrations::cudarc_track::Tracked"
                .into(),
        }
    }

    fn sample(&mut self, out: &mut Vec<DeviceSample>) {
        for d in 0..MAX_DEVICES {
            let (live, peak) = tracked(d);
            if peak == 0 {
                continue;
            }
            out.push(DeviceSample {
                index: d as u32,
                backend: "cudarc".into(),
                allocated_bytes: Some(live),
                peak_allocated_bytes: Some(peak),
                ..Default::default()
            });
        }
    }
}

/// Registers the tracked layer as a device source, or absent when the driver is missing.
pub fn install() -> SourceStatus {
    if !driver_present() {
        return crate::absent(
            "cudarc",
            "the CUDA driver library (libcuda.so) is not present",
        );
    }
    let s = CudarcSource;
    let status = s.status();
    devices::register(Box::new(s));
    status
}
