//! A crafted ring header cannot make a reader allocate what the header claims: a 144-byte sparse
//! file whose header says one slot of 4 GiB (and a record that fills it), or half a million slots,
//! is refused at open with the limit named, instead of costing the reader gigabytes.

use memsight_format::wire::ring::{RingReader, RingWriter, HEADER_SIZE};
use std::os::unix::fs::FileExt;

#[test]
fn a_sparse_ring_claiming_a_huge_slot_is_refused_before_any_allocation() {
    let p = std::env::temp_dir().join(format!("memsight-ring-huge-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    drop(RingWriter::create_with(&p, 1, 0, 100, 64, 1).unwrap());
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let slot_size: u32 = 0xFFFF_FFF8;
    f.write_all_at(&slot_size.to_le_bytes(), 16).unwrap();
    f.write_all_at(&1u32.to_le_bytes(), 20).unwrap();
    // One record written (next_record = 1), complete (sequence word 2), as long as the slot.
    f.write_all_at(&1u64.to_le_bytes(), 48).unwrap();
    let mut slot = [0u8; 16];
    slot[..8].copy_from_slice(&2u64.to_le_bytes());
    slot[8..12].copy_from_slice(&(slot_size - 16).to_le_bytes());
    slot[12..14].copy_from_slice(&1u16.to_le_bytes());
    f.write_all_at(&slot, HEADER_SIZE as u64).unwrap();
    // A hole up to the size the header claims: 144 bytes of data, 4 GiB apparent size.
    f.set_len(HEADER_SIZE as u64 + u64::from(slot_size))
        .unwrap();
    drop(f);
    let e = match RingReader::open(&p) {
        Ok(_) => panic!("a ring of one 4 GiB slot was accepted"),
        Err(e) => e.to_string(),
    };
    // The reader's limit: 16 MiB slots.
    assert!(e.contains("at most 16777216 bytes"), "{e}");
    // Small slots, but so many that a record spread over them could take gigabytes.
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&8192u32.to_le_bytes(), 16).unwrap();
    f.write_all_at(&(1u32 << 19).to_le_bytes(), 20).unwrap();
    f.set_len(HEADER_SIZE as u64 + (8192u64 << 19)).unwrap();
    drop(f);
    let e = match RingReader::open(&p) {
        Ok(_) => panic!("a ring of 4 GiB was accepted"),
        Err(e) => e.to_string(),
    };
    let _ = std::fs::remove_file(&p);
    assert!(e.contains("268435456 bytes in all"), "{e}");
}
