//! Links the unwinder the library needs (Rust's standard library, and the sampler's stack walker)
//! statically from `libgcc_eh.a`, so the library loads no `libgcc_s.so.1`: every process of a job
//! carries the library, and a second shared object (opened, mapped, relocated, and its CPU-feature
//! constructor run) is a third of what loading memsight costs a short-lived helper (measured in
//! docs/benchmarks.md, issue 35).
//!
//! Rust's standard library asks for `-lgcc_s` itself; a linker script of that name, found first,
//! answers with the static archive instead. Where the C compiler has no `libgcc_eh.a`, nothing is
//! changed and the library links `libgcc_s.so.1` as before.
//!
//! It also keeps the code every process runs as it loads, first allocates, forks and exits
//! (`#[link_section = ".text.hot.memsight"]` in this crate and the counters of `memsight`) in one
//! output section, `.text.hot` (`-z keep-text-section-prefix`; without it the linker interleaves
//! those functions with the rest of 1.2 MB of code): each 64 KiB of code a process touches is a
//! page fault, and a `date` in a shell loop touched eleven such windows of the library's.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    if !linux_gnu {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,keep-text-section-prefix");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let archive = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    // `-print-file-name` echoes the bare name when it finds no such file.
    let Some(archive) = archive.filter(|p| p.is_absolute() && p.is_file()) else {
        println!("cargo:warning=no libgcc_eh.a: the preloaded library links libgcc_s.so.1");
        return;
    };
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let dir = out.join("static-libgcc");
    let script = format!("INPUT({})\n", archive.display());
    if std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("libgcc_s.so"), script))
        .is_ok()
    {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
}
