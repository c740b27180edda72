//! The sidecar's watch loop tells live viewers about records it lost from the job's ring; the
//! Prometheus fragmentation gauge is the report's fragmentation.

use crate::{outputs::Outputs, server::Server, watch::Watch};
use memsight_format::wire::ring::{RingReader, RingWriter};
use memsight_format::wire::Record;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;

#[test]
fn records_lost_from_the_ring_reach_viewers_as_a_dropped_notice() {
    let dir = std::env::temp_dir().join(format!("memsight-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ring = dir.join("ring.bin");
    let w = RingWriter::create_with(&ring, 1, 0, 100, 256, 8).unwrap();
    let mut r = RingReader::open(&ring).unwrap();
    let outputs = Outputs {
        server: Some(Server::start(&dir.join("s.sock"), 1, vec![]).unwrap()),
        metrics: None,
    };
    let client = UnixStream::connect(dir.join("s.sock")).unwrap();
    let mut lines = BufReader::new(client).lines();
    // Greeting and state first.
    assert!(lines.next().unwrap().unwrap().contains("sidecar_hello"));
    assert!(lines.next().unwrap().unwrap().contains("\"state\""));
    // 20 records into 8 slots before the sidecar looks: 12 are lost.
    for i in 0..20 {
        w.append(&Record::Finished {
            report_path: Some(format!("{i}")),
        });
    }
    let mut watch = Watch::new();
    watch.poll(&mut r, &outputs);
    let got: Vec<String> = lines.by_ref().take(9).map(|l| l.unwrap()).collect();
    assert!(
        got.iter()
            .any(|l| l == "{\"type\":\"dropped\",\"count\":12}"),
        "{got:?}"
    );
    // Told once: the next poll with nothing lost adds no notice.
    w.append(&Record::Finished { report_path: None });
    watch.poll(&mut r, &outputs);
    assert_eq!(lines.next().unwrap().unwrap(), "{\"type\":\"finished\"}");
    drop(outputs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_fragmentation_gauge_is_the_reports_fragmentation_not_the_latest_samples() {
    use memsight_format::host::JemallocStats;
    use memsight_format::report::Fragmentation;
    use memsight_format::snapshot::Snapshot;
    use memsight_format::timeline::Timeline;
    let m = crate::metrics::Metrics::new(vec![("job".into(), "t".into())]);
    let mut tl = Timeline::default();
    // (resident, allocated): the resident peak has 10% fragmentation, the last sample 75%.
    for (t, (resident, allocated)) in [(100, 50), (200, 180), (160, 40)].into_iter().enumerate() {
        let s = Snapshot {
            t_ms: t as u64,
            jemalloc: Some(JemallocStats {
                resident,
                allocated,
                active: resident,
                ..Default::default()
            }),
            ..Default::default()
        };
        m.update(&s);
        tl.push(s);
    }
    let report = Fragmentation::at_resident_peak(tl.peaks().resident.as_ref()).unwrap();
    assert_eq!(report.resident_ratio, 0.1);
    let text = m.encode();
    assert!(
        text.contains("memsight_fragmentation_ratio{job=\"t\"} 0.1\n"),
        "{text}"
    );
}
