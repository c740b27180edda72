//! Helpers for the end-to-end tests: locating the built `memsight` binary and scratch directories.

use std::path::PathBuf;

/// The `memsight` binary of this workspace's target directory (built by `make test` first).
pub fn memsight_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/memsight
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("memsight"))
        .expect("target dir");
    assert!(bin.exists(), "{} is missing: build it first with `cargo build --release -p memsight-tui` (make test does)", bin.display());
    bin
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memsight-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}
