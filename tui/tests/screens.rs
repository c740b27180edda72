//! Every screen rendered with ratatui's TestBackend at 100×30, a tiny 36×10, 80×24 and 160×45, fed with
//! recorded real data (a report of the demo job run under `memsight run`, with its post-mortem),
//! and compared with the snapshots in tests/snapshots. A live state fed by wire records renders the same way.

use memsight_format::wire::Record;
use memsight_format::Report;
use memsight_tui::state::ViewerState;
use memsight_tui::view::{intent, render, Intent, Screen, Ui};
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::Terminal;
use std::path::Path;

fn recorded() -> ViewerState {
    // A real run: the demo training job under `memsight run` (command and cgroup path anonymised).
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recorded-report.json");
    ViewerState::from_report("recorded-report.json", Report::load(&path).unwrap())
}

fn frame(state: &ViewerState, ui: &Ui, w: u16, h: u16) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| render(f, state, ui)).unwrap();
    term.backend().to_string()
}

#[test]
fn every_screen_at_four_sizes() {
    let state = recorded();
    for (name, screen) in [
        ("overview", Screen::Overview),
        ("phases", Screen::Phases),
        ("allocations", Screen::Allocations),
        ("devices", Screen::Devices),
        ("tips", Screen::Tips),
    ] {
        let mut ui = Ui::default();
        ui.apply(Intent::Go(screen), state.timeline.len());
        ui.window = memsight_tui::view::Window::All;
        for (w, h) in [(100, 30), (36, 10), (80, 24), (160, 45)] {
            insta::assert_snapshot!(format!("{name}_{w}x{h}"), frame(&state, &ui, w, h));
        }
    }
}

#[test]
fn what_a_person_reads_matches_the_report() {
    let state = recorded();
    let mut ui = Ui {
        window: memsight_tui::view::Window::All,
        ..Ui::default()
    };
    let overview = frame(&state, &ui, 120, 35);
    let last = state.timeline.last().unwrap();
    assert!(
        overview.contains(&format!("step {}", last.step)),
        "{overview}"
    );
    assert!(
        overview.contains("job exited: exited with code 0"),
        "{overview}"
    );
    assert!(
        overview.contains(&format!("samples {}", state.timeline.len())),
        "{overview}"
    );
    ui.apply(Intent::Go(Screen::Phases), 0);
    let phases = frame(&state, &ui, 120, 35);
    for p in &state.phases {
        assert!(phases.contains(&p.path), "{} missing:\n{phases}", p.path);
    }
    ui.apply(Intent::Go(Screen::Tips), 0);
    let tips = frame(&state, &ui, 120, 35);
    assert!(tips.contains("POST-MORTEM (exited)"), "{tips}");
    ui.apply(Intent::Help, 0);
    assert!(frame(&state, &ui, 120, 35).contains("time window: 1m, 10m, 1h, all"));
    // Esc closes the help and leaves the viewer open (under `--live` quitting leaves the job
    // headless); Esc with no help shown quits.
    let esc = || intent(KeyEvent::from(KeyCode::Esc)).expect("Esc has an intent");
    assert!(ui.apply(esc(), 0), "Esc on the help quit the viewer");
    assert!(!ui.help);
    assert!(!ui.apply(esc(), 0));
}

#[test]
fn a_live_state_fed_by_records_renders_and_counts_drops() {
    let recorded = recorded();
    let mut live = ViewerState::live("/run/memsight/sidecar-1.sock");
    live.apply(Record::SidecarHello {
        major: 1,
        minor: 0,
        job_pid: 4242,
        command: vec!["train".into()],
    });
    live.apply(Record::State {
        timeline: recorded.timeline[..10].to_vec(),
    });
    for s in &recorded.timeline[10..] {
        live.apply(Record::Snapshot(Box::new(s.clone())));
    }
    live.apply(Record::Dropped { count: 3 });
    let ui = Ui::default();
    let text = frame(&live, &ui, 120, 35);
    assert!(
        text.contains("pid 4242") && text.contains("dropped 3 samples") && text.contains("live"),
        "{text}"
    );
    assert_eq!(live.timeline.len(), recorded.timeline.len());
    // The live leak slope comes from sampled step ends; the demo job does not leak.
    let leak = live.leak.clone().expect("a live leak estimate");
    assert!(leak.slope_bytes_per_step.abs() < 64.0 * 1024.0, "{leak:?}");
    live.apply(Record::Phases {
        phases: recorded.phases.clone(),
        histogram: recorded.histogram.clone(),
    });
    live.apply(Record::Ended {
        description: "exited with code 0".into(),
        post_mortem: recorded.post_mortem.clone().map(Box::new),
    });
    assert!(frame(&live, &ui, 120, 35).contains("job exited: exited with code 0"));
    let mut ui = ui;
    ui.apply(Intent::Go(Screen::Tips), 0);
    assert!(frame(&live, &ui, 120, 35).contains("POST-MORTEM (exited)"));
    ui.apply(Intent::Go(Screen::Phases), 0);
    assert!(frame(&live, &ui, 120, 35).contains("train/forward"));
}

#[test]
fn pause_scroll_and_window_change_what_is_shown() {
    let state = recorded();
    let n = state.timeline.len();
    let mut ui = Ui {
        window: memsight_tui::view::Window::All,
        ..Ui::default()
    };
    assert_eq!(ui.visible(&state).len(), n);
    ui.apply(Intent::Scroll(1), n);
    assert!(ui.visible(&state).len() < n);
    ui.apply(Intent::Scroll(-1), n);
    assert_eq!(ui.visible(&state).len(), n);
    ui.apply(Intent::Pause, n - 5);
    assert_eq!(ui.visible(&state).len(), n - 5);
    ui.apply(Intent::Window, n);
    assert_eq!(ui.window, memsight_tui::view::Window::OneMinute);
    assert!(!ui.apply(Intent::Quit, n));
}

#[test]
fn the_devices_screen_charts_tensor_bytes_of_a_libtorch_run() {
    // A real run: the reference GPT (`make demo`, 40 steps) under `memsight run`, paths anonymised.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt-report.json");
    let state = ViewerState::from_report("gpt-report.json", Report::load(&path).unwrap());
    let mut ui = Ui::default();
    ui.apply(Intent::Go(Screen::Devices), state.timeline.len());
    ui.window = memsight_tui::view::Window::All;
    let text = frame(&state, &ui, 100, 30);
    assert!(text.contains("tensors (CPU)"), "{text}");
    assert!(text.contains("no GPU backend delivered data"), "{text}");
    insta::assert_snapshot!("devices_gpt_100x30", text);
}

#[test]
fn the_allocations_screen_lists_the_sites_holding_the_peak() {
    // A heap profile of a 60-step run of the same job, spliced into the fixture: libtorch's
    // tensors charged to the reference model's Rust code.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt-report.json");
    let state = ViewerState::from_report("gpt-report.json", Report::load(&path).unwrap());
    let mut ui = Ui::default();
    ui.apply(Intent::Go(Screen::Allocations), state.timeline.len());
    let text = frame(&state, &ui, 100, 30);
    assert!(
        text.contains("allocation sites at the profiled peak"),
        "{text}"
    );
    assert!(
        text.contains("memsight_gpt::model::Linear::forward (src/model.rs:147)"),
        "{text}"
    );
    insta::assert_snapshot!("allocations_gpt_100x30", text);
}

#[test]
fn the_segment_map_draws_each_segment_with_its_allocated_slices() {
    // The recorded CPU run plus a device sample shaped like a CUDA caching allocator's (no GPU was
    // available to record one): a 20 MiB segment half used, a 2 MiB one full.
    use memsight::devices::{DeviceSample, SegmentMap};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt-report.json");
    let mut report = Report::load(&path).unwrap();
    let mut cells = vec![255u8; 16];
    cells.extend([0u8; 16]);
    let last = report.timeline.last_mut().unwrap();
    last.devices.push(DeviceSample {
        index: 0,
        backend: "libtorch-cuda".into(),
        allocated_bytes: Some(12 << 20),
        reserved_bytes: Some(22 << 20),
        total_bytes: Some(80 << 30),
        segments: vec![
            SegmentMap {
                bytes: 20 << 20,
                allocated_bytes: 10 << 20,
                cells,
            },
            SegmentMap {
                bytes: 2 << 20,
                allocated_bytes: 2 << 20,
                cells: vec![255; 32],
            },
        ],
        ..Default::default()
    });
    // The report's device peaks, as the sidecar folds them.
    memsight_format::device::fold_peaks(&mut report.devices, &last.devices);
    let state = ViewerState::from_report("gpt-report.json", report);
    let mut ui = Ui::default();
    ui.apply(Intent::Go(Screen::Devices), state.timeline.len());
    let text = frame(&state, &ui, 100, 34);
    assert!(
        text.contains("segment map · cuda:0 (libtorch-cuda)"),
        "{text}"
    );
    assert!(text.contains("20.00 MiB  50% used ██████"), "{text}");
    assert!(text.contains("··········"), "{text}");
    assert!(text.contains("2.00 MiB 100% used ████"), "{text}");
    assert!(text.contains("libtorch-cuda"), "{text}");
    // The overview charts the tensors and the device and gauges the device's fragmentation at
    // its peak: (22 − 12) / 22 of the peak reserved is not allocated.
    ui.apply(Intent::Go(Screen::Overview), state.timeline.len());
    let text = frame(&state, &ui, 120, 34);
    for want in [
        "tensors",
        "cuda:0 reserved",
        "cuda:0 allocated",
        "cuda:0 fragmentation",
        "45.5% of peak reserved not allocated",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
}

#[test]
fn the_fragmentation_gauge_shows_the_reports_fragmentation_live_and_replayed() {
    let state = recorded();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recorded-report.json");
    let report = Report::load(&path).unwrap();
    let want = format!(
        "{:.1}% resident not live",
        report.fragmentation.as_ref().unwrap().resident_ratio * 100.0
    );
    let ui = Ui {
        window: memsight_tui::view::Window::All,
        ..Ui::default()
    };
    let replayed = frame(&state, &ui, 120, 35);
    assert!(replayed.contains(&want), "{want} not in\n{replayed}");
    // The same samples fed live give the same figure (not the latest sample's).
    let mut live = ViewerState::live("s.sock");
    for s in report.timeline.iter().cloned() {
        live.apply(Record::Snapshot(Box::new(s)));
    }
    let last = report.timeline.last().and_then(|s| s.jemalloc).unwrap();
    let latest = format!("{:.1}%", last.resident_fragmentation() * 100.0);
    let shown = frame(&live, &ui, 120, 35);
    assert!(shown.contains(&want), "{want} not in\n{shown}");
    assert_ne!(
        want,
        format!("{latest} resident not live"),
        "the fixture cannot tell them apart"
    );
}

#[test]
fn the_overview_lists_each_worker_with_role_heap_pss_uss_and_rss() {
    use memsight_format::host::{ProcessMemory, ProcessTree, TreeProcess};
    let mib = 1u64 << 20;
    let p = |pid, ppid, name: &str, pss, uss, rss| TreeProcess {
        pid,
        ppid,
        name: name.into(),
        rss: rss * mib,
        pss: Some(pss * mib),
        uss: Some(uss * mib),
        ..Default::default()
    };
    let s = memsight_format::Snapshot {
        process: Some(ProcessMemory {
            rss: 432 * mib,
            ..Default::default()
        }),
        tree: Some(ProcessTree::new(vec![
            TreeProcess {
                role: Some("main process".into()),
                heap: Some(200 * mib),
                ..p(100, 0, "python", 300, 250, 432)
            },
            TreeProcess {
                role: Some("worker".into()),
                heap: Some(5 * mib),
                ..p(101, 100, "pt_data_worker", 150, 8, 432)
            },
            p(102, 100, "pt_data_worker", 150, 8, 432),
        ])),
        ..Default::default()
    };
    let mut live = ViewerState::live("s.sock");
    live.apply(Record::Snapshot(Box::new(s)));
    let shown = frame(&live, &Ui::default(), 120, 35);
    for want in [
        "PSS",
        "USS",
        "pt_data_worker",
        "150.00 MiB",
        "8.00 MiB",
        "total (3 processes)",
        "main process",
        "worker",
        "205.00 MiB",
        "600.00 MiB",
        "1.27 GiB",
    ] {
        assert!(shown.contains(want), "{want:?} not in\n{shown}");
    }
}
