//! The heap side of a snapshot: the tracking allocator's counters as plain data, and the shape of
//! its size histogram. The allocator that fills them is `memsight::Allocator`.

/// Number of power-of-two size buckets: bucket `i` counts sizes in `[2^(i-1), 2^i)`, bucket 0 is 0.
/// One per bit position, so computing a bucket needs no clamp.
pub const HISTOGRAM_BUCKETS: usize = usize::BITS as usize + 1;

/// Heap statistics of the tracking allocator, read without allocating (also the `heap` part of
/// every [`crate::snapshot::Snapshot`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeapStats {
    /// Bytes of the process heap currently live (exact). With memsight's `jemalloc` feature (the
    /// default) that is every allocation jemalloc serves in the process — Rust's, and C and C++
    /// code's through the `malloc` family memsight defines — at its usable size; without it, Rust's
    /// allocations through `memsight::Allocator` at their requested size.
    pub live_bytes: u64,
    /// Rust's share: bytes live through `memsight::Allocator`, at their requested size (0 in
    /// reports written before it existed, and when no `memsight::Allocator` is installed).
    #[serde(default)]
    pub rust_live_bytes: u64,
    /// Highest live bytes since start or the last `memsight::reset_peak` (within 64 KiB per allocating
    /// thread of the true peak).
    pub peak_bytes: u64,
    /// Highest live bytes since the process started, with the same bound as `peak_bytes`; never
    /// lowered by `memsight::reset_peak`, so a report's peak is the run's even when the program
    /// resets the peak it reads back (0 in reports written before it existed).
    #[serde(default)]
    pub run_peak_bytes: u64,
    /// Allocation calls so far (Rust's).
    pub allocations: u64,
    /// Deallocation calls so far (Rust's).
    pub deallocations: u64,
    /// Reallocation calls so far (Rust's).
    pub reallocations: u64,
    /// Cumulative bytes handed out through `memsight::Allocator` (Rust's, requested sizes).
    pub bytes_allocated: u64,
    /// Cumulative bytes returned through `memsight::Allocator` (Rust's).
    pub bytes_freed: u64,
}

/// Python's small-object arenas (pymalloc): objects of 512 bytes or less live in arenas CPython
/// maps with `mmap`, outside the malloc family that the heap counters count. CPython's own exact
/// figures (`_PyObject_DebugMallocStats`), read by the `memsight` Python package as the
/// interpreter exits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PythonArenas {
    /// Bytes of one arena (1 MiB since CPython 3.10, 256 KiB before).
    pub arena_size_bytes: u64,
    /// The most arenas allocated at once (CPython's high-water mark: an exact peak).
    pub peak_arenas: u64,
    /// `peak_arenas` × `arena_size_bytes`.
    pub peak_bytes: u64,
    /// Arenas allocated when read.
    pub arenas: u64,
    /// `arenas` × `arena_size_bytes`.
    pub bytes: u64,
    /// Bytes in the objects' blocks when read (the rest of the arenas is free room in them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_blocks_bytes: Option<u64>,
}
