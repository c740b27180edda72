//! A report from an in-process session (no `symbolize` feature: the job lists its heap profiles and
//! no sites) shows its sites once a reader completes it, as `memsight summary` and `memsight view`
//! do; when its profiles are gone, the summary says how to list them (issue 38).

use std::hint::black_box;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

#[inline(never)]
fn allocate_the_big_spike() -> Vec<u8> {
    let mut v = vec![0u8; 96 << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    black_box(v)
}

#[test]
fn a_readers_summary_of_an_in_process_report_names_its_sites() {
    let dir = std::env::temp_dir().join(format!("memsight-sites-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.json");
    let session = memsight::Session::builder()
        .report_path(&path)
        .quiet()
        .start()
        .unwrap();
    let spike = allocate_the_big_spike();
    // The profile of the heap at its largest, written now (the periodic one may not have run).
    memsight::heapprof::dump().unwrap();
    drop(spike);
    session.finish().unwrap();

    let mut report = memsight::Report::load(&path).unwrap();
    let hp = report
        .heap_profile
        .clone()
        .expect("no heap-profile section");
    // A workspace-wide build unifies features: another member may turn on `symbolize`, and the
    // job then names its sites itself.
    let symbolized_in_the_job = cfg!(feature = "symbolize");
    assert_eq!(hp.at_peak.is_some(), symbolized_in_the_job, "{hp:?}");
    if !symbolized_in_the_job {
        assert!(
            hp.notes.iter().any(|n| n.contains("memsight heap top")),
            "{:?}",
            hp.notes
        );
    }
    memsight_analysis::heapprof::complete(&mut report, &path);
    let md = memsight_analysis::summary::markdown(&report);
    assert!(md.contains("allocate_the_big_spike"), "{md}");
    if symbolized_in_the_job {
        println!("this build symbolizes in the job (the symbolize feature): the reader had nothing to complete");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    // Profiles gone: the summary says how to list the sites.
    std::fs::remove_dir_all(dir.join("r.heap")).unwrap();
    let mut report = memsight::Report::load(&path).unwrap();
    memsight_analysis::heapprof::complete(&mut report, &path);
    let md = memsight_analysis::summary::markdown(&report);
    assert!(md.contains("memsight heap top"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}
