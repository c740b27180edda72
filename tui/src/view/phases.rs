//! Phases: count, time, process-heap peak (and its step), net bytes and tensor peak per phase;
//! per-step peak sparkline; the leak slope.

use super::bytes;
use crate::state::ViewerState;
use memsight_format::units::fmt_signed_bytes;
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
    let rows: Vec<Row> = s
        .phases
        .iter()
        .map(|p| {
            Row::new(vec![
                p.path.clone(),
                p.count.to_string(),
                format!("{:.0} ms", p.total_ms),
                bytes(Some(p.peak_bytes)),
                p.peak_step.to_string(),
                fmt_signed_bytes(p.net_bytes),
                bytes(p.tensor_peak_bytes),
            ])
        })
        .collect();
    let title = if s.phases.is_empty() {
        " phases (none recorded yet) "
    } else {
        " phases "
    };
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Min(14),
                Constraint::Length(6),
                Constraint::Length(9),
                Constraint::Length(11),
                Constraint::Length(8),
                Constraint::Length(11),
                Constraint::Length(11),
            ],
        )
        .header(
            Row::new(vec![
                "phase",
                "count",
                "time",
                "heap peak",
                "at step",
                "net",
                "tensor peak",
            ])
            .style(Style::default().add_modifier(Modifier::BOLD)),
        )
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
