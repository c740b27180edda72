//! The viewer says why it is not connected, and stops retrying when nothing can come back: a stale
//! socket of a job that is gone, or a sidecar with a newer wire major version ("upgrade memsight").

use memsight_format::wire::WireError;
use memsight_tui::state::connection::{connect_failed, stream_failed};
use std::os::unix::net::{UnixListener, UnixStream};

fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// A socket file nobody listens on any more (its sidecar was killed).
fn stale_socket(pid: u32) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memsight-conn-{}-{pid}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("sidecar-{pid}.sock"));
    drop(UnixListener::bind(&p).unwrap());
    p
}

#[test]
fn a_stale_socket_of_a_dead_job_ends_the_retries_with_the_reason() {
    let pid = dead_pid();
    let p = stale_socket(pid);
    let e = UnixStream::connect(&p).unwrap_err();
    let d = connect_failed(&p, &e);
    assert!(!d.retry, "{d:?}");
    assert!(
        d.why
            .starts_with(&format!("job {pid} has ended and its sidecar is gone")),
        "{d:?}"
    );
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

#[test]
fn a_stale_socket_of_a_live_job_says_how_to_watch_it_again() {
    let pid = std::process::id();
    let p = stale_socket(pid);
    let e = UnixStream::connect(&p).unwrap_err();
    let d = connect_failed(&p, &e);
    assert!(d.retry, "{d:?}");
    assert!(d.why.contains(&format!("`memsight attach {pid}`")), "{d:?}");
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

#[test]
fn a_newer_wire_major_is_final_and_says_upgrade() {
    let d = stream_failed(&WireError::Version { found: 2 });
    assert!(!d.retry);
    assert!(d.why.ends_with("upgrade memsight"), "{d:?}");
    let d = stream_failed(&WireError::NotAStream("x".into()));
    assert!(d.retry);
}
