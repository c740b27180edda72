//! Overview: who and where (pid, command, uptime, step, phase, rate, dropped samples), the memory
//! timeline (live heap, jemalloc resident, RSS, cgroup limit; tensors and device 0 when present)
//! with peaks, the process tree's workers (PSS, USS, RSS) when the job was sampled from outside,
//! host fragmentation (the run's, at its resident peak) and device fragmentation, and headroom.

use super::chart::{self, series, Series};
use super::{bytes, Ui};
use crate::state::ViewerState;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Gauge, Paragraph};
use ratatui::Frame;

/// Renders the overview.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState, ui: &Ui) {
    let [head, body, gauges] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(3),
        Constraint::Length(3),
    ])
    .areas(area);
    let samples = ui.visible(s);
    let last = samples.last();
    let rate = s
        .interval_ms
        .or_else(|| {
            let n = samples.len();
            (n >= 2).then(|| (samples[n - 1].t_ms - samples[0].t_ms) / (n as u64 - 1))
        })
        .map_or("—".to_string(), |ms| {
            format!("{:.1} Hz", 1000.0 / ms.max(1) as f64)
        });
    let mut line1 = vec![Span::raw(format!(
        "pid {}  {}  ",
        s.pid,
        s.command.join(" ").chars().take(60).collect::<String>()
    ))];
    if s.dropped > 0 {
        line1.push(Span::styled(
            format!("dropped {} samples  ", s.dropped),
            Style::default().fg(Color::Red),
        ));
    }
    if let Some(missed) = last.map(|l| l.missed_intervals).filter(|m| *m > 0) {
        line1.push(Span::styled(
            format!("missed {missed} sampling intervals"),
            Style::default().fg(Color::Red),
        ));
    }
    let line2 = format!(
        "up {:.1}s  step {}  phase {}  sampling {rate}  samples {}",
        last.map_or(0.0, |l| l.t_ms as f64 / 1000.0),
        last.map_or(0, |l| l.step),
        last.and_then(|l| l.phase.clone())
            .unwrap_or_else(|| "—".into()),
        s.timeline.len()
    );
    let line3 = match &s.ended {
        Some(e) => Line::styled(
            format!("job exited: {e}"),
            Style::default().fg(Color::Yellow),
        ),
        // A process sampled from outside has no heap figures (all 0): say so, not "0 B".
        None if last.is_some_and(|l| l.heap.peak_bytes == 0) => Line::raw(format!(
            "heap not measured (sampled from outside)  RSS {}",
            bytes(last.and_then(|l| l.process.map(|p| p.rss))),
        )),
        None => Line::raw(format!(
            "live heap {}  RSS {}  peak heap {}",
            bytes(last.map(|l| l.heap.live_bytes)),
            bytes(last.and_then(|l| l.process.map(|p| p.rss))),
            bytes(last.map(|l| l.heap.peak_bytes)),
        )),
    };
    f.render_widget(
        Paragraph::new(vec![Line::from(line1), Line::raw(line2), line3]),
        head,
    );

    // The latest tree: the sidecar reads one only as often as its cost allows (every second or so).
    let tree = samples.iter().rev().find_map(|x| x.tree.as_ref());
    let [body, tree_area] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(tree.map_or(0, super::tree::height)),
    ])
    .areas(body);
    if let Some(t) = tree {
        super::tree::render(f, tree_area, t);
    }
    let max = body.width as usize * 2;
    let all = [
        series(samples, max, "live heap", Color::Cyan, |x| {
            (x.heap.allocations > 0).then_some(x.heap.live_bytes)
        }),
        series(samples, max, "jemalloc resident", Color::Yellow, |x| {
            x.jemalloc.map(|j| j.resident)
        }),
        series(samples, max, "RSS", Color::Green, |x| {
            x.process.map(|p| p.rss)
        }),
        series(samples, max, "tree PSS", Color::Magenta, |x| {
            x.tree.as_ref().map(|t| t.footprint())
        }),
        series(samples, max, "cgroup limit", Color::Red, |x| {
            x.cgroup.and_then(|c| c.limit)
        }),
        series(samples, max, "tensors", Color::LightMagenta, |x| {
            x.tensors.map(|t| t.live_bytes)
        }),
        series(samples, max, "cuda:0 allocated", Color::LightGreen, |x| {
            x.device(0).and_then(|d| d.allocated_bytes)
        }),
        series(samples, max, "cuda:0 reserved", Color::LightYellow, |x| {
            x.device(0).and_then(|d| d.reserved_bytes)
        }),
        series(samples, max, "cuda:0 NVML used", Color::LightBlue, |x| {
            x.devices
                .iter()
                .find(|d| d.index == 0 && d.backend == "nvml")
                .and_then(|d| d.used_bytes)
        }),
    ];
    let shown: Vec<Series> = all.into_iter().filter(|x| !x.points.is_empty()).collect();
    chart::draw(f, body, " memory over time (● peaks) ", &shown);

    let device_frag = last
        .and_then(|l| l.device(0))
        .and_then(|d| d.fragmentation());
    let [frag, dev_frag, head_room] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Fill(if device_frag.is_some() { 1 } else { 0 }),
        Constraint::Fill(1),
    ])
    .areas(gauges);
    if let Some(r) = device_frag {
        f.render_widget(
            Gauge::default()
                .block(
                    Block::default()
                        .borders(Borders::ALL)
                        .title(" cuda:0 fragmentation "),
                )
                .ratio(r.clamp(0.0, 1.0))
                .label(format!("{:.1}% reserved not allocated", r * 100.0)),
            dev_frag,
        );
    }
    let fr = s.fragmentation.as_ref().map(|f| f.resident_ratio);
    f.render_widget(
        Gauge::default()
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(" host fragmentation (at the resident peak) "),
            )
            .ratio(fr.unwrap_or(0.0).clamp(0.0, 1.0))
            .label(fr.map_or("—".into(), |r| {
                format!("{:.1}% resident not live", r * 100.0)
            })),
        frag,
    );
    let (ratio, label) =
        match last.and_then(|l| l.cgroup.and_then(|c| c.limit.map(|lim| (c.usage, lim)))) {
            Some((u, lim)) => (
                u as f64 / lim.max(1) as f64,
                format!(
                    "{} of {} limit used, {} left",
                    bytes(Some(u)),
                    bytes(Some(lim)),
                    bytes(Some(lim.saturating_sub(u)))
                ),
            ),
            None => match last.and_then(|l| l.system) {
                Some(sys) => (
                    1.0 - sys.available as f64 / sys.total.max(1) as f64,
                    format!(
                        "{} available of {}",
                        bytes(Some(sys.available)),
                        bytes(Some(sys.total))
                    ),
                ),
                None => (0.0, "—".into()),
            },
        };
    let color = if ratio > 0.9 {
        Color::Red
    } else if ratio > 0.75 {
        Color::Yellow
    } else {
        Color::Green
    };
    f.render_widget(
        Gauge::default()
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(" memory used / OOM risk "),
            )
            .gauge_style(Style::default().fg(color))
            .ratio(ratio.clamp(0.0, 1.0))
            .label(label),
        head_room,
    );
}
