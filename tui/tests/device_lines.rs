//! The devices screen names the Python lines that hold device memory (`--device-history`): each
//! device's peak and the OOM's failed request, from the records the Python package writes
//! (profiler/analysis/tests/fixtures/device_lines.json).

use memsight_format::device::{DeviceLines, DeviceOom};
use memsight_format::wire::Record;
use memsight_tui::state::ViewerState;
use memsight_tui::view::{render, Intent, Screen, Ui};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

fn fixture() -> (DeviceLines, DeviceLines) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiler/analysis/tests/fixtures/device_lines.json"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    (
        serde_json::from_value(v["peak"].clone()).unwrap(),
        serde_json::from_value(v["oom"].clone()).unwrap(),
    )
}

#[test]
fn the_devices_screen_names_the_lines_at_the_peak_and_at_the_oom() {
    let (peak, oom) = fixture();
    // A live viewer fed the wire records the job writes.
    let mut state = ViewerState::live("");
    state.apply(Record::DeviceLines(Box::new(peak)));
    state.apply(Record::DeviceOom(Box::new(DeviceOom {
        device: 0,
        step: 7,
        requested_bytes: 3 << 30,
        total_bytes: 80 << 30,
        free_bytes: 200 << 20,
        lines: Some(Box::new(oom)),
        ..Default::default()
    })));
    let mut ui = Ui::default();
    ui.apply(Intent::Go(Screen::Devices), state.timeline.len());
    let mut term = Terminal::new(TestBackend::new(120, 45)).unwrap();
    term.draw(|f| render(f, &state, &ui)).unwrap();
    let screen = term.backend().to_string();
    assert!(screen.contains("device memory by Python line"), "{screen}");
    assert!(
        screen.contains("cuda:0 at its peak, 612.00 MiB allocated"),
        "{screen}"
    );
    assert!(
        screen.contains("144.00 MiB  model.py:87 forward  (activations)"),
        "{screen}"
    );
    assert!(
        screen.contains("3.00 GiB refused, asked at model.py:190 forward"),
        "{screen}"
    );
}
