//! cgroup v1, v2 and hybrid discovery and reads against fixture directory trees.

use memsight::collect::{CgroupMemory, CgroupReader, HostCollector};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cgroup")
        .join(name)
}

fn read(name: &str) -> CgroupMemory {
    let root = fixture(name);
    let r = CgroupReader::discover(&root.join("proc/self"), &root)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    r.read().unwrap()
}

#[test]
fn v1_container_mount_rooted_at_the_job_cgroup() {
    let m = read("v1");
    assert_eq!(
        m,
        CgroupMemory {
            version: 1,
            limit: Some(4 << 30),
            usage: 1 << 30,
            // The fixture's high-water mark was there before the reader opened: an
            // earlier job's, not this one's (collect::cgroup's unit test reads a rising one).
            peak: None,
            oom_kills: Some(2)
        }
    );
    assert_eq!(m.headroom(), Some(3 << 30));
}

#[test]
fn v2_nested_cgroup_takes_the_ancestor_limit() {
    let m = read("v2");
    assert_eq!(
        m,
        CgroupMemory {
            version: 2,
            limit: Some(3 << 30),
            usage: 512 << 20,
            // The fixture's high-water mark was there before the reader opened: an
            // earlier job's, not this one's (collect::cgroup's unit test reads a rising one).
            peak: None,
            oom_kills: Some(1)
        }
    );
}

#[test]
fn hybrid_host_uses_v1_memory_controller_and_reads_unlimited() {
    let m = read("hybrid");
    assert_eq!(
        m,
        CgroupMemory {
            version: 1,
            limit: None,
            usage: 100 << 20,
            // The fixture's high-water mark was there before the reader opened: an
            // earlier job's, not this one's (collect::cgroup's unit test reads a rising one).
            peak: None,
            oom_kills: Some(0)
        }
    );
    assert_eq!(m.headroom(), None);
}

#[test]
fn no_memory_controller_is_reported_with_a_reason() {
    let root = fixture("none");
    let err = CgroupReader::discover(&root.join("proc/self"), &root).unwrap_err();
    assert_eq!(
        err,
        "cgroup v2 without the memory controller, and no v1 memory controller"
    );
    let c = HostCollector::open(&root.join("proc/self"), &root.join("proc"), &root, false);
    let cg = c
        .sources()
        .into_iter()
        .find(|s| s.name == "cgroup")
        .unwrap();
    assert!(!cg.available);
    assert_eq!(cg.detail, err);
    let je = HostCollector::open(&root.join("proc/self"), &root.join("proc"), &root, false)
        .sources()
        .into_iter()
        .find(|s| s.name == "jemalloc")
        .unwrap();
    assert!(!je.available);
}

#[test]
fn this_machine_has_a_readable_cgroup_or_says_why() {
    let mut c = HostCollector::for_self();
    let s = c.sample();
    let status = c
        .sources()
        .into_iter()
        .find(|s| s.name == "cgroup")
        .unwrap();
    assert_eq!(status.available, s.cgroup.is_some(), "{status:?}");
    assert!(!status.detail.is_empty());
}
