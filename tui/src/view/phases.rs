//! Phases: count, time, process-heap peak (and its step), net bytes, tensor peak and (when the job
//! has a GPU) device 0's highest sampled footprint per phase; per-step peak sparkline; the leak
//! slope.

use super::bytes;
use crate::state::ViewerState;
use memsight_format::units::fmt_signed_bytes;
use memsight_format::Snapshot;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

/// Renders the phases screen.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState) {
    let [table, spark, leak] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(5),
        Constraint::Length(1),
    ])
    .areas(area);
    let device = s.timeline.iter().any(|x| device_bytes(x).is_some());
    let tensors = s.phases.iter().any(|p| p.tensor_peak_bytes.is_some());
    // Below 100 columns a device column leaves no room for the call count.
    let count = !device || area.width >= 100;
    let mut header = vec!["phase"];
    let mut widths = vec![Constraint::Min(12)];
    if count {
        header.push("count");
        widths.push(Constraint::Length(6));
    }
    header.extend(["time", "heap peak", "at step", "net"]);
    widths.extend([
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Length(11),
    ]);
    if tensors {
        header.push("tensor peak");
        widths.push(Constraint::Length(11));
    }
    if device {
        header.push("cuda:0 peak");
        widths.push(Constraint::Length(11));
    }
    let rows: Vec<Row> = s
        .phases
        .iter()
        .map(|p| {
            let mut cells = vec![p.path.clone()];
            if count {
                cells.push(p.count.to_string());
            }
            cells.extend([
                format!("{:.0} ms", p.total_ms),
                bytes(Some(p.peak_bytes)),
                p.peak_step.to_string(),
                fmt_signed_bytes(p.net_bytes),
            ]);
            if tensors {
                cells.push(bytes(p.tensor_peak_bytes));
            }
            if device {
                cells.push(bytes(device_peak_in(&s.timeline, &p.path)));
            }
            Row::new(cells)
        })
        .collect();
    let title = if s.phases.is_empty() {
        " phases (none recorded yet) "
    } else {
        " phases "
    };
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(header).style(Style::default().add_modifier(Modifier::BOLD)))
            .block(Block::default().borders(Borders::ALL).title(title)),
        table,
    );
    let width = spark.width.saturating_sub(2) as usize;
    let peaks: Vec<u64> = s.steps.iter().map(|x| x.peak_bytes).collect();
    let shown = &peaks[peaks.len().saturating_sub(width)..];
    let max = shown.iter().copied().max();
    f.render_widget(
        Sparkline::default()
            .block(Block::default().borders(Borders::ALL).title(format!(
                " peak per step (last {} of {} steps, max {}) ",
                shown.len(),
                peaks.len(),
                bytes(max)
            )))
            .data(shown),
        spark,
    );
    let text = match &s.leak {
        Some(l) => format!(
            " leak slope: {} per step (confidence {:.2}, {} steps after {} warm-up)",
            fmt_signed_bytes(l.slope_bytes_per_step as i64),
            l.confidence,
            l.steps_used,
            l.warmup_steps
        ),
        None => " leak slope: not enough steps yet".into(),
    };
    f.render_widget(Paragraph::new(text), leak);
}

/// Device 0's footprint in a sample: reserved, else driver-reported used.
fn device_bytes(s: &Snapshot) -> Option<u64> {
    s.device(0).and_then(|d| d.reserved_bytes.or(d.used_bytes))
}

/// Device 0's highest sampled footprint while `phase` (or a phase inside it) ran.
fn device_peak_in(timeline: &[Snapshot], phase: &str) -> Option<u64> {
    timeline
        .iter()
        .filter(|s| {
            s.phase.as_deref().is_some_and(|p| {
                p == phase || p.strip_prefix(phase).is_some_and(|r| r.starts_with('/'))
            })
        })
        .filter_map(device_bytes)
        .max()
}
