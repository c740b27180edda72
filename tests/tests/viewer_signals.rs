//! The viewer gives the terminal back when it is killed politely: on SIGTERM, SIGHUP or SIGINT it
//! leaves the alternate screen and raw mode (the pseudo-terminal's settings are sane afterwards)
//! and exits with the shell's code for that signal.
//! A live run that fails before its job starts says why and exits instead of waiting for a viewer.

use memsight_e2e::memsight_bin;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A pseudo-terminal pair: (controller, terminal).
fn pty() -> (OwnedFd, OwnedFd) {
    let (mut c, mut t) = (0, 0);
    let ws = libc::winsize {
        ws_row: 30,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors; the name and termios are optional.
    let rc = unsafe { libc::openpty(&mut c, &mut t, std::ptr::null_mut(), std::ptr::null(), &ws) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // Not inherited by other tests' children (tests run on threads of one process): a controller
    // left open in one of them would keep a terminal from ever hanging up.
    for fd in [c, t] {
        // SAFETY: setting a flag on a descriptor we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: fresh descriptors we own.
    unsafe { (OwnedFd::from_raw_fd(c), OwnedFd::from_raw_fd(t)) }
}

fn lflag(fd: &OwnedFd) -> libc::tcflag_t {
    use std::os::fd::AsRawFd;
    // SAFETY: tcgetattr fills a termios we own.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
    t.c_lflag
}

#[test]
fn the_viewer_restores_the_terminal_on_stop_signals() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/report.example.json");
    for (sig, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
    ] {
        let (controller, terminal) = pty();
        let cooked = lflag(&terminal);
        let mut child = Command::new(memsight_bin())
            .args(["view", example])
            .stdin(Stdio::from(terminal.try_clone().unwrap()))
            .stdout(Stdio::from(terminal.try_clone().unwrap()))
            .stderr(Stdio::null())
            .env("TERM", "xterm")
            .spawn()
            .unwrap();
        // Read the screen until the viewer is up (it entered the alternate screen and drew).
        let mut out = std::fs::File::from(controller);
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            seen
        });
        let t = Instant::now();
        while lflag(&terminal) & libc::ICANON != 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(lflag(&terminal) & libc::ICANON, 0, "{name}: never went raw");
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: signalling the child we started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(128 + sig), "{name}: {status:?}");
        assert_eq!(
            lflag(&terminal),
            cooked,
            "{name}: the terminal was left raw"
        );
        drop(terminal);
        let screen = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
        let entered = screen
            .find("\x1b[?1049h")
            .expect("entered the alternate screen");
        let left = screen.rfind("\x1b[?1049l");
        assert!(
            left.is_some_and(|l| l > entered),
            "{name}: still on the alternate screen"
        );
    }
}

#[test]
fn a_live_run_whose_terminal_goes_away_still_writes_the_report_and_ends() {
    let dir = memsight_e2e::scratch("live-hangup");
    let report = dir.join("r.json");
    let (controller, terminal) = pty();
    let mut child = Command::new(memsight_bin())
        .args(["run", "--live", "--report"])
        .arg(&report)
        .args(["--", "sleep", "3"])
        .stdin(Stdio::from(terminal.try_clone().unwrap()))
        .stdout(Stdio::from(terminal.try_clone().unwrap()))
        .stderr(Stdio::from(terminal))
        .env("TERM", "xterm")
        .spawn()
        .unwrap();
    // Show the viewer for a moment, then close the terminal's other end (a killed tmux server).
    let mut out = std::fs::File::from(controller);
    let shown = Instant::now();
    let mut buf = [0u8; 4096];
    while shown.elapsed() < Duration::from_millis(1500) {
        if out.read(&mut buf).unwrap_or(0) == 0 {
            break;
        }
    }
    drop(out);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("memsight run --live did not end after its terminal went away");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        report.exists(),
        "no report after the terminal went away ({status})"
    );
}

/// Runs `memsight run --live --report REPORT -- CMD…` in a pseudo-terminal; (exit code, standard
/// error). Fails the test when it has not ended after 60 s (it used to wait forever).
fn live_run(report: &std::path::Path, cmd: &[&str]) -> (Option<i32>, String) {
    let (controller, terminal) = pty();
    let mut child = Command::new(memsight_bin())
        .args(["run", "--live", "--report"])
        .arg(report)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::from(terminal.try_clone().unwrap()))
        .stdout(Stdio::from(terminal))
        .stderr(Stdio::piped())
        .env("TERM", "xterm")
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "memsight run --live {cmd:?} hung: still running after 60 s ({})",
                reader.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(controller);
    (status.code(), reader.join().unwrap())
}

#[test]
fn a_live_run_that_fails_before_its_job_starts_says_why_and_exits() {
    let dir = memsight_e2e::scratch("live-early-error");
    // A mistyped command: the shell's 127.
    let (code, err) = live_run(&dir.join("r.json"), &["/nonexistent/trainn.py"]);
    assert_eq!(code, Some(127), "{err}");
    assert!(err.contains("/nonexistent/trainn.py"), "{err}");
    // A refused report path: a directory.
    std::fs::create_dir(dir.join("d.json")).unwrap();
    let (code, err) = live_run(&dir.join("d.json"), &["true"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    // The job's log planted as a symlink.
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("s.log")).unwrap();
    let (code, err) = live_run(&dir.join("s.json"), &["true"]);
    assert!(code.is_some_and(|c| c != 0), "{code:?} {err}");
    assert!(err.contains("s.log"), "{err}");
    assert!(
        !dir.join("elsewhere").exists(),
        "the planted link was followed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
