//! Issue 37's viewer defects, each on the screen a person reads (ratatui's TestBackend), fed with
//! real reports: a Python DataLoader job under `memsight run` (2 workers that end before the job;
//! cgroup path anonymised) and the demo training job.

use memsight_format::Report;
use memsight_tui::state::ViewerState;
use memsight_tui::view::{render, Intent, Screen, Ui, Window};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::path::Path;

const SIZES: [(u16, u16); 4] = [(36, 10), (80, 24), (100, 30), (160, 45)];

fn report(name: &str) -> Report {
    Report::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

fn replay(r: Report) -> ViewerState {
    ViewerState::from_report("r.json", r)
}

fn screen(state: &ViewerState, screen: Screen, w: u16, h: u16) -> String {
    let mut ui = Ui {
        window: Window::All,
        ..Ui::default()
    };
    ui.apply(Intent::Go(screen), state.timeline.len());
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| render(f, state, &ui)).unwrap();
    term.backend().to_string()
}

/// The rendered rows, without the TestBackend's quotes.
fn rows(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_matches('"').to_string())
        .collect()
}

#[test]
fn the_allocations_screen_does_not_send_a_job_under_memsight_run_to_memsight_run() {
    let state = replay(report("python-loader-report.json"));
    for (w, h) in [(80, 24), (100, 30), (160, 45)] {
        let text = screen(&state, Screen::Allocations, w, h);
        assert!(!text.contains("memsight run"), "at {w}x{h}:\n{text}");
        assert!(
            text.contains("No allocation sites") && text.contains("preloaded"),
            "at {w}x{h}:\n{text}"
        );
    }
}

#[test]
fn the_size_histogram_reaches_the_largest_allocations_at_every_width() {
    // The Python job's largest blocks are tensors of 64 MiB; the demo job's reach 16 MiB.
    for (fixture, largest) in [
        ("python-loader-report.json", "64M"),
        ("recorded-report.json", "16M"),
    ] {
        let state = replay(report(fixture));
        for (w, h) in SIZES {
            let text = screen(&state, Screen::Allocations, w, h);
            let hist: Vec<String> = rows(&text)
                .into_iter()
                .skip(1)
                .take_while(|r| !r.contains("allocation sites"))
                .collect();
            assert!(
                hist.iter().any(|r| r.contains(largest)),
                "{fixture} at {w}x{h}: no {largest} class:\n{text}"
            );
        }
    }
}

#[test]
fn replay_shows_the_worker_table_without_scrolling_back() {
    // The workers ended 3 s before the job: the last samples' trees hold the main process only.
    let state = replay(report("python-loader-report.json"));
    for (w, h) in [(100, 30), (160, 45)] {
        let text = screen(&state, Screen::Overview, w, h);
        assert!(text.contains("process tree (at "), "at {w}x{h}:\n{text}");
        assert_eq!(
            rows(&text)
                .iter()
                .filter(|r| r.contains(" worker "))
                .count(),
            2,
            "at {w}x{h}:\n{text}"
        );
    }
}

#[test]
fn at_80x24_a_long_command_takes_two_rows_and_the_footer_is_whole() {
    let mut r = report("recorded-report.json");
    r.job.command = std::iter::once("torchrun".to_string())
        .chain((0..14).map(|i| format!("--option-{i}=value-{i}")))
        .chain(["--last-argument=shown".to_string()])
        .collect();
    let state = replay(r);
    let text = screen(&state, Screen::Overview, 80, 24);
    let rows = rows(&text);
    let command_rows = rows
        .iter()
        .skip(1)
        .take_while(|r| !r.starts_with("up "))
        .count();
    assert!(
        command_rows <= 2,
        "the command takes {command_rows} rows:\n{text}"
    );
    assert!(text.contains("pid 30044  torchrun"), "{text}");
    assert!(text.contains("--last-argument=shown"), "{text}");
    for s in [
        Screen::Overview,
        Screen::Phases,
        Screen::Allocations,
        Screen::Devices,
        Screen::Tips,
    ] {
        let text = screen(&state, s, 80, 24);
        let footer = text.lines().last().unwrap();
        assert!(
            footer.contains("q quit") && footer.contains("? help"),
            "{s:?}:\n{text}"
        );
    }
}

#[test]
fn the_cgroup_gauge_says_it_counts_every_process_in_the_cgroup() {
    // The same job in a memory cgroup limited to 2 GiB (the recorded one had no limit).
    let mut r = report("python-loader-report.json");
    for s in &mut r.timeline {
        if let Some(c) = s.cgroup.as_mut() {
            c.limit = Some(2 << 30);
        }
    }
    let state = replay(r);
    for (w, h, words) in [
        (160, 45, "memory cgroup, all its processes"),
        (80, 24, "cgroup (all processes)"),
    ] {
        let text = screen(&state, Screen::Overview, w, h);
        assert!(text.contains(words), "at {w}x{h}:\n{text}");
    }
}

#[test]
fn the_devices_screen_tells_a_python_job_the_python_way_to_turn_devices_on() {
    let state = replay(report("python-loader-report.json"));
    let text = screen(&state, Screen::Devices, 160, 45);
    assert!(text.contains("memsight.torch.install()"), "{text}");
    assert!(!text.contains("memsight_integrations"), "{text}");
    // A Rust job (the demo) is told the Rust way.
    let state = replay(report("recorded-report.json"));
    let text = screen(&state, Screen::Devices, 160, 45);
    assert!(text.contains("memsight_integrations::install()"), "{text}");
    assert!(!text.contains("memsight.torch"), "{text}");
}
