//! What the Python package adds to a report. Device memory by Python line, as it records it
//! (fixtures/device_lines.json is memsight/_device_lines.py's output over a snapshot in PyTorch's
//! format; the Python tests keep it in sync): the report type reads it, and `memsight summary`
//! names the top lines, the categories, what has no Python stack, and at an OOM the line whose
//! request failed. Python's small-object arenas (pymalloc) are stated beside the heap figure they
//! are not part of.

use memsight_format::device::{DeviceLines, DeviceOom};
use memsight_format::Report;

fn fixture() -> (DeviceLines, DeviceLines) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/device_lines.json"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let peak = serde_json::from_value(v["peak"].clone()).unwrap();
    let oom = serde_json::from_value(v["oom"].clone()).unwrap();
    (peak, oom)
}

#[test]
fn the_python_records_read_as_the_report_types() {
    let (peak, oom) = fixture();
    assert_eq!(peak.moment, "peak");
    assert_eq!(peak.live_bytes, (612 << 20) + 100);
    assert_eq!(peak.covers_peak, Some(true));
    assert_eq!(peak.lines[0].short(), "model.py:87 forward");
    assert_eq!(peak.lines[0].bytes, 144 << 20);
    let failed = oom.failed_request.as_ref().unwrap();
    assert_eq!(failed.short(), "model.py:190 forward");
    assert_eq!(failed.bytes, 3 << 30);
}

#[test]
fn summary_names_the_top_lines_at_the_peak_and_at_the_oom() {
    let (peak, oom) = fixture();
    let report = Report {
        device_lines: vec![peak],
        device_ooms: vec![DeviceOom {
            device: 0,
            step: 7,
            requested_bytes: 3 << 30,
            total_bytes: 80 << 30,
            free_bytes: 200 << 20,
            lines: Some(Box::new(oom)),
            ..Default::default()
        }],
        ..Default::default()
    };
    let md = memsight_analysis::summary::markdown(&report);
    assert!(
        md.contains("Device memory by line: cuda:0 at its peak (612.00 MiB allocated; the history reaches back"),
        "{md}"
    );
    assert!(
        md.contains("| 144.00 MiB | 23.5% | `model.py:87 forward` | activations |"),
        "{md}"
    );
    assert!(
        md.contains("| 128.00 MiB | 20.9% | `train.py:210 <module>` | parameters |"),
        "{md}"
    );
    assert!(
        md.contains("| 128.00 MiB | 20.9% | `train.py:310 <module>` | optimizer state |"),
        "{md}"
    );
    assert!(md.contains("no Python stack"), "{md}");
    assert!(
        md.contains("By category: activations 168.00 MiB · backward 168.00 MiB"),
        "{md}"
    );
    assert!(
        md.contains(
            "cuda:0 OOM at step 7 (the request for 3.00 GiB came from `model.py:190 forward`"
        ),
        "{md}"
    );
}

#[test]
fn a_history_that_lost_the_peak_is_said() {
    let (mut peak, _) = fixture();
    peak.covers_peak = Some(false);
    peak.allocator_peak_bytes = Some(1 << 30);
    let report = Report {
        device_lines: vec![peak],
        ..Default::default()
    };
    let md = memsight_analysis::summary::markdown(&report);
    assert!(
        md.contains("the allocator's own peak, 1.00 GiB, is older than the history's"),
        "{md}"
    );
}

#[test]
fn summary_states_pythons_small_object_arenas_beside_the_heap() {
    let report = Report {
        python_arenas: Some(memsight_format::heap::PythonArenas {
            arena_size_bytes: 1 << 20,
            peak_arenas: 18,
            peak_bytes: 18 << 20,
            arenas: 4,
            bytes: 4 << 20,
            allocated_blocks_bytes: Some(1_841_408),
        }),
        ..Default::default()
    };
    let md = memsight_analysis::summary::markdown(&report);
    assert!(
        md.contains("| Python small objects | 18.00 MiB | | pymalloc's arenas (18 × 1.00 MiB"),
        "{md}"
    );
    assert!(md.contains("not in the process heap above"), "{md}");
}
