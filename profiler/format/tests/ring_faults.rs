//! The flight recorder never faults a process: a reader whose ring is truncated under it reads
//! what is left and stops (no SIGBUS), and a writer on a full filesystem is refused up front
//! instead of raising SIGBUS at its first write (the filesystem part needs root to mount a tmpfs).

use memsight_format::wire::ring::{RingReader, RingWriter, HEADER_SIZE};
use memsight_format::wire::Record;
use std::path::PathBuf;

fn finished(i: u64) -> Record {
    Record::Finished {
        report_path: Some(format!("r{i}.json")),
    }
}

#[test]
fn a_ring_truncated_under_its_reader_is_no_fault() {
    let p = std::env::temp_dir().join(format!("memsight-ring-trunc-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let w = RingWriter::create_with(&p, 1, 0, 100, 4096, 8).unwrap();
    let mut r = RingReader::open(&p).unwrap();
    for i in 0..3 {
        w.append(&finished(i));
    }
    // Someone cuts the file back to its first slot (or to nothing) while it is being read.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len((HEADER_SIZE + 4096) as u64)
        .unwrap();
    assert_eq!(r.poll(), vec![finished(0)]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(r.poll_final().is_empty());
    assert_eq!(r.alloc_failures(), (0, 0));
    drop(w);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn a_full_filesystem_refuses_the_ring_instead_of_faulting() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: not root, cannot mount a tmpfs");
        return;
    }
    let dir = std::env::temp_dir().join(format!("memsight-fullfs-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        println!("skipped: cannot mount a tmpfs");
        return;
    }
    let ring: PathBuf = dir.join("ring.bin");
    // 1 MiB of ring on a 256 KiB filesystem: refused, and nothing left behind.
    let e = RingWriter::create(&ring, 1, 0, 100)
        .err()
        .map(|e| e.to_string());
    let left = ring.exists();
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(&dir)
        .status();
    let _ = std::fs::remove_dir(&dir);
    let e = e.expect("the ring was created on a full filesystem");
    assert!(e.contains("cannot reserve"), "{e}");
    assert!(!left);
}

#[test]
fn heap_requests_reach_the_job_and_a_truncated_ring_is_an_error_not_a_fault() {
    use memsight_format::wire::ring::{request_heap, HeapRequest};
    let p = std::env::temp_dir().join(format!("memsight-ring-req-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let w = RingWriter::create_with(&p, 1, 0, 100, 4096, 8).unwrap();
    assert_eq!(request_heap(&p, HeapRequest::Dump).unwrap(), 1);
    assert_eq!(request_heap(&p, HeapRequest::Dump).unwrap(), 2);
    assert_eq!(request_heap(&p, HeapRequest::Sampling(false)).unwrap(), 2);
    // The job sees them through its mapping.
    assert_eq!(w.heap_dump_requests(), 2);
    assert_eq!(w.heap_sampling_request(), 2);
    // Cut inside the header: the request fails with a message, the command does not fault.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(40)
        .unwrap();
    let e = request_heap(&p, HeapRequest::Dump).unwrap_err().to_string();
    assert!(e.contains("too short"), "{e}");
    // The writer's own mapping now reaches past the file's end: never touch it again.
    std::mem::forget(w);
    let _ = std::fs::remove_file(&p);
}
