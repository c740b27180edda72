//! Builds the preloaded library (profiler/preload) and bundles it into the `memsight` command, so
//! that `cargo install --path tui` and the wheel give a `memsight run` that preloads memsight with
//! nothing else installed (src/preload.rs writes it out where no library file is found).
//!
//! The library is its own cargo workspace (built inside this one, `memsight` would carry
//! jemalloc's `malloc` family) with initial-exec thread-locals (the Makefile says why), so this
//! runs a second cargo on it: the same flags and target directory as `make build`
//! (`<target>/preload`), where it is then already built. `MEMSIGHT_PRELOAD_TARGET_DIR` names
//! another target directory for it; `MEMSIGHT_BUNDLE_PRELOAD=0` bundles nothing (`memsight run`
//! then needs the library as a file: see src/preload.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

const LIBRARY: &str = "libmemsight_preload.so";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let profiler = manifest_dir.join("../profiler");
    for env in ["MEMSIGHT_BUNDLE_PRELOAD", "MEMSIGHT_PRELOAD_TARGET_DIR"] {
        println!("cargo:rerun-if-env-changed={env}");
    }
    // Every source the library is built from: its own crate and the path crates it uses.
    for p in [
        "preload/src",
        "preload/build.rs",
        "preload/Cargo.toml",
        "preload/Cargo.lock",
        "src",
        "Cargo.toml",
        "format/src",
        "format/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", profiler.join(p).display());
    }
    let off = std::env::var("MEMSIGHT_BUNDLE_PRELOAD").is_ok_and(|v| v == "0");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let source = profiler.join("preload/Cargo.toml");
    let bundled = if off || !linux || !source.is_file() {
        None
    } else {
        Some(build_library(&source, &out))
    };
    let code = match bundled {
        Some((lib, id)) => format!(
            "/// The preloaded library built with this command, and its identity (version and \
             content hash).\npub const BUNDLED: Option<(&[u8], &str)> = \
             Some((include_bytes!({:?}), {id:?}));\n",
            lib.display().to_string()
        ),
        None => "/// No preloaded library was bundled (MEMSIGHT_BUNDLE_PRELOAD=0, or not Linux).\n\
                 pub const BUNDLED: Option<(&[u8], &str)> = None;\n"
            .to_string(),
    };
    std::fs::write(out.join("bundled_preload.rs"), code).expect("a writable OUT_DIR");
}

/// Builds the library (release, initial-exec thread-locals), copies it into `out` without its
/// debug information, and returns that copy's path and identity.
fn build_library(manifest: &Path, out: &Path) -> (PathBuf, String) {
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let host = std::env::var("HOST").expect("cargo sets HOST");
    let target_dir = std::env::var_os("MEMSIGHT_PRELOAD_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_target_dir(out).join("preload"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    if target != host {
        cmd.arg("--target").arg(&target);
    }
    // The flags of `make build` (Makefile: PRELOAD_ENV), and none of this build's: cargo gives
    // build scripts its own rustflags and, under clippy, a wrapper for this workspace's crates.
    cmd.env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", "-Z tls-model=initial-exec")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not start cargo to build {LIBRARY}: {e}"));
    assert!(
        status.success(),
        "building {LIBRARY} ({}) failed: {status}; MEMSIGHT_BUNDLE_PRELOAD=0 builds the command \
         without it",
        manifest.display()
    );
    let mut built = target_dir;
    if target != host {
        built.push(&target);
    }
    built.push("release");
    built.push(LIBRARY);
    let copy = out.join(LIBRARY);
    let _ = std::fs::remove_file(&copy);
    // Line tables are 8 of its 9.5 MB; its symbols stay. Without `strip`, the whole file.
    let stripped = Command::new(std::env::var_os("STRIP").unwrap_or_else(|| "strip".into()))
        .arg("--strip-debug")
        .arg("-o")
        .arg(&copy)
        .arg(&built)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        println!("cargo:warning=no `strip`: {LIBRARY} is bundled with its debug information");
        std::fs::copy(&built, &copy).unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
    }
    let bytes = std::fs::read(&copy).unwrap_or_else(|e| panic!("{}: {e}", copy.display()));
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    (copy, format!("{version}-{:016x}", fnv1a(&bytes)))
}

/// The target directory of this build: OUT_DIR is `<target>[/<triple>]/<profile>/build/<pkg>/out`.
fn workspace_target_dir(out: &Path) -> PathBuf {
    let dir = out.ancestors().nth(4).unwrap_or(out);
    let triple = std::env::var_os("TARGET");
    match dir.parent() {
        Some(parent) if triple.is_some() && dir.file_name() == triple.as_deref() => parent,
        _ => dir,
    }
    .to_path_buf()
}

/// FNV-1a (64 bits): a name for this build of the library, not a checksum against tampering.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
