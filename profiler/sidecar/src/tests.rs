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

#[test]
fn tensors_and_each_device_have_gauges() {
    use memsight_format::device::{DeviceSample, TensorStats};
    use memsight_format::snapshot::Snapshot;
    let m = crate::metrics::Metrics::new(vec![
        ("job".into(), "t".into()),
        ("rank".into(), "3".into()),
    ]);
    let device = |index: u32, allocated: u64| DeviceSample {
        index,
        backend: "cuda".into(),
        allocated_bytes: Some(allocated),
        reserved_bytes: Some(allocated * 2),
        used_bytes: Some(allocated * 3),
        ..Default::default()
    };
    m.update(&Snapshot {
        tensors: Some(TensorStats {
            live_bytes: 100,
            peak_bytes: 250,
            ..Default::default()
        }),
        devices: vec![device(0, 1000), device(1, 7)],
        ..Default::default()
    });
    let text = m.encode();
    for line in [
        "memsight_tensor_live_bytes{job=\"t\",rank=\"3\"} 100",
        "memsight_tensor_peak_bytes{job=\"t\",rank=\"3\"} 250",
        "memsight_device_allocated_bytes{job=\"t\",rank=\"3\",device=\"0\"} 1000",
        "memsight_device_reserved_bytes{job=\"t\",rank=\"3\",device=\"1\"} 14",
        "memsight_device_used_bytes{job=\"t\",rank=\"3\",device=\"1\"} 21",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
}

/// The exposition of a sidecar whose job has every source (a gauge appears once it has a value).
fn every_gauge_set() -> String {
    use memsight_format::device::{DeviceSample, TensorStats};
    use memsight_format::heap::HeapStats;
    use memsight_format::host::{CgroupMemory, JemallocStats, ProcessMemory, ProcessTree};
    use memsight_format::snapshot::Snapshot;
    let m = crate::metrics::Metrics::new(vec![("job".into(), "t".into())]);
    m.update(&Snapshot {
        heap: HeapStats {
            allocations: 1,
            live_bytes: 1,
            peak_bytes: 1,
            ..Default::default()
        },
        jemalloc: Some(JemallocStats {
            resident: 2,
            allocated: 1,
            active: 2,
            ..Default::default()
        }),
        process: Some(ProcessMemory {
            rss: 1,
            hwm: 1,
            ..Default::default()
        }),
        cgroup: Some(CgroupMemory {
            limit: Some(2),
            usage: 1,
            ..Default::default()
        }),
        tree: Some(ProcessTree {
            total_rss: 1,
            total_pss: Some(1),
            ..Default::default()
        }),
        tensors: Some(TensorStats::default()),
        devices: vec![DeviceSample {
            allocated_bytes: Some(1),
            reserved_bytes: Some(1),
            used_bytes: Some(1),
            ..Default::default()
        }],
        ..Default::default()
    });
    m.encode()
}

#[test]
fn the_grafana_dashboard_queries_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/memsight.json"
    );
    let text = std::fs::read_to_string(path).expect("docs/grafana/memsight.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let exported = every_gauge_set();
    let mut queries = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            queries += 1;
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("memsight_"))
                .collect();
            assert!(!names.is_empty(), "{expr} queries no memsight metric");
            for n in names {
                // A counter's samples are its family's name with `_total` (OpenMetrics).
                let counter = n
                    .strip_suffix("_total")
                    .is_some_and(|family| exported.contains(&format!("# TYPE {family} counter\n")));
                assert!(
                    counter || exported.contains(&format!("# TYPE {n} ")),
                    "{n} (in {expr}) is not exported"
                );
            }
        }
    }
    assert!(queries >= 8, "{queries} queries");
    // A multi-rank job: every panel splits or selects by rank through the dashboard's variable.
    assert!(
        text.contains("$rank") && text.contains("by (rank"),
        "no per-rank view"
    );
}

#[test]
fn an_attached_process_is_labelled_with_its_own_rank() {
    let child = std::process::Command::new("sleep")
        .arg("5")
        .env("RANK", "7")
        .env("WORLD_SIZE", "8")
        .env_remove("LOCAL_RANK")
        .spawn()
        .expect("sleep runs");
    // Until the child has run `sleep`, its environment is still the test's.
    let environ = format!("/proc/{}/environ", child.id());
    let t = std::time::Instant::now();
    while !std::fs::read(&environ)
        .unwrap_or_default()
        .split(|b| *b == 0)
        .any(|e| e == b"RANK=7")
        && t.elapsed().as_secs() < 5
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let labels = crate::metrics::job_labels("/usr/bin/train", Some(child.id()));
    let mut child = child;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        labels,
        vec![
            ("job".to_string(), "train".to_string()),
            ("rank".to_string(), "7".to_string()),
            ("world_size".to_string(), "8".to_string()),
        ]
    );
}

#[test]
fn the_reports_headline_peaks_and_oom_counts_have_gauges() {
    use memsight_format::device::{DeviceOom, DeviceSample};
    use memsight_format::host::{CgroupMemory, ProcessMemory};
    use memsight_format::report::{PostMortem, Report};
    use memsight_format::snapshot::Snapshot;
    use memsight_format::wire::Record;
    let m = crate::metrics::Metrics::new(vec![("job".into(), "t".into())]);
    // The device's reserved peak (200) and allocated peak (150) come at different samples: the
    // report's fragmentation is (200 - 150) / 200, not either sample's.
    for (rss, usage, kills, allocated, reserved) in [
        (10, 30, 4, 150, 160),
        (50, 90, 4, 20, 200),
        (20, 40, 5, 10, 100),
    ] {
        m.update(&Snapshot {
            process: Some(ProcessMemory {
                rss,
                hwm: rss,
                ..Default::default()
            }),
            cgroup: Some(CgroupMemory {
                limit: Some(1000),
                usage,
                oom_kills: Some(kills),
                ..Default::default()
            }),
            devices: vec![DeviceSample {
                index: 0,
                backend: "cuda".into(),
                allocated_bytes: Some(allocated),
                reserved_bytes: Some(reserved),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    let mut outputs = crate::outputs::Outputs::new(None, &[], None).expect("no metrics address");
    outputs.metrics = Some(std::sync::Arc::new(m));
    outputs.emit(&Record::DeviceOom(Box::default()));
    outputs.alloc_failures(2);
    let m = outputs.metrics.clone().expect("metrics");
    let text = m.encode();
    for line in [
        "memsight_rss_peak_bytes{job=\"t\"} 50\n",
        "memsight_cgroup_usage_bytes{job=\"t\"} 40\n",
        "memsight_cgroup_usage_peak_bytes{job=\"t\"} 90\n",
        "memsight_cgroup_limit_bytes{job=\"t\"} 1000\n",
        "memsight_device_reserved_peak_bytes{job=\"t\",device=\"0\"} 200\n",
        "memsight_device_allocated_peak_bytes{job=\"t\",device=\"0\"} 150\n",
        "memsight_device_fragmentation_ratio{job=\"t\",device=\"0\"} 0.25\n",
        "memsight_oom_events_total{job=\"t\",kind=\"cgroup_oom_kill\"} 1\n",
        "memsight_oom_events_total{job=\"t\",kind=\"device\"} 1\n",
        "memsight_oom_events_total{job=\"t\",kind=\"allocation_failure\"} 2\n",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
    // At the end, the report's own counts: the kills the post-mortem counted, every device OOM.
    let report = Report {
        device_ooms: vec![DeviceOom::default(), DeviceOom::default()],
        post_mortem: Some(PostMortem {
            cgroup_oom_kills: Some(3),
            ..Default::default()
        }),
        ..Default::default()
    };
    outputs.end(&report);
    let text = m.encode();
    for line in [
        "memsight_oom_events_total{job=\"t\",kind=\"cgroup_oom_kill\"} 3\n",
        "memsight_oom_events_total{job=\"t\",kind=\"device\"} 2\n",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
}

/// A device OOM whose record carries its Python lines (`memsight run --device-history`): the
/// post-mortem names the line that asked and the lines holding the memory then.
#[test]
fn a_device_oom_post_mortem_names_the_line_that_asked_and_those_that_held() {
    use crate::cause::{End, Seen};
    use memsight_format::device::{DeviceLine, DeviceLines, DeviceOom};
    use memsight_format::Report;
    use std::os::unix::process::ExitStatusExt;

    let line = |file: &str, line, function: &str, bytes, category: &str| DeviceLine {
        file: file.into(),
        line,
        function: function.into(),
        bytes,
        blocks: 1,
        category: category.into(),
        stack: Vec::new(),
    };
    let report = Report {
        device_ooms: vec![DeviceOom {
            device: 0,
            step: 7,
            requested_bytes: 3 << 30,
            total_bytes: 80 << 30,
            free_bytes: 200 << 20,
            lines: Some(Box::new(DeviceLines {
                moment: "oom".into(),
                live_bytes: 70 << 30,
                lines: vec![
                    line("/u/model.py", 87, "forward", 40 << 30, "activations"),
                    line("/u/train.py", 210, "<module>", 20 << 30, "parameters"),
                ],
                failed_request: Some(line("/u/model.py", 190, "forward", 3 << 30, "activations")),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    let seen = Seen {
        end: End::Child(Some(std::process::ExitStatus::from_raw(1 << 8))),
        status: Some(std::process::ExitStatus::from_raw(1 << 8)),
        signal: None,
        pid: 1,
        oom_kills: None,
        workers: None,
        place: String::new(),
    };
    let (cause, description, _) = seen.judge(&report, &Watch::new());
    assert_eq!(cause, "out_of_memory");
    assert!(
        description.contains(
            "it was asked at model.py:190 forward; allocated then: 40.00 GiB model.py:87 forward \
             (activations), 20.00 GiB train.py:210 <module> (parameters)"
        ),
        "{description}"
    );
}
