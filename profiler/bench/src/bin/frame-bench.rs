//! Viewer frame time: every screen rendered into a 200×60 TestBackend from recorded data (the demo
//! job's report), and from that timeline repeated to the viewer's 20,000-sample cap (hours of
//! history at 10 Hz). Prints the median and p99 per frame (target ≤ 5 ms).

use memsight::Report;
use memsight_tui::state::ViewerState;
use memsight_tui::view::{render, Intent, Screen, Ui, Window};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::path::Path;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tui/tests/fixtures/recorded-report.json");
    let report = Report::load(&path)?;
    let short = ViewerState::from_report("recorded", report);
    let mut long = short.clone();
    let base = short.timeline.clone();
    let span = base.last().map_or(1, |s| s.t_ms + 50);
    long.timeline.clear();
    for k in 0.. {
        for s in &base {
            let mut s = s.clone();
            s.t_ms += k * span;
            long.timeline.push(s);
        }
        if long.timeline.len() >= memsight_tui::state::MAX_SAMPLES {
            break;
        }
    }
    long.timeline.truncate(memsight_tui::state::MAX_SAMPLES);
    let mut term = Terminal::new(TestBackend::new(200, 60))?;
    println!("frame time, 200×60 (median / p99 over 300 frames; target ≤ 5 ms):");
    for (label, state) in [
        ("recorded (116 samples)", &short),
        ("20,000 samples, window all", &long),
    ] {
        for screen in [
            Screen::Overview,
            Screen::Phases,
            Screen::Allocations,
            Screen::Devices,
            Screen::Tips,
        ] {
            let mut ui = Ui::default();
            ui.apply(Intent::Go(screen), state.timeline.len());
            ui.window = Window::All;
            let mut t: Vec<f64> = (0..300)
                .map(|_| {
                    let s = Instant::now();
                    let _ = term.draw(|f| render(f, state, &ui));
                    s.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            t.sort_by(f64::total_cmp);
            println!(
                "  {label:<28} {:<12} {:>6.3} ms / {:>6.3} ms",
                format!("{screen:?}"),
                t[150],
                t[297]
            );
        }
    }
    Ok(())
}
