//! Python frames read from inside a process (memsight::pyframes, through the preloaded library's
//! `memsight_python_stack`), checked against what each interpreter says of itself: the frames of
//! `sys._getframe()` (file, line, qualified name) in nested methods, a non-ASCII name, a call
//! through C (`sorted`'s key), a generator and a second thread; and the line-table decoder against
//! `co_positions()`/`co_lines()` of every function of a few standard modules. Run for every CPython
//! 3.10–3.13 found on this machine (the torch venv's, `pythonX.Y` on the PATH, pyenv's); each one
//! missing is said and skipped.

use memsight::pyframes::linetable;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python_frames")
        .join(name)
}

fn preload() -> PathBuf {
    memsight_e2e::memsight_bin()
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("preload/release/libmemsight_preload.so"))
        .expect("target dir")
}

/// The interpreters of each minor version 3.10–3.13 found here.
fn interpreters() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    for minor in 10..=13 {
        let name = format!("python3.{minor}");
        let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(&name)).collect())
            .unwrap_or_default();
        if let Some(venv) = memsight_e2e::torch_python() {
            candidates.insert(0, venv);
        }
        if let Some(root) = &pyenv {
            if let Ok(dirs) = std::fs::read_dir(root.join("versions")) {
                let mut dirs: Vec<PathBuf> = dirs.flatten().map(|d| d.path()).collect();
                dirs.sort();
                candidates.extend(dirs.into_iter().map(|d| d.join("bin").join(&name)));
            }
        }
        let version = |py: &Path| {
            Command::new(py)
                .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        match candidates
            .into_iter()
            .filter(|p| p.is_file())
            .find(|p| version(p).as_deref() == Some(&format!("3.{minor}")))
        {
            Some(py) => found.push((format!("3.{minor}"), py)),
            None => println!("SKIP 3.{minor}: no {name} here (PATH, pyenv, the torch venv)"),
        }
    }
    found
}

fn json_lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn python_frames_read_in_process_are_the_interpreters_own() {
    if !memsight_e2e::preload_built() {
        return;
    }
    let lib = preload();
    let pythons = interpreters();
    assert!(
        !pythons.is_empty() || memsight_e2e::torch_python().is_none(),
        "no Python 3.10–3.13 found although the torch venv exists"
    );
    for (version, py) in pythons {
        let out = Command::new(&py)
            .arg(script("stack.py"))
            .env("LD_PRELOAD", &lib)
            .output()
            .expect("python runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{version}: {stderr}");
        let shapes = json_lines(&out.stdout);
        assert_eq!(shapes.len(), 5, "{version}: {shapes:?} {stderr}");
        for s in &shapes {
            let shape = s["shape"].as_str().unwrap();
            assert_eq!(
                s["read"], s["want"],
                "{version}, {shape}: the frames read differ from the interpreter's"
            );
            if shape == "through C" {
                // sorted() is C: native frames lie between the key function and its caller.
                assert!(
                    !s["gaps"].as_array().unwrap().is_empty(),
                    "{version}: no native frames between Python frames through sorted(): {s}"
                );
            }
        }
        println!(
            "{version}: {} shapes read exactly ({})",
            shapes.len(),
            py.display()
        );
    }
}

#[test]
fn the_line_table_decoder_agrees_with_every_interpreter() {
    for (version, py) in interpreters() {
        let out = Command::new(&py)
            .arg(script("linetables.py"))
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (mut codes, mut checked) = (0, 0);
        for c in json_lines(&out.stdout) {
            let table: Vec<u8> = (0..c["table"].as_str().unwrap().len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&c["table"].as_str().unwrap()[i..i + 2], 16).unwrap())
                .collect();
            let first = c["first"].as_i64().unwrap() as i32;
            let bytes = c["unit"] == "bytes";
            for (i, want) in c["lines"].as_array().unwrap().iter().enumerate() {
                let got = if bytes {
                    linetable::line_310(&table, first, i as u32 * 2)
                } else {
                    linetable::line_311(&table, first, i as u32)
                };
                let want = want.as_u64().filter(|&l| l > 0).map(|l| l as u32);
                assert_eq!(got, want, "{version}: {} unit {i}", c["name"]);
                checked += 1;
            }
            codes += 1;
        }
        assert!(codes > 100, "{version}: only {codes} code objects");
        println!("{version}: {checked} instructions of {codes} code objects decoded as the interpreter does");
    }
}
