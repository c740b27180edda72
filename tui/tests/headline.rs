//! What the Overview and the other screens state at 80×24 and 160×45, replayed and live: the job's
//! peaks in figures, each with its step and phase (the report's); legends under the plots, never on
//! a curve; the command line (its program and last arguments); and live, what the report will show
//! at the end (histogram, tips, tensor peaks per phase, the device's peak and fragmentation as the
//! report defines it).

use memsight::devices::DeviceSample;
use memsight_format::units::fmt_bytes;
use memsight_format::wire::Record;
use memsight_format::Report;
use memsight_tui::state::ViewerState;
use memsight_tui::view::{render, Intent, Screen, Ui, Window};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::path::Path;

const SIZES: [(u16, u16); 2] = [(80, 24), (160, 45)];

fn report(name: &str) -> Report {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Report::load(&path).unwrap()
}

fn frame(state: &ViewerState, screen: Screen, w: u16, h: u16) -> String {
    let mut ui = Ui {
        window: Window::All,
        ..Ui::default()
    };
    ui.apply(Intent::Go(screen), state.timeline.len());
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| render(f, state, &ui)).unwrap();
    term.backend().to_string()
}

/// The report's records, fed to a live viewer as a sidecar would send them.
fn live_from(r: &Report) -> ViewerState {
    let mut live = ViewerState::live("/run/memsight/sidecar-1.sock");
    live.apply(Record::SidecarHello {
        major: 1,
        minor: 4,
        job_pid: r.job.pid,
        command: r.job.command.clone(),
    });
    live.apply(Record::Hello {
        pid: r.job.pid,
        command: r.job.command.clone(),
        start_unix_ms: 0,
        interval_ms: r.interval_ms,
        memsight_version: "test".into(),
        process: Default::default(),
    });
    for s in &r.timeline {
        live.apply(Record::Snapshot(Box::new(s.clone())));
    }
    live.apply(Record::Phases {
        phases: r.phases.clone(),
        histogram: r.histogram.clone(),
    });
    live
}

/// The rows of a frame that hold braille, i.e. a plotted curve.
fn is_plot(row: &str) -> bool {
    row.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c))
}

#[test]
fn the_overview_states_the_peaks_with_step_and_phase_at_80x24_and_160x45() {
    // A real run: the reference GPT under `memsight run` (tensors, phases, a heap peak outside
    // every step: set-up).
    let r = report("gpt-report.json");
    let replay = ViewerState::from_report("gpt-report.json", r.clone());
    let p = &r.peaks;
    let tensors = format!(
        "{}  at step {}, phase {}",
        fmt_bytes(p.tensor_peak_bytes.unwrap()),
        p.tensor_peak_step.unwrap(),
        p.tensor_peak_phase.as_deref().unwrap()
    );
    let rss = p.rss_peak_sample.as_ref().unwrap();
    let rss = format!(
        "{}  at step {}, phase {}",
        fmt_bytes(p.rss_peak_bytes.unwrap()),
        rss.step,
        rss.phase.as_deref().unwrap()
    );
    let heap = format!(
        "{}  outside every step and phase",
        fmt_bytes(p.heap_peak_bytes)
    );
    for (w, h) in SIZES {
        let text = frame(&replay, Screen::Overview, w, h);
        for want in [
            "peak tensors",
            &tensors,
            "peak RSS",
            &rss,
            "peak process heap",
            &heap,
        ] {
            assert!(text.contains(want), "{want:?} not at {w}x{h}:\n{text}");
        }
        insta::assert_snapshot!(format!("overview_gpt_{w}x{h}"), text);
    }
}

#[test]
fn live_the_overview_states_the_same_peaks_as_the_report() {
    let r = report("recorded-report.json");
    let live = live_from(&r);
    let replay = ViewerState::from_report("recorded-report.json", r.clone());
    let p = &r.peaks;
    let heap = format!(
        "{}  at step {}, phase {}",
        fmt_bytes(p.heap_peak_bytes),
        p.heap_peak_step.unwrap(),
        p.heap_peak_phase.as_deref().unwrap()
    );
    for (w, h) in SIZES {
        for (how, state) in [("replayed", &replay), ("live", &live)] {
            let text = frame(state, Screen::Overview, w, h);
            assert!(
                text.contains("peak process heap") && text.contains(&heap),
                "{how} {w}x{h}: {heap:?} missing:\n{text}"
            );
            assert!(text.contains("peak RSS"), "{how} {w}x{h}:\n{text}");
        }
        insta::assert_snapshot!(
            format!("overview_live_{w}x{h}"),
            frame(&live, Screen::Overview, w, h)
        );
    }
}

#[test]
fn legends_sit_under_the_plots_never_on_a_curve() {
    let gpt = ViewerState::from_report("gpt-report.json", report("gpt-report.json"));
    let recorded = ViewerState::from_report("recorded-report.json", report("recorded-report.json"));
    for (state, screen, names) in [
        (
            &recorded,
            Screen::Overview,
            &["process heap", "jemalloc resident", "RSS"][..],
        ),
        (
            &gpt,
            Screen::Overview,
            &["tensors", "process heap", "RSS"][..],
        ),
        (&gpt, Screen::Devices, &["tensors (CPU)"][..]),
    ] {
        for (w, h) in SIZES {
            let text = frame(state, screen, w, h);
            let rows: Vec<&str> = text.lines().collect();
            let legend = rows
                .iter()
                .position(|r| r.contains(&format!("━ {}", names[0])))
                .unwrap_or_else(|| panic!("no legend at {w}x{h}:\n{text}"));
            for name in names {
                assert!(
                    rows[legend].contains(&format!("━ {name}")),
                    "{name} not in the legend row at {w}x{h}:\n{text}"
                );
            }
            assert!(
                !is_plot(rows[legend]),
                "the legend shares a row with a curve at {w}x{h}:\n{text}"
            );
            assert!(
                rows[..legend].iter().any(|r| is_plot(r)),
                "the plot is not above its legend at {w}x{h}:\n{text}"
            );
        }
    }
}

/// A long command line wraps; where it would take more than two rows of a small terminal (four of
/// a tall one) its middle is left out, never its program or its last arguments.
#[test]
fn a_long_command_line_keeps_its_program_and_last_argument() {
    let mut r = report("recorded-report.json");
    r.job.command = std::iter::once("torchrun".to_string())
        .chain((0..14).map(|i| format!("--option-{i}=value-{i}")))
        .chain(["--last-argument=shown".to_string()])
        .collect();
    let state = ViewerState::from_report("r.json", r);
    for (w, h) in SIZES {
        let text = frame(&state, Screen::Overview, w, h);
        assert!(text.contains("pid 30044  torchrun"), "{text}");
        assert!(
            text.contains("--last-argument=shown"),
            "command cut at {w}x{h}:\n{text}"
        );
    }
}

#[test]
fn live_screens_show_what_the_report_will_show() {
    let r = report("gpt-report.json");
    let live = live_from(&r);
    for (w, h) in SIZES {
        // The size histogram comes with the phases while the job runs (wire 1.4).
        let alloc = frame(&live, Screen::Allocations, w, h);
        assert!(
            alloc.contains("allocation calls by size class") && !alloc.contains("No allocation"),
            "{w}x{h}:\n{alloc}"
        );
        // The tips the report gives, derived live by the same rules.
        let tips = frame(&live, Screen::Tips, w, h);
        assert!(
            !tips.contains("No tips") && tips.contains("Peak RSS"),
            "{w}x{h}:\n{tips}"
        );
        // Tensor peaks per phase.
        let phases = frame(&live, Screen::Phases, w, h);
        let fwd = r
            .phases
            .iter()
            .filter_map(|p| p.tensor_peak_bytes)
            .max()
            .unwrap();
        assert!(
            phases.contains("tensor peak") && phases.contains(&fmt_bytes(fwd)),
            "{w}x{h}:\n{phases}"
        );
        insta::assert_snapshot!(format!("phases_live_{w}x{h}"), phases);
    }
}

#[test]
fn live_the_device_peak_and_its_fragmentation_are_the_reports() {
    // The recorded run plus a CUDA caching allocator's samples (no GPU recorded one): reserved
    // peaks at 400 MiB at step 60, allocated at 300 MiB at step 29; the last sample holds 100 of
    // 390 MiB. The report's fragmentation is (400 − 300) / 400 = 25%, the last sample's 74.4%.
    let mut r = report("recorded-report.json");
    let mib = 1u64 << 20;
    for s in &mut r.timeline {
        let (allocated, reserved) = match s.step {
            29 => (300, 320),
            60 => (200, 400),
            _ => (100, 390),
        };
        s.devices.push(DeviceSample {
            index: 0,
            backend: "libtorch-cuda".into(),
            allocated_bytes: Some(allocated * mib),
            reserved_bytes: Some(reserved * mib),
            total_bytes: Some(80 << 30),
            ..Default::default()
        });
    }
    let live = live_from(&r);
    for (w, h) in SIZES {
        let text = frame(&live, Screen::Overview, w, h);
        for want in [
            "peak cuda:0 reserved  400.00 MiB  at step 60, phase train/forward",
            "peak cuda:0 allocated 300.00 MiB  at step 29, phase train/forward",
        ] {
            assert!(text.contains(want), "{want:?} not at {w}x{h}:\n{text}");
        }
        let label = if w >= 160 {
            "25.0% of peak reserved not allocated"
        } else {
            "25.0% unallocated"
        };
        assert!(
            text.contains(label) && !text.contains("74.4%"),
            "{w}x{h}:\n{text}"
        );
        let dev = frame(&live, Screen::Devices, w, h);
        assert!(dev.contains("━ cuda:0 reserved"), "{w}x{h}:\n{dev}");
        insta::assert_snapshot!(format!("devices_live_{w}x{h}"), dev);
        // Per phase, the device's highest sampled footprint: 400 MiB in train/forward (step 60).
        let phases = frame(&live, Screen::Phases, w, h);
        assert!(
            phases.contains("cuda:0 peak") && phases.contains("400.00 MiB"),
            "{w}x{h}:\n{phases}"
        );
        insta::assert_snapshot!(format!("phases_device_live_{w}x{h}"), phases);
    }
}

#[test]
fn live_sites_come_from_the_profile_the_report_will_show() {
    use memsight_format::heap_profile::{DumpKind, DumpRecord};
    let dump = |kind, step, heap_bytes| DumpRecord {
        kind,
        path: format!("r.heap/{step}.heap"),
        t_ms: step * 100,
        step,
        heap_bytes,
    };
    let mut live = ViewerState::live("s.sock");
    for d in [
        dump(DumpKind::Step, 1, 10 << 20),
        dump(DumpKind::Peak, 3, 5 << 20),
        dump(DumpKind::Step, 5, 50 << 20),
        dump(DumpKind::Peak, 7, 40 << 20),
        dump(DumpKind::Final, 9, 1 << 20),
    ] {
        live.apply(Record::HeapProfile(d));
    }
    // The largest heap among the profiles that are not step profiles, as the report's at_peak.
    let peak = live.peak_heap_dump.clone().expect("a profiled peak");
    assert_eq!((peak.kind, peak.step), (DumpKind::Peak, 7));
    assert_eq!(live.heap_dumps, 5);
    // Until its sites are read, the screen says which profile it reads.
    let text = frame(&live, Screen::Allocations, 160, 45);
    assert!(
        text.contains("Reading the heap profile (Peak at step 7, 40.00 MiB"),
        "{text}"
    );
}

#[test]
fn a_far_cgroup_limit_is_not_drawn_over_the_curves_a_near_one_is() {
    // The GPU machine's cgroup allows 128 GiB; a job of a few hundred MiB drawn against it is a
    // flat line at the axis (seen live on an H100). Near the curves, the limit is the point.
    let r = report("gpt-report.json");
    for (limit, drawn) in [(128u64 << 30, false), (1 << 30, true)] {
        let mut with_limit = r.clone();
        for s in &mut with_limit.timeline {
            s.cgroup = Some(memsight_format::host::CgroupMemory {
                version: 2,
                limit: Some(limit),
                usage: 600 << 20,
                peak: None,
                oom_kills: Some(0),
            });
        }
        let live = live_from(&with_limit);
        for (w, h) in SIZES {
            let text = frame(&live, Screen::Overview, w, h);
            assert_eq!(
                text.contains("cgroup limit"),
                drawn,
                "limit {} at {w}x{h}:\n{text}",
                fmt_bytes(limit)
            );
            // The axis scales to what is drawn: no GiB label when the 128 GiB limit is off it.
            let gib_label = text.lines().any(|row| {
                row.split('│')
                    .nth(1)
                    .is_some_and(|label| label.trim().ends_with("GiB"))
            });
            assert_eq!(gib_label, drawn, "{w}x{h}:\n{text}");
        }
    }
}

#[test]
fn the_process_tree_panel_is_for_jobs_of_several_processes_and_leaves_the_chart_room() {
    use memsight_format::host::{ProcessTree, TreeProcess};
    let proc = |pid, name: &str| TreeProcess {
        pid,
        ppid: 1,
        name: name.into(),
        rss: 400 << 20,
        pss: Some(300 << 20),
        uss: Some(200 << 20),
        ..Default::default()
    };
    let r = report("gpt-report.json");
    // One process (a Python job on the GPU machine): its tree is the RSS line; at 80×24 the panel
    // left the chart one row.
    let trees = [
        (vec![proc(10, "python3")], false, false),
        (
            vec![proc(10, "python3"), proc(11, "pt_data_worker")],
            false,
            true,
        ),
    ];
    for (procs, at_80x24, at_160x45) in trees {
        let mut with_tree = r.clone();
        for s in &mut with_tree.timeline {
            s.tree = Some(ProcessTree::new(procs.clone()));
        }
        let live = live_from(&with_tree);
        for ((w, h), shown) in SIZES.into_iter().zip([at_80x24, at_160x45]) {
            let text = frame(&live, Screen::Overview, w, h);
            assert_eq!(
                text.contains("process tree"),
                shown,
                "{} processes at {w}x{h}:\n{text}",
                procs.len()
            );
            let plot_rows = text.lines().filter(|row| is_plot(row)).count();
            assert!(plot_rows >= 4, "{plot_rows} plot rows at {w}x{h}:\n{text}");
        }
    }
}

#[test]
fn a_runaway_command_line_is_cut_for_drawing_and_said_so() {
    // A 20 MB argument (the break-it pass's 100 MB command made `view` hold 3.4 GB: every frame
    // joined and wrapped it): the viewer keeps 4 KiB of it and says how much is left out.
    let mut r = report("gpt-report.json");
    r.job.command = vec!["python".into(), "x".repeat(20 << 20), "--tail".into()];
    let state = ViewerState::from_report("big.json", r);
    let kept: usize = state.command.iter().map(String::len).sum();
    assert!(kept < 8192, "{kept} bytes kept");
    let last = state.command.last().unwrap();
    assert!(last.contains("more bytes, in the report"), "{last}");
    let screen = frame(&state, Screen::Overview, 80, 24);
    assert!(screen.contains("pid "), "{screen}");
    // Short command lines are kept whole.
    assert_eq!(
        memsight_tui::state::shown_command(vec!["a".into(), "b c".into()]),
        vec!["a".to_string(), "b c".to_string()]
    );
}
