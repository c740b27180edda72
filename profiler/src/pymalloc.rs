//! Python's small-object arenas (pymalloc) as the `memsight` Python package reads them from
//! CPython (memsight/_pymalloc.py): kept here for the report, which states them beside the heap
//! figures they are not part of (pymalloc maps its arenas with `mmap`, outside the malloc family).

pub use memsight_format::heap::PythonArenas;
use std::sync::Mutex;

static LATEST: Mutex<Option<PythonArenas>> = Mutex::new(None);

/// Records the arenas as CPython counted them last (replacing an earlier reading).
pub fn record(arenas: PythonArenas) {
    *crate::sys::lock(&LATEST) = Some(arenas);
}

/// The latest reading, if the job sent one.
pub fn latest() -> Option<PythonArenas> {
    *crate::sys::lock(&LATEST)
}
