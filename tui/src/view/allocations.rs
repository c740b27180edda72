//! Allocations: calls per power-of-two size class (live: the job's latest counts), and the sites
//! holding the bytes at the heap's profiled peak (live: the largest profile the job wrote so far),
//! with what grew between step profiles.

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
    let block = |title: String| Block::default().borders(Borders::ALL).title(title);
    let (view, title) = match (&s.heap_profile, &s.live_sites) {
        (Some(hp), _) => match &hp.at_peak {
            Some(p) => (
                Some(p),
                format!(
                    " allocation sites at the profiled peak (step {}, {} allocated) ",
                    p.step,
                    fmt_bytes(p.heap_bytes)
                ),
            ),
            None => (None, " allocation sites ".to_string()),
        },
        (None, Some(Ok(p))) => (
            Some(p),
            format!(
                " allocation sites at the profiled peak so far (step {}, {} allocated) ",
                p.step,
                fmt_bytes(p.heap_bytes)
            ),
        ),
        (None, live) => {
            let text = match (&s.peak_heap_dump, live) {
                (Some(d), Some(Err(e))) => format!(
                    "The heap profile ({:?} at step {}, {}) could not be read: {e}",
                    d.kind,
                    d.step,
                    fmt_bytes(d.heap_bytes)
                ),
                (Some(d), _) => format!(
                    "Reading the heap profile ({:?} at step {}, {}: {})…",
                    d.kind,
                    d.step,
                    fmt_bytes(d.heap_bytes),
                    d.path
                ),
                (None, _) => "No heap profile yet: a job linking memsight, or run under \
                              `memsight run`, samples its heap and writes profiles while a \
                              session runs (the report's sources say why when it does not)."
                    .into(),
            };
            f.render_widget(
                Paragraph::new(text)
                    .wrap(Wrap { trim: true })
                    .block(block(" allocation sites ".into())),
                area,
            );
            return;
        }
    };
    let mut rows: Vec<Row> = view
        .map(|p| {
            p.top_sites
                .iter()
                .map(|site| {
                    Row::new(vec![
                        fmt_bytes(site.bytes),
                        format!("{:.1}%", site.share * 100.0),
                        site.at.label(),
                    ])
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(g) = s
        .heap_profile
        .as_ref()
        .and_then(|hp| hp.growth.as_ref())
        .filter(|g| !g.sites.is_empty())
    {
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
        Table::new(rows, widths).header(header).block(block(title)),
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
                "No allocation counted yet (a process sampled from outside has no histogram: run \
                 it under `memsight run`, which preloads memsight).",
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
