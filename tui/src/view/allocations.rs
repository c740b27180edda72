//! Allocations: calls per power-of-two size class.

use crate::state::ViewerState;
use memsight::units::fmt_bytes;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::widgets::{Bar, BarChart, BarGroup, Block, Borders, Paragraph};
use ratatui::Frame;

/// Renders the allocations screen.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState) {
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" allocation calls by size class ");
    if s.histogram.is_empty() {
        f.render_widget(
            Paragraph::new(
                "The size histogram comes with the job's report (memsight view REPORT.json).",
            )
            .block(block),
            area,
        );
        return;
    }
    let bars: Vec<Bar> = s
        .histogram
        .iter()
        .map(|b| {
            Bar::default()
                .label(format!("≥{}", fmt_bytes(b.min_bytes).replace(".00", "")))
                .value(b.count)
                .style(Style::default().fg(Color::Cyan))
        })
        .collect();
    f.render_widget(
        BarChart::default()
            .block(block)
            .data(BarGroup::default().bars(&bars))
            .bar_width(9)
            .bar_gap(1),
        area,
    );
}
