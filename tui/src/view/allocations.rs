//! Allocations: calls per power-of-two size class, and the sites holding the bytes at the heap's
//! profiled peak (jemalloc's heap profiler), with what grew between step profiles.

use crate::state::ViewerState;
use memsight_format::units::fmt_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Bar, BarChart, BarGroup, Block, Borders, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

/// Renders the allocations screen.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState) {
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(area);
    render_histogram(f, top, s);
    render_sites(f, bottom, s);
}

fn render_sites(f: &mut Frame, area: Rect, s: &ViewerState) {
    let Some(hp) = &s.heap_profile else {
        let text = match &s.last_heap_dump {
            Some(d) => format!(
                "{} heap profiles written so far (latest {:?} at step {}: {}). Sites come with \
                 the report; now: memsight heap top {}",
                s.heap_dumps,
                d.kind,
                d.step,
                fmt_bytes(d.heap_bytes),
                d.path
            ),
            None => "No heap profile yet: a job linking memsight samples its heap and writes \
                     profiles while a session runs (see the report's sources; a Python job \
                     memsight is preloaded into has no sites yet)."
                .into(),
        };
        f.render_widget(
            Paragraph::new(text).wrap(Wrap { trim: true }).block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(" allocation sites "),
            ),
            area,
        );
        return;
    };
    let mut rows: Vec<Row> = Vec::new();
    let title = match &hp.at_peak {
        Some(p) => {
            rows.extend(p.top_sites.iter().map(|site| {
                Row::new(vec![
                    fmt_bytes(site.bytes),
                    format!("{:.1}%", site.share * 100.0),
                    site.at.label(),
                ])
            }));
            format!(
                " allocation sites at the profiled peak (step {}, {} allocated) ",
                p.step,
                fmt_bytes(p.heap_bytes)
            )
        }
        None => " allocation sites ".into(),
    };
    if let Some(g) = hp.growth.as_ref().filter(|g| !g.sites.is_empty()) {
        rows.push(
            Row::new(vec![
                String::new(),
                String::new(),
                format!("grew from step {} to step {}:", g.from_step, g.to_step),
            ])
            .style(Style::default().add_modifier(Modifier::BOLD)),
        );
        rows.extend(g.sites.iter().take(5).map(|site| {
            Row::new(vec![
                format!("+{}", fmt_bytes(site.grew_bytes.max(0) as u64)),
                String::new(),
                site.at.label(),
            ])
            .style(Style::default().fg(Color::Yellow))
        }));
    }
    let header = Row::new(vec!["bytes", "share", "site"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = [
        Constraint::Length(12),
        Constraint::Length(7),
        Constraint::Min(20),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(Block::default().borders(Borders::ALL).title(title)),
        area,
    );
}

fn render_histogram(f: &mut Frame, area: Rect, s: &ViewerState) {
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
