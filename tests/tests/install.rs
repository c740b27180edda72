//! memsight installed the way its users install tools, then used as they use it:
//! - the wheel (`make wheel`: maturin, integrations/python/pyproject.toml) in a fresh virtual
//!   environment with no cargo on `PATH` and torch from the set-up's cache (a `.pth` names that
//!   venv's site-packages): a PyTorch training script under the installed `memsight run` gets its
//!   report, heap and `import memsight` steps, with the library the wheel carries; `--version`
//!   agrees with the package; `view`, `check`, `summary`, `diagnose` and `estimate` work;
//! - `cargo install --path tui` into a temporary root: `memsight run` on a Python job.
//!
//! Both build into `<target>/install` (kept between runs; its first build is the tui's whole tree)
//! and reuse the preloaded library that `make build` built (MEMSIGHT_PRELOAD_TARGET_DIR). Each
//! skips, saying why, without the torch venv or maturin (scripts/setup.sh installs both).

use memsight_e2e::{memsight_bin, scratch, torch_python, wait_until};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

/// `<target>`: the directory of this build (`<target>/release/memsight`).
fn target_dir() -> PathBuf {
    memsight_bin()
        .ancestors()
        .nth(2)
        .expect("target dir")
        .to_path_buf()
}

/// A cargo build of the installed tool: its own target directory (the tests' binaries stay as
/// they are), the preloaded library of `make build`.
fn cargo_env(cmd: &mut Command) -> &mut Command {
    let target = target_dir();
    cmd.env("CARGO_TARGET_DIR", target.join("install"))
        .env("MEMSIGHT_PRELOAD_TARGET_DIR", target.join("preload"))
        .env_remove("MEMSIGHT_BUNDLE_PRELOAD")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
}

fn ok(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `PATH` without any directory that holds cargo or rustc, with `first` in front.
fn path_without_rust(first: &Path) -> OsString {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let kept = std::env::split_paths(&current)
        .filter(|d| !d.join("cargo").exists() && !d.join("rustc").exists());
    std::env::join_paths(std::iter::once(first.to_path_buf()).chain(kept)).expect("a valid PATH")
}

/// A training script: three steps marked with `import memsight`, 64 MiB of tensors held from step
/// 1; prints where its preloaded library was mapped from.
const TRAIN: &str = r#"
import torch, memsight
assert memsight.active(), "memsight is not active in the job"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
held = []
for n in range(3):
    memsight.step(n)
    with memsight.phase("forward"):
        loss = model(torch.randn(64, 256)).pow(2).mean()
        if n == 1:
            held.append(torch.ones(16 << 20))
    with memsight.phase("backward"):
        opt.zero_grad()
        loss.backward()
        opt.step()
libs = {l.split()[-1] for l in open("/proc/self/maps") if "libmemsight_preload" in l}
print("preloaded:", *libs)
"#;

/// Runs `memsight run` of `python script` and returns its output and report.
fn run_job(
    memsight: &Path,
    dir: &Path,
    python: &Path,
    script: &str,
    envs: &[(&str, OsString)],
) -> (String, Value) {
    let report = dir.join("r.json");
    let out = ok(
        "memsight run",
        Command::new(memsight)
            .args(["run", "--interval", "50ms", "--report"])
            .arg(&report)
            .arg("--")
            .arg(python)
            .args(["-c", script])
            .current_dir(dir)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .env_remove("MEMSIGHT_PRELOAD_LIB")
            .env_remove("PYTHONPATH")
            .output(),
    );
    let v = serde_json::from_str(&std::fs::read_to_string(&report).expect("the report"))
        .expect("a JSON report");
    (text(&out), v)
}

/// What every installed `memsight run` must give a marked Python job.
fn assert_counted(out: &str, v: &Value, min_peak: u64) {
    let steps: Vec<u64> = v["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("no steps: {out}"))
        .iter()
        .filter_map(|s| s["step"].as_u64())
        .collect();
    assert_eq!(steps, [0, 1, 2], "{out}");
    let peak = v["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!(peak >= min_peak, "heap peak {} MiB: {out}", peak / MIB);
    let forward = v["phases"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["path"] == "forward"))
        .unwrap_or_else(|| panic!("no forward phase: {}", v["phases"]));
    assert_eq!(forward["count"], 3, "{forward}");
}

/// The library the job mapped: one file, under `under`.
fn assert_preloaded_from(out: &str, under: &Path) {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("preloaded:"))
        .unwrap_or_else(|| panic!("the job did not say: {out}"));
    let libs: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(libs.len(), 1, "{out}");
    assert!(
        Path::new(libs[0]).starts_with(under),
        "preloaded from {}, not under {}",
        libs[0],
        under.display()
    );
}

#[test]
fn the_wheel_installs_the_command_the_library_and_the_package() {
    let Some(torch_py) = torch_python() else {
        println!("SKIP: no torch venv (scripts/setup.sh makes it; make test runs it)");
        return;
    };
    let maturin = torch_py.with_file_name("maturin");
    if !maturin.exists() {
        println!("SKIP: no maturin in the torch venv (scripts/setup.sh installs it)");
        return;
    }
    let dir = scratch("install-wheel");
    let wheels = dir.join("wheels");
    ok(
        "maturin build",
        cargo_env(&mut Command::new(&maturin))
            .args(["build", "--release", "--out"])
            .arg(&wheels)
            .current_dir(repo().join("integrations/python"))
            .output(),
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("the wheel directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    let name = wheel.file_name().and_then(|n| n.to_str()).expect("a name");
    assert!(
        name.starts_with("memsight-") && name.contains("manylinux"),
        "{name}"
    );
    println!(
        "wheel {name}: {} KiB",
        wheel.metadata().map(|m| m.len()).unwrap_or(0) >> 10
    );

    // A fresh venv, torch reachable through a .pth, the wheel installed, no cargo.
    let venv = dir.join("venv");
    ok(
        "python -m venv",
        Command::new(&torch_py)
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv)
            .output(),
    );
    let py = venv.join("bin/python");
    let site = |python: &Path| {
        let out = ok(
            "sysconfig",
            Command::new(python)
                .args([
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ])
                .output(),
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    let torch_site = site(&torch_py);
    std::fs::write(
        site(&py).join("memsight-test-torch.pth"),
        format!("{}\n", torch_site.display()),
    )
    .expect("the .pth");
    ok(
        "pip install",
        Command::new(&torch_py)
            .args(["-m", "pip", "--disable-pip-version-check", "--python"])
            .arg(&py)
            .args(["install", "--no-deps", "--no-index"])
            .arg(&wheel)
            .output(),
    );
    let bin = venv.join("bin");
    let memsight = bin.join("memsight");
    let path = path_without_rust(&bin);
    let cache = dir.join("cache");
    let envs = [
        ("PATH", path.clone()),
        ("VIRTUAL_ENV", venv.clone().into_os_string()),
        ("XDG_CACHE_HOME", cache.clone().into_os_string()),
    ];
    let cmd = |args: &[&str]| {
        let mut c = Command::new(&memsight);
        c.args(args)
            .current_dir(&dir)
            .envs(envs.iter().map(|(k, v)| (k, v)));
        c
    };
    let no_cargo = Command::new("sh")
        .args(["-c", "command -v cargo rustc"])
        .env("PATH", &path)
        .output();
    assert!(
        no_cargo.is_ok_and(|o| o.stdout.is_empty()),
        "cargo is on the test's PATH"
    );

    // The package is the installed one, and its version is the command's.
    let pkg = ok(
        "import memsight",
        Command::new(&py)
            .args(["-c", "import memsight, importlib.metadata as m; print(memsight.__file__); print(m.version('memsight'))"])
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .output(),
    );
    let pkg = String::from_utf8_lossy(&pkg.stdout).into_owned();
    let mut lines = pkg.lines();
    let file = lines.next().unwrap_or_default();
    assert!(
        Path::new(file).starts_with(&venv),
        "memsight imported from {file}"
    );
    let version = lines.next().unwrap_or_default();
    let said = text(&ok("memsight --version", cmd(&["--version"]).output()));
    assert_eq!(said.trim(), format!("memsight {version}"), "{pkg}");

    // A PyTorch job under the installed command, with the library the wheel carries.
    let (out, v) = run_job(&memsight, &dir, &py, TRAIN, &envs);
    assert_counted(&out, &v, 64 * MIB);
    assert_preloaded_from(&out, &cache.join("memsight/lib"));

    // The other verbs, on that report.
    let report = dir.join("r.json");
    let r = report.to_str().expect("a UTF-8 path");
    let check = cmd(&["check", r, "--max-host-peak", "1GiB"]).output();
    assert!(check.is_ok_and(|o| o.status.success()), "check");
    let md = text(&ok(
        "summary",
        cmd(&["summary", r, "--format", "markdown"]).output(),
    ));
    assert!(md.contains("heap"), "{md}");
    let log = dir.join("train.log");
    std::fs::write(&log, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.77 GiB of which 1.19 GiB is free.\n").expect("the log");
    let diag = text(&ok(
        "diagnose",
        cmd(&["diagnose", log.to_str().expect("UTF-8")]).output(),
    ));
    assert!(diag.contains("verdict:"), "{diag}");
    let est = text(&ok(
        "estimate",
        cmd(&[
            "estimate", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32",
            "--batch", "1",
        ])
        .output(),
    ));
    assert!(est.to_lowercase().contains("peak"), "{est}");
    view_in_tmux(&memsight, &report, &path);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `memsight view REPORT` in tmux shows the report's screen and closes on `q`.
fn view_in_tmux(memsight: &Path, report: &Path, path: &OsString) {
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    if tmux(&["-V"]).is_err() {
        println!("SKIP (view only): tmux is not installed (the set-up installs it where it can)");
        return;
    }
    let session = format!("memsight-install-{}", std::process::id());
    let view = format!(
        "env PATH={} {} view {}",
        path.to_string_lossy(),
        memsight.display(),
        report.display()
    );
    let _ = tmux(&["new-session", "-d", "-s", &session, &view]);
    let screen = || tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let shown = wait_until(20, || screen().contains("step"));
    let seen = screen();
    let _ = tmux(&["send-keys", "-t", &session, "q"]);
    let open = || {
        Command::new("tmux")
            .args(["has-session", "-t", &session])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let closed = wait_until(10, || !open());
    let _ = tmux(&["kill-session", "-t", &session]);
    assert!(shown, "the viewer showed no report:\n{seen}");
    assert!(closed, "the viewer did not close on q");
}

#[test]
fn cargo_install_gives_a_memsight_run_that_preloads_a_python_job() {
    let Some(python) = torch_python() else {
        println!("SKIP: no torch venv (scripts/setup.sh makes it; make test runs it)");
        return;
    };
    let Some(cargo) = std::env::var_os("CARGO") else {
        println!("SKIP: not run by cargo (CARGO is not set)");
        return;
    };
    let dir = scratch("install-cargo");
    let root = dir.join("root");
    ok(
        "cargo install",
        cargo_env(&mut Command::new(cargo))
            .args(["install", "--locked", "--path"])
            .arg(repo().join("tui"))
            .arg("--root")
            .arg(&root)
            .output(),
    );
    let memsight = root.join("bin/memsight");
    let ldd = text(&ok("ldd", Command::new("ldd").arg(&memsight).output()));
    assert!(!ldd.contains("torch"), "the command links libtorch:\n{ldd}");
    let cache = dir.join("cache");
    let envs = [
        ("PATH", path_without_rust(&root.join("bin"))),
        ("XDG_CACHE_HOME", cache.clone().into_os_string()),
    ];
    let job = "import memsight\nheld = []\nfor n in range(3):\n    memsight.step(n)\n    with memsight.phase('forward'):\n        if n == 1:\n            held.append(bytearray(48 << 20))\nlibs = {l.split()[-1] for l in open('/proc/self/maps') if 'libmemsight_preload' in l}\nprint('preloaded:', *libs)\n";
    let (out, v) = run_job(&memsight, &dir, &python, job, &envs);
    assert_counted(&out, &v, 48 * MIB);
    assert_preloaded_from(&out, &cache.join("memsight/lib"));
    let _ = std::fs::remove_dir_all(&dir);
}
