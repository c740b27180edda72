//! Files and names memsight did not make cannot hang it, exhaust its memory or reach the terminal:
//! a FIFO, `/dev/zero` or an oversized file named as a report, budget, heap profile or log is
//! refused at once with a clear error; a crafted 20 MB heap profile costs `heap top` at most ten
//! times its size (plus 50 MiB); escape sequences in phase names and command lines are shown
//! escaped by `check`, `summary --format markdown` and the lines `run` prints.

use memsight_e2e::{memsight_bin, scratch};
use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A phase name that would set the terminal's title and clear its screen.
const HOSTILE: &str = "fwd\x1b]0;owned\x07\x1b[2J\u{9b}31m";

/// What one run of `memsight` did.
struct Outcome {
    code: Option<i32>,
    out: String,
    err: String,
    /// Its peak resident memory, bytes.
    max_rss: u64,
}

/// Runs `memsight ARGS…` with `env` added and standard input closed; fails the test when it has
/// not ended after 60 s (it is killed). The child is reaped with `wait4`, which also gives its
/// peak memory.
#[allow(clippy::zombie_processes)]
fn memsight<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &str)]) -> Outcome {
    let mut child = Command::new(memsight_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memsight runs");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let t = Instant::now();
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: rusage is plain data that wait4 fills.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waiting for our own child, reaping it once.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break (status, usage);
        }
        assert!(r == 0, "wait4: {}", std::io::Error::last_os_error());
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "memsight {:?} hung: still running after 60 s",
                args.iter().map(|a| a.as_ref()).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        out: out.join().unwrap(),
        err: err.join().unwrap(),
        max_rss: usage.ru_maxrss as u64 * 1024,
    }
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Every verb that reads a file a user names, with that file at `p`.
fn readers(p: &Path, example: &Path) -> Vec<Vec<std::ffi::OsString>> {
    let v = |a: &[&OsStr]| a.iter().map(|s| s.to_os_string()).collect::<Vec<_>>();
    let p = p.as_os_str();
    vec![
        v(&[
            "check".as_ref(),
            p,
            "--max-host-peak".as_ref(),
            "1B".as_ref(),
        ]),
        v(&["summary".as_ref(), p]),
        v(&["view".as_ref(), p]),
        v(&[
            "plan".as_ref(),
            "--gpus".as_ref(),
            "1".as_ref(),
            "--gpu-memory".as_ref(),
            "80GiB".as_ref(),
            p,
        ]),
        v(&[
            "check".as_ref(),
            example.as_os_str(),
            "--budget".as_ref(),
            p,
        ]),
        v(&["heap".as_ref(), "top".as_ref(), p]),
        v(&["diagnose".as_ref(), p]),
    ]
}

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.example.json")
}

#[test]
fn fifos_devices_and_huge_files_are_refused_at_once() {
    let dir = scratch("hostile-inputs");
    let fifo = dir.join("report.fifo");
    mkfifo(&fifo);
    // Larger than any limit (sparse: no disk is used).
    let huge = dir.join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len((1 << 30) + 1)
        .unwrap();
    for (path, says) in [
        (fifo.as_path(), "but a FIFO"),
        (Path::new("/dev/zero"), "but a character device"),
        (huge.as_path(), "over the"),
    ] {
        for args in readers(path, &example()) {
            let o = memsight(&args, &[]);
            assert_eq!(o.code, Some(2), "{args:?}: {}{}", o.out, o.err);
            assert!(o.err.contains(says), "{args:?}: {}", o.err);
            assert!(
                o.max_rss < 200 << 20,
                "{args:?} took {} MiB",
                o.max_rss >> 20
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes a heap profile of about `size` bytes: stacks of `depth` addresses drawn from `distinct`
/// ones (written as `0xADDR`), each holding one sampled object.
fn crafted_profile(p: &Path, size: usize, depth: usize, distinct: u64, short: bool) {
    use std::fmt::Write;
    let mut s = String::from("heap_v2/524288\n  t*: 1: 1 [0: 0]\n");
    let mut n = 0u64;
    while s.len() < size {
        s.push('@');
        for _ in 0..depth {
            if short {
                s.push_str(" 0");
            } else {
                let _ = write!(s, " 0x{:x}", 0x1000 + n % distinct);
            }
            n += 1;
        }
        s.push_str("\n  t*: 1: 64 [0: 0]\n");
    }
    s.push_str("\nMAPPED_LIBRARIES:\n");
    std::fs::write(p, s).unwrap();
}

#[test]
fn a_crafted_heap_profile_costs_at_most_ten_times_its_size() {
    let dir = scratch("hostile-heap");
    let size = 20 << 20;
    let bound = |len: u64| 10 * len + (50 << 20);
    // Accepted: 2.9 million return addresses of 1 000 distinct ones.
    let many = dir.join("many.heap");
    crafted_profile(&many, size, 64, 1000, false);
    // Refused: 10 million addresses, in one stack or in stacks of 1 000.
    let deep = dir.join("deep.heap");
    crafted_profile(&deep, size, 10 << 20, 1, true);
    let wide = dir.join("wide.heap");
    crafted_profile(&wide, size, 1000, 1, true);
    for (p, code, says) in [
        (&many, 0, "0x1000"),
        (&deep, 2, "a stack deeper than 1024 frames"),
        (&wide, 2, "too large to read"),
    ] {
        let len = std::fs::metadata(p).unwrap().len();
        let o = memsight(&["heap".as_ref(), "top".as_ref(), p.as_os_str()], &[]);
        assert_eq!(o.code, Some(code), "{}: {}", p.display(), o.err);
        assert!(
            o.out.contains(says) || o.err.contains(says),
            "{}: {}{}",
            p.display(),
            o.out,
            o.err
        );
        assert!(
            o.max_rss <= bound(len),
            "{}: {} MiB for a {} MiB profile (bound {} MiB)",
            p.display(),
            o.max_rss >> 20,
            len >> 20,
            bound(len) >> 20
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example report with `HOSTILE` in its command line, peak phase and first phase.
fn hostile_report(p: &Path) {
    let text = std::fs::read_to_string(example()).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["job"]["command"][0] = HOSTILE.into();
    v["peaks"]["heap_peak_phase"] = HOSTILE.into();
    v["phases"][0]["path"] = HOSTILE.into();
    std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Whether `s` shows the hostile name escaped and holds no control character but line breaks.
fn escaped(s: &str) -> bool {
    s.contains("fwd\\x1b]0;owned\\x07\\x1b[2J\\u{9b}31m")
        && !s.chars().any(|c| c.is_control() && c != '\n')
}

#[test]
fn escape_sequences_from_a_job_never_reach_the_terminal() {
    let dir = scratch("hostile-names");
    let report = dir.join("r.json");
    hostile_report(&report);
    let o = memsight(
        &[
            "check".as_ref(),
            report.as_os_str(),
            "--max-host-peak".as_ref(),
            "1B".as_ref(),
        ],
        &[],
    );
    assert_eq!(o.code, Some(1), "{}", o.err);
    assert!(escaped(&o.out), "check: {:?}", o.out);
    let o = memsight(
        &[
            "summary".as_ref(),
            report.as_os_str(),
            "--format".as_ref(),
            "markdown".as_ref(),
        ],
        &[],
    );
    assert_eq!(o.code, Some(0), "{}", o.err);
    assert!(escaped(&o.out), "summary: {:?}", o.out);
    // `heap top` names frames after the mapped files of the profile (here none on disk).
    let heap = dir.join("h.heap");
    std::fs::write(
        &heap,
        format!(
            "heap_v2/524288\n@ 0x1010\n  t*: 1: 1048576 [0: 0]\n\nMAPPED_LIBRARIES:\n\
             1000-2000 r-xp 00000000 00:00 0 /nonexistent/{HOSTILE}.so\n"
        ),
    )
    .unwrap();
    let o = memsight(&["heap".as_ref(), "top".as_ref(), heap.as_os_str()], &[]);
    assert_eq!(o.code, Some(0), "{}", o.err);
    assert!(escaped(&o.out), "heap top: {:?}", o.out);
    assert!(escaped(&o.err), "heap top: {:?}", o.err);
    // `run`'s lines quote the command line: here a mistyped one.
    let run = dir.join("run.json");
    let cmd = format!("/nonexistent/{HOSTILE}");
    let o = memsight(
        &[
            "run".as_ref(),
            "--report".as_ref(),
            run.as_os_str(),
            "--".as_ref(),
            cmd.as_ref(),
        ],
        &[],
    );
    assert_eq!(o.code, Some(127), "{}", o.err);
    assert!(escaped(&o.err), "run: {:?}", o.err);
    let _ = std::fs::remove_dir_all(&dir);
}
