//! Where each rank's report goes: `{rank}` replaced, else `<stem>.rankN.json`, with every byte of
//! a path that is not UTF-8 kept (a lossy copy named another file: `r\xff.json`'s rank report
//! went to `r\u{fffd}.rank0.json`).

use memsight_sidecar::{job_report_for, report_for};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn p(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}

#[test]
fn a_rank_report_keeps_every_byte_of_a_path_that_is_not_utf8() {
    assert_eq!(
        report_for(&p(b"out/r\xff.json"), Some(0)),
        p(b"out/r\xff.rank0.json")
    );
    assert_eq!(
        report_for(&p(b"out/r\xff.json"), None),
        p(b"out/r\xff.json")
    );
    assert_eq!(
        report_for(&p(b"out\xfe/q\xff-{rank}.json"), Some(3)),
        p(b"out\xfe/q\xff-3.json")
    );
    assert_eq!(
        report_for(&p(b"out\xfe/q\xff-{rank}.json"), None),
        p(b"out\xfe/q\xff-job.json")
    );
}

#[test]
fn every_placeholder_is_the_rank() {
    assert_eq!(
        report_for(Path::new("out/{rank}/r-{rank}.json"), Some(1)),
        PathBuf::from("out/1/r-1.json")
    );
    assert_eq!(
        report_for(Path::new("r.json"), Some(2)),
        PathBuf::from("r.rank2.json")
    );
    assert_eq!(
        report_for(Path::new("{rank"), Some(2)),
        PathBuf::from("{rank.rank2.json")
    );
}

#[test]
fn a_run_launched_as_a_rank_names_its_job_report_after_it() {
    assert_eq!(
        job_report_for(Path::new("out/r-{rank}.json"), Some(3)),
        PathBuf::from("out/r-job-3.json")
    );
    assert_eq!(
        job_report_for(Path::new("out/r.json"), Some(3)),
        PathBuf::from("out/r.job-3.json")
    );
    assert_eq!(
        job_report_for(&p(b"out/q\xff-{rank}.json"), Some(1)),
        p(b"out/q\xff-job-1.json")
    );
    // Rank 0's run (or a batch script's, which Slurm gives `SLURM_PROCID` 0), or one not
    // launched as a rank: the job's path as before.
    assert_eq!(
        job_report_for(Path::new("out/r-{rank}.json"), Some(0)),
        PathBuf::from("out/r-job.json")
    );
    assert_eq!(
        job_report_for(Path::new("out/r-{rank}.json"), None),
        report_for(Path::new("out/r-{rank}.json"), None)
    );
    assert_eq!(
        job_report_for(Path::new("out/r.json"), None),
        PathBuf::from("out/r.json")
    );
}
