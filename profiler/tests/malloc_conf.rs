//! `MALLOC_CONF` reaches memsight's jemalloc, as the README documents, although memsight builds it
//! with the `_rjem_` prefix (whose own variable is `_RJEM_MALLOC_CONF`): the test runs itself again
//! with the variable set and reads the option back from jemalloc.

#![cfg(feature = "jemalloc")]

use std::process::Command;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const CHILD: &str = "MEMSIGHT_MALLOC_CONF_CHILD";

#[test]
fn malloc_conf_from_the_environment_reaches_jemalloc() {
    // SAFETY: `opt.dirty_decay_ms` is an ssize_t option.
    let decay: isize = unsafe { tikv_jemalloc_ctl::raw::read(b"opt.dirty_decay_ms\0") }.unwrap();
    if std::env::var_os(CHILD).is_some() {
        assert_eq!(
            decay, 4321,
            "MALLOC_CONF=dirty_decay_ms:4321 did not reach jemalloc"
        );
        return;
    }
    assert_ne!(decay, 4321, "the default is not the value the child sets");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "malloc_conf_from_the_environment_reaches_jemalloc",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("MALLOC_CONF", "dirty_decay_ms:4321")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
