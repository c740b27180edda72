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

    memsight_format::wire::remove_stale_rings();
    assert!(live.exists(), "a live ring was deleted");
    assert!(!stale.exists(), "a stale ring was kept");

    // A reader (the sidecar draining a dead job) also keeps it.
    let reader = RingReader::open(&live).unwrap();
    drop(writer);
    memsight_format::wire::remove_stale_rings();
    assert!(live.exists(), "a ring being read was deleted");
    drop(reader);
    memsight_format::wire::remove_stale_rings();
    assert!(!live.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
