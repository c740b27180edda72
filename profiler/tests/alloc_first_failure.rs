//! The OOM post-mortem names the allocation that failed first: later, smaller failures (a dying
//! process's backtrace printer, say) do not replace it in the flight recorder's header.

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

use memsight::wire::ring::{RingReader, RingWriter};

#[test]
fn the_first_failed_allocation_is_kept() {
    let p = std::env::temp_dir().join(format!("memsight-first-fail-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let _w = RingWriter::create(&p, std::process::id(), 0, 100)
        .unwrap()
        .install_alloc_failure_words();
    let first: usize = 1 << 50;
    // All beyond the 128 TiB a process can map: each fails in jemalloc.
    for size in [first, 1 << 48, 1 << 49] {
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve_exact(size).is_err());
    }
    let r = RingReader::open(&p).unwrap();
    assert_eq!(r.alloc_failures(), (3, first as u64));
    let _ = std::fs::remove_file(&p);
}
