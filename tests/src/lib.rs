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

/// Whether the preloaded library `memsight run` puts into jobs that do not link memsight is built
/// (in `target/preload/release`, beside this target's `memsight`); says why the test skips when not.
pub fn preload_built() -> bool {
    let lib = memsight_bin()
        .parent()
        .and_then(std::path::Path::parent)
        .map(|t| t.join("preload/release/libmemsight_preload.so"));
    let built = lib.as_deref().is_some_and(std::path::Path::exists);
    if !built {
        println!("SKIP: no preloaded library in target/preload (make build builds it)");
    }
    built
}

/// A fresh child of this process's v1 memory cgroup limited to `limit` bytes (swap included),
/// named after `name`; an error says why none can be made here (the test then skips).
pub fn child_cgroup(name: &str, limit: u64) -> Result<PathBuf, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
    let rel = own
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            ctrl.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .ok_or("no cgroup v1 memory controller for this process")?;
    let dir = PathBuf::from("/sys/fs/cgroup/memory")
        .join(rel.trim_start_matches('/'))
        .join(format!("memsight-{name}-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let set = |f: &str, v: u64| std::fs::write(dir.join(f), v.to_string());
    set("memory.limit_in_bytes", limit).map_err(|e| format!("cannot set the limit: {e}"))?;
    if dir.join("memory.memsw.limit_in_bytes").exists() {
        set("memory.memsw.limit_in_bytes", limit).map_err(|e| format!("cannot limit swap: {e}"))?;
    }
    Ok(dir)
}

/// Builds the C program `source` as `dir/name` with the system's compiler (`cc` with `cflags`,
/// such as `-O1`), or says why not (the test then skips).
pub fn c_program(
    dir: &std::path::Path,
    name: &str,
    source: &str,
    cflags: &[&str],
) -> Option<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("C source");
    let exe = dir.join(name);
    match std::process::Command::new("cc")
        .args(cflags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
    {
        Ok(s) if s.success() => Some(exe),
        _ => {
            println!("SKIP: no working C compiler (cc)");
            None
        }
    }
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memsight-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// What a run of the `memsight` binary showed: exit code, standard output, standard error.
pub struct Run {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub out: String,
    /// Standard error.
    pub err: String,
}

/// Runs `memsight ARGS…` with `stdin` as its standard input (empty when `None`), without the
/// PyTorch allocator variables of the calling environment.
pub fn run_memsight<S: AsRef<std::ffi::OsStr>>(args: &[S], stdin: Option<&str>) -> Run {
    run_memsight_env(args, stdin, &[])
}

/// As [`run_memsight`], with more environment variables for it (and the job it runs).
pub fn run_memsight_env<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    stdin: Option<&str>,
    envs: &[(&str, &str)],
) -> Run {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(memsight_bin())
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .spawn()
        .expect("memsight runs");
    if let Some(mut input) = child.stdin.take() {
        // A verb that does not read its input closes the pipe; that is not a failure.
        let _ = input.write_all(stdin.unwrap_or("").as_bytes());
    }
    let out = child.wait_with_output().expect("memsight finishes");
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// What a job run under `memsight run` by [`run_job`] left: the exit code, what memsight and the
/// job printed, and the report's text.
pub struct JobRun {
    /// Exit code of `memsight run` (the job's).
    pub code: i32,
    /// Standard output then standard error.
    pub out: String,
    /// The report `memsight run` wrote.
    pub report: String,
}

/// Runs `memsight run OPTIONS… --report DIR/r.json -- COMMAND…` in `dir` (its working directory),
/// with `envs` added; panics, saying what memsight printed, when no report was written.
pub fn run_job<S: AsRef<std::ffi::OsStr>>(
    dir: &std::path::Path,
    options: &[&str],
    command: &[S],
    envs: &[(&str, &str)],
) -> JobRun {
    let report = dir.join("r.json");
    let out = std::process::Command::new(memsight_bin())
        .current_dir(dir)
        .arg("run")
        .args(options)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(command)
        .envs(envs.iter().copied())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .output()
        .expect("memsight runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}); memsight said:\n{text}"));
    JobRun {
        code: out.status.code().unwrap_or(-1),
        out: text,
        report,
    }
}

/// Polls `f` every 50 ms until it holds or `secs` seconds passed: whether it held. (A test waits
/// for the condition it needs with a generous deadline, never for a fixed time.)
pub fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// A small tmpfs mounted for one test (needs root); unmounted when dropped.
pub struct Tmpfs {
    /// The mount point.
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a `size`-byte tmpfs at a fresh directory, or says why it cannot (the test then
    /// prints the reason and skips).
    pub fn mount(name: &str, size: u64) -> Result<Tmpfs, String> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: cannot mount a tmpfs".into());
        }
        let dir = scratch(name);
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    /// Fills the filesystem to the last byte.
    pub fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.join("filler")).expect("filler");
        let block = vec![0xAAu8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        let _ = f.write_all(&[0u8; 1]);
        let _ = f.flush();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nanoGPT's files (tests/tests/python_jobs/nanogpt, unmodified) in `dir`, with `tokens` random
/// training tokens (a fifth of that for validation) in its `shakespeare_char` data format, made
/// with `py` (the torch venv's python: numpy).
pub fn nanogpt_in(dir: &std::path::Path, py: &std::path::Path, tokens: usize) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python_jobs/nanogpt");
    std::fs::create_dir_all(dir.join("config")).expect("a scratch directory");
    for f in [
        "train.py",
        "model.py",
        "configurator.py",
        "config/train_shakespeare_char.py",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).expect("nanoGPT's files");
    }
    let made = std::process::Command::new(py)
        .current_dir(dir)
        .args([
            "-c",
            &format!(
                "import os, pickle, numpy as np\n\
                 os.makedirs('data/shakespeare_char', exist_ok=True)\n\
                 rng = np.random.default_rng(0)\n\
                 for n, k in (('train', {tokens}), ('val', {val})):\n\
                 \x20   rng.integers(0, 65, k, dtype=np.uint16).tofile('data/shakespeare_char/%s.bin' % n)\n\
                 pickle.dump({{'vocab_size': 65}}, open('data/shakespeare_char/meta.pkl', 'wb'))\n",
                val = tokens / 5
            ),
        ])
        .status()
        .expect("python runs");
    assert!(made.success(), "the token files were not written");
}

/// The torch venv's python that `scripts/setup.sh` makes (`make build` runs it), if present.
pub fn torch_python() -> Option<std::path::PathBuf> {
    let cache = std::env::var_os("MEMSIGHT_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| std::path::PathBuf::from(d).join("memsight"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/memsight"))
        })?;
    let py = cache.join("torch-2.11.0/bin/python");
    py.exists().then_some(py)
}

/// Functions with known allocations, in a crate of their own (not memsight's), whose names a heap
/// profile must show as the sites of their bytes.
pub mod probe {
    use std::ffi::{c_char, CStr};
    use std::hint::black_box;

    /// Holds 200 MiB, every page touched: the innermost user frame of its samples.
    #[inline(never)]
    pub fn hold_two_hundred_mib_here() -> Vec<u8> {
        let mut v = vec![0u8; 200 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        black_box(v)
    }

    /// Keeps 256 KiB more in `kept` at every call: the leak a growth view must name.
    #[inline(never)]
    pub fn leak_a_little_here(kept: &mut Vec<Vec<u8>>) {
        for i in 0..4u8 {
            kept.push(black_box(vec![i; 64 << 10]));
        }
    }

    /// C code allocates: glibc's `strdup` copies `s` with `malloc`. The copy's bytes belong to this
    /// Rust function, which called the C library.
    #[inline(never)]
    pub fn c_library_allocates_here(s: &CStr) -> *mut c_char {
        // SAFETY: `s` is NUL-terminated; the copy is the caller's to free.
        let copy = unsafe { libc::strdup(s.as_ptr()) };
        black_box(copy)
    }
}

/// What a Python job under `memsight run` left ([`run_python_job`]).
pub struct PythonRun {
    /// The job's report.
    pub report: serde_json::Value,
    /// The truth the job wrote as JSON to its last argument (null when it wrote none).
    pub truth: serde_json::Value,
    /// What memsight and the job printed.
    pub out: String,
    /// The exit code of `memsight run` (the job's).
    pub code: i32,
}

/// Runs `tests/python_jobs/SCRIPT ARGS… TRUTH` with the torch environment's Python under
/// `memsight run` with `envs` added, in a scratch directory named after `tag` (removed after);
/// `None`, having said why, without the environment or the preloaded library.
pub fn run_python_job(
    tag: &str,
    script: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> Option<PythonRun> {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return None;
    };
    if !preload_built() {
        return None;
    }
    let dir = scratch(tag);
    let truth = dir.join("truth.json");
    let job = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python_jobs")
        .join(script);
    let mut command = vec![py.into_os_string(), job.into_os_string()];
    command.extend(args.iter().map(std::ffi::OsString::from));
    command.push(truth.clone().into_os_string());
    let r = run_job(&dir, &[], &command, envs);
    let truth = std::fs::read_to_string(&truth)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    let report = serde_json::from_str(&r.report).expect("a JSON report");
    let _ = std::fs::remove_dir_all(&dir);
    Some(PythonRun {
        report,
        truth,
        out: r.out,
        code: r.code,
    })
}
