//! Stale-ring clean-up spares rings in use: a ring whose writer lives in another PID namespace (its
//! pid means nothing here) is held by that writer's lock and survives; once nobody holds it, it goes.

use memsight_format::wire::ring::{RingReader, RingWriter};

/// A pid with no process here: a child that has been reaped.
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn a_live_ring_with_a_foreign_pid_is_not_cleaned_up() {
    let dir = std::env::temp_dir().join(format!("memsight-cleanup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: the only test in this binary: nothing reads the environment concurrently.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
    let runtime = memsight_format::wire::runtime_dir().unwrap();
    let pid = dead_pid();
    let live = runtime.join(format!("ring-{pid}.bin"));
    let writer = RingWriter::create(&live, pid, 0, 100).unwrap();
    let stale = runtime.join(format!("ring-{pid}-1.bin"));
    drop(RingWriter::create(&stale, pid, 0, 100).unwrap());

    memsight_format::wire::remove_stale_files();
    assert!(live.exists(), "a live ring was deleted");
    assert!(!stale.exists(), "a stale ring was kept");

    // A reader (the sidecar draining a dead job) also keeps it.
    let reader = RingReader::open(&live).unwrap();
    drop(writer);
    memsight_format::wire::remove_stale_files();
    assert!(live.exists(), "a ring being read was deleted");
    drop(reader);
    memsight_format::wire::remove_stale_files();
    assert!(!live.exists());

    // A killed sidecar's Python package copy goes once nobody holds it; a held one stays.
    let left = runtime.join(format!("python-{pid}-1"));
    std::fs::create_dir_all(left.join("memsight")).unwrap();
    std::fs::write(left.join(".held"), b"").unwrap();
    let kept = runtime.join(format!("python-{pid}-2"));
    std::fs::create_dir_all(&kept).unwrap();
    let held = std::fs::File::create(kept.join(".held")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_SH) }, 0);
    // A socket nobody listens on any more, and one a live sidecar serves.
    let dead_sock = runtime.join(memsight_format::wire::pid_file_name(
        "sidecar-", pid, ".sock",
    ));
    drop(std::os::unix::net::UnixListener::bind(&dead_sock).unwrap());
    let live_sock = runtime.join(memsight_format::wire::pid_file_name(
        "sidecar-",
        std::process::id(),
        ".sock",
    ));
    let listener = std::os::unix::net::UnixListener::bind(&live_sock).unwrap();
    memsight_format::wire::remove_stale_files();
    assert!(!left.exists(), "a dead sidecar's package copy was kept");
    assert!(kept.exists(), "a held package copy was deleted");
    assert!(!dead_sock.exists(), "a dead sidecar's socket was kept");
    assert!(live_sock.exists(), "a live socket was deleted");
    drop((held, listener));
    let _ = std::fs::remove_dir_all(&dir);
}
