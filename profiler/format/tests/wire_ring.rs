//! The flight-recorder ring: records round-trip in order, a reader that fell behind counts what
//! was overwritten, a record the writer died writing is skipped, several writer threads never lose
//! a record, and corrupt, short or newer-version files are refused with clear messages.

use memsight_format::wire::ring::{RingReader, RingWriter, HEADER_SIZE};
use memsight_format::wire::{Record, WireError};
use std::path::PathBuf;

fn path(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memsight-ring-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&d);
    d
}

fn finished(i: u64) -> Record {
    Record::Finished {
        report_path: Some(format!("r{i}.json")),
    }
}

#[test]
fn records_round_trip_in_order_and_a_slow_reader_counts_drops() {
    let p = path("roundtrip");
    let w = RingWriter::create_with(&p, 42, 1000, 100, 256, 8).unwrap();
    let mut r = RingReader::open(&p).unwrap();
    assert_eq!(r.info().pid, 42);
    assert_eq!(r.info().interval_ms, 100);
    for i in 0..5 {
        assert!(w.append(&finished(i)));
    }
    assert_eq!(r.poll(), (0..5).map(finished).collect::<Vec<_>>());
    assert!(r.poll().is_empty());
    // 20 more into 8 slots: the reader gets the last 8 and counts 12 dropped.
    for i in 5..25 {
        w.append(&finished(i));
    }
    assert_eq!(r.poll(), (17..25).map(finished).collect::<Vec<_>>());
    assert_eq!(r.dropped(), 12);
    // A record larger than a quarter of the ring is refused, not truncated, and every reader
    // counts it as dropped.
    let big = Record::Finished {
        report_path: Some("x".repeat(1000)),
    };
    assert!(!w.append(&big));
    assert_eq!(w.oversize(), 1);
    assert!(r.poll().is_empty());
    assert_eq!(r.dropped(), 13);
    assert_eq!(RingReader::open(&p).unwrap().dropped(), 1);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn records_larger_than_a_slot_are_spread_over_slots_and_read_whole() {
    let p = path("parts");
    let w = RingWriter::create_with(&p, 7, 0, 100, 256, 64).unwrap();
    let mut r = RingReader::open(&p).unwrap();
    // Sizes around the slot's 240 bytes of room, up to 10 slots, between small records.
    let mut sent = Vec::new();
    for (i, len) in [10usize, 239, 240, 241, 700, 2300, 5].iter().enumerate() {
        let rec = Record::Finished {
            report_path: Some(format!("{i}:{}", "y".repeat(*len))),
        };
        assert!(w.append(&rec), "record of {len} bytes");
        sent.push(rec);
        w.append(&finished(i as u64));
        sent.push(finished(i as u64));
    }
    assert_eq!(r.poll(), sent);
    assert_eq!(r.dropped(), 0);
    // A reader that opens later gets what is still whole in the ring (the first parts of records
    // overwritten are not half-read).
    for i in 0..40 {
        w.append(&Record::Finished {
            report_path: Some(format!("{i}:{}", "z".repeat(500))),
        });
    }
    let late: Vec<Record> = RingReader::open(&p).unwrap().poll();
    assert!(late.len() >= 15, "{} records", late.len());
    let _ = std::fs::remove_file(&p);
}

#[test]
fn a_record_spread_over_slots_whose_writer_died_midway_is_dropped_not_misread() {
    let p = path("parts-torn");
    let w = RingWriter::create_with(&p, 1, 0, 100, 256, 16).unwrap();
    let big = Record::Finished {
        report_path: Some("w".repeat(600)),
    };
    assert!(w.append(&big));
    w.append(&finished(1));
    drop(w);
    // The record takes slots 0..3; mark its second part as still being written.
    let mut bytes = std::fs::read(&p).unwrap();
    let slot1 = HEADER_SIZE + 256;
    bytes[slot1..slot1 + 8].copy_from_slice(&3u64.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let mut r = RingReader::open(&p).unwrap();
    assert!(r.poll().is_empty(), "waits while the writer may finish it");
    assert_eq!(r.poll_final(), vec![finished(1)]);
    assert_eq!(r.dropped(), 1);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn a_record_left_half_written_is_skipped_once_the_writer_is_gone() {
    let p = path("torn");
    let w = RingWriter::create_with(&p, 1, 0, 100, 256, 8).unwrap();
    w.append(&finished(0));
    w.append(&finished(1));
    drop(w);
    // Simulate a writer killed after claiming record 2 and marking its slot in progress.
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[48..56].copy_from_slice(&3u64.to_le_bytes());
    let slot2 = HEADER_SIZE + 2 * 256;
    bytes[slot2..slot2 + 8].copy_from_slice(&5u64.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let mut r = RingReader::open(&p).unwrap();
    assert_eq!(r.poll(), vec![finished(0), finished(1)]);
    assert!(r.poll_final().is_empty());
    assert_eq!(r.dropped(), 1);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn concurrent_writers_lose_nothing_a_fast_reader_keeps_up_with() {
    let p = path("threads");
    let w = std::sync::Arc::new(RingWriter::create_with(&p, 1, 0, 100, 256, 4096).unwrap());
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let w = w.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    w.append(&finished(t * 1000 + i));
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut r = RingReader::open(&p).unwrap();
    let got = r.poll();
    assert_eq!(got.len(), 2000);
    assert_eq!(r.dropped(), 0);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn bad_files_are_refused_with_clear_messages() {
    let p = path("bad");
    std::fs::write(&p, b"short").unwrap();
    let e = RingReader::open(&p).err().unwrap().to_string();
    assert!(e.contains("shorter than the 128-byte header"), "{e}");

    std::fs::write(&p, vec![7u8; 4096]).unwrap();
    let e = RingReader::open(&p).err().unwrap().to_string();
    assert!(e.contains("no ring magic"), "{e}");

    let _ = std::fs::remove_file(&p);
    drop(RingWriter::create_with(&p, 1, 0, 100, 256, 8).unwrap());
    let good = std::fs::read(&p).unwrap();
    // Truncated: the header promises more slots than the file holds.
    std::fs::write(&p, &good[..HEADER_SIZE + 300]).unwrap();
    let e = RingReader::open(&p).err().unwrap().to_string();
    assert!(e.contains("header says 8 slots of 256 bytes"), "{e}");
    // A newer major version.
    let mut newer = good.clone();
    newer[8..10].copy_from_slice(&2u16.to_le_bytes());
    std::fs::write(&p, &newer).unwrap();
    match RingReader::open(&p) {
        Err(e @ WireError::Version { found: 2 }) => {
            assert!(e
                .to_string()
                .contains("newer than this memsight reads (1.x): upgrade memsight"))
        }
        other => panic!("expected a version error, got {:?}", other.err()),
    }
    // Garbage in the slots: records are dropped, never a panic.
    let mut junk = good.clone();
    junk[48..56].copy_from_slice(&6u64.to_le_bytes());
    for (i, b) in junk[HEADER_SIZE..].iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    std::fs::write(&p, &junk).unwrap();
    let mut r = RingReader::open(&p).unwrap();
    assert!(r.poll_final().is_empty());
    assert_eq!(r.dropped(), 6);
    assert!(RingReader::open(&path("missing")).is_err());
    let _ = std::fs::remove_file(&p);
}
