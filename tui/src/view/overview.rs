//! Overview: who and where (pid, the command in at most two rows of a small terminal, uptime,
//! step, phase, rate, dropped samples), the job's peaks in figures (device, tensors, process heap,
//! RSS, process tree: each with the step and phase where it was first reached, live and replayed),
//! the memory timeline (process heap, jemalloc resident, RSS, cgroup limit; tensors and device 0
//! when present) with peaks and its legend under the plot, the process tree's workers (PSS, USS,
//! RSS; replayed, while they ran), host fragmentation (the run's, at its resident peak) and device
//! fragmentation (at the device's peak, as the report defines it), and headroom (the memory
//! cgroup's, which counts all its processes, else the machine's).

use super::chart::{self, series, Series};
use super::{bytes, Ui};
use crate::state::ViewerState;
use memsight_format::units::fmt_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Gauge, Paragraph, Wrap};
use ratatui::Frame;

/// Renders the overview.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState, ui: &Ui) {
    let samples = ui.visible(s);
    let last = samples.last();
    // The command line takes at most two rows on a small terminal (four on a tall one): the
    // middle is left out, the program and the last arguments stay (the report has it whole).
    let command_rows = if area.height < 30 { 2 } else { 4 };
    let head = head_lines(s, samples, area.width.max(1) as usize, command_rows);
    let figures = peak_lines(s);
    let width = area.width.max(1) as usize;
    let rows = |lines: &[Line]| -> u16 {
        lines
            .iter()
            .map(|l| l.width().max(1).div_ceil(width) as u16)
            .sum()
    };
    let [head_area, peaks_area, body, gauges] = Layout::vertical([
        Constraint::Length(rows(&head)),
        Constraint::Length(rows(&figures)),
        Constraint::Min(3),
        Constraint::Length(3),
    ])
    .areas(area);
    f.render_widget(Paragraph::new(head).wrap(Wrap { trim: false }), head_area);
    f.render_widget(
        Paragraph::new(figures).wrap(Wrap { trim: false }),
        peaks_area,
    );

    // Shown for a job of several processes (one process is the RSS line above) and only where the
    // chart keeps room for its curves.
    let tree = shown_tree(s, samples, ui)
        .filter(|(t, _)| t.processes.len() > 1 && body.height >= super::tree::height(t) + 8);
    let [body, tree_area] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(tree.as_ref().map_or(0, |(t, _)| super::tree::height(t))),
    ])
    .areas(body);
    if let Some((t, when)) = tree {
        super::tree::render(f, tree_area, t, &when);
    }
    let max = body.width as usize * 2;
    let all = [
        series(samples, max, "process heap", Color::Cyan, |x| {
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
        series(samples, max, chart::CGROUP_LIMIT, Color::Red, |x| {
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
    // The cgroup limit only where it is near the curves (the gauge below states it anyway).
    let highest = all
        .iter()
        .filter(|x| x.name != chart::CGROUP_LIMIT)
        .flat_map(|x| x.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let shown: Vec<Series> = all
        .into_iter()
        .filter(|x| !x.points.is_empty())
        .filter(|x| {
            x.name != chart::CGROUP_LIMIT
                || x.points
                    .iter()
                    .all(|p| memsight_analysis::plot::limit_in_view(p.1 as u64, highest as u64))
        })
        .collect();
    chart::draw(f, body, " memory over time ", &shown, samples);

    // The report's definition, at the peak: (peak reserved − peak allocated) / peak reserved.
    let device_frag = s.report.as_ref().and_then(|r| {
        r.devices
            .iter()
            .filter(|d| d.index == 0)
            .find_map(|d| d.peak_fragmentation)
    });
    let [frag, dev_frag, head_room] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Fill(if device_frag.is_some() { 1 } else { 0 }),
        Constraint::Fill(1),
    ])
    .areas(gauges);
    if let Some(r) = device_frag {
        let w = dev_frag.width;
        let pct = format!("{:.1}%", r * 100.0);
        f.render_widget(
            Gauge::default()
                .block(Block::default().borders(Borders::ALL).title(fit(
                    w,
                    " cuda:0 fragmentation (at the peak) ",
                    " cuda:0 frag. at peak ",
                )))
                .ratio(r.clamp(0.0, 1.0))
                .label(fit(
                    w,
                    &format!("{pct} of peak reserved not allocated"),
                    &format!("{pct} unallocated"),
                )),
            dev_frag,
        );
    }
    let fr = s.fragmentation.as_ref().map(|f| f.resident_ratio);
    f.render_widget(
        Gauge::default()
            .block(Block::default().borders(Borders::ALL).title(fit(
                frag.width,
                " host fragmentation (at the resident peak) ",
                " host frag. at peak ",
            )))
            .ratio(fr.unwrap_or(0.0).clamp(0.0, 1.0))
            .label(fr.map_or("—".into(), |r| {
                let pct = format!("{:.1}%", r * 100.0);
                fit(
                    frag.width,
                    &format!("{pct} resident not live"),
                    &format!("{pct} not live"),
                )
            })),
        frag,
    );
    let limited = last.and_then(|l| l.cgroup.and_then(|c| c.limit.map(|lim| (c.usage, lim))));
    let cgroup = limited.is_some();
    let (ratio, label) = match limited {
        Some((u, lim)) => (
            u as f64 / lim.max(1) as f64,
            fit(
                head_room.width,
                &format!(
                    "{} of {} limit used, {} left",
                    bytes(Some(u)),
                    bytes(Some(lim)),
                    bytes(Some(lim.saturating_sub(u)))
                ),
                &format!("{} left", bytes(Some(lim.saturating_sub(u)))),
            ),
        ),
        None => match last.and_then(|l| l.system) {
            Some(sys) => (
                1.0 - sys.available as f64 / sys.total.max(1) as f64,
                fit(
                    head_room.width,
                    &format!(
                        "{} available of {}",
                        bytes(Some(sys.available)),
                        bytes(Some(sys.total))
                    ),
                    &format!("{} available", bytes(Some(sys.available))),
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
            .block(Block::default().borders(Borders::ALL).title(if cgroup {
                // The cgroup's usage counts every process in it (the whole container's, unless the
                // job has a cgroup of its own), not only the job's.
                fit(
                    head_room.width,
                    " memory cgroup, all its processes / OOM risk ",
                    " cgroup (all processes) ",
                )
            } else {
                fit(head_room.width, " machine memory / OOM risk ", " OOM risk ")
            }))
            .gauge_style(Style::default().fg(color))
            .ratio(ratio.clamp(0.0, 1.0))
            .label(label),
        head_room,
    );
}

/// `long` when it fits in a box `width` wide, else `short`.
fn fit(width: u16, long: &str, short: &str) -> String {
    if long.chars().count() + 2 <= width as usize {
        long.to_string()
    } else {
        short.to_string()
    }
}

/// The header: pid and the command line (wrapped in at most `command_rows` rows of `width`, the
/// middle left out where it needs more), dropped and missed samples; uptime, step, phase, sampling
/// rate; how the job ended or what it holds now.
fn head_lines<'a>(
    s: &ViewerState,
    samples: &[memsight_format::Snapshot],
    width: usize,
    command_rows: usize,
) -> Vec<Line<'a>> {
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
    let mut lines: Vec<Line> = wrap_command(
        &format!("pid {}  {}", s.pid, s.command.join(" ")),
        width,
        command_rows,
    )
    .into_iter()
    .map(Line::raw)
    .collect();
    let mut line1 = Vec::new();
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
            "now: heap not measured (sampled from outside)  RSS {}",
            bytes(last.and_then(|l| l.process.map(|p| p.rss))),
        )),
        None => Line::raw(format!(
            "now: process heap {}  RSS {}",
            bytes(last.map(|l| l.heap.live_bytes)),
            bytes(last.and_then(|l| l.process.map(|p| p.rss))),
        )),
    };
    if !line1.is_empty() {
        lines.push(Line::from(line1));
    }
    lines.extend([Line::raw(line2), line3]);
    lines
}

/// `text` wrapped at its spaces into rows of at most `width` characters (a longer word split),
/// at most `max_rows` of them: where it needs more, the last row holds `…` and the end of the
/// text, so the program and the last arguments stay in view.
fn wrap_command(text: &str, width: usize, max_rows: usize) -> Vec<String> {
    let width = width.max(4);
    let len = |s: &str| s.chars().count();
    let mut rows: Vec<String> = vec![String::new()];
    for word in text.split(' ') {
        let mut word: String = word.to_string();
        loop {
            let row = rows.last_mut().map_or(0, |r| len(r));
            let gap = usize::from(row > 0);
            if row + gap + len(&word) <= width {
                if let Some(r) = rows.last_mut() {
                    if gap == 1 {
                        r.push(' ');
                    }
                    r.push_str(&word);
                }
                break;
            }
            if row > 0 {
                rows.push(String::new());
                continue;
            }
            // A word longer than a row: split it.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            if let Some(r) = rows.last_mut() {
                r.push_str(&head);
            }
            rows.push(String::new());
        }
    }
    rows.retain(|r| !r.is_empty());
    if rows.len() <= max_rows.max(1) {
        return rows;
    }
    rows.truncate(max_rows.max(1) - 1);
    let mut tail: Vec<&str> = Vec::new();
    let mut used = 2;
    for word in text.split(' ').rev() {
        let need = len(word) + usize::from(!tail.is_empty());
        if used + need > width {
            break;
        }
        used += need;
        tail.push(word);
    }
    tail.reverse();
    let end = if tail.is_empty() {
        let n = len(text);
        text.chars().skip(n.saturating_sub(width - 2)).collect()
    } else {
        tail.join(" ")
    };
    rows.push(format!("… {end}"));
    rows
}

/// The process tree to show and when it was read. Live: the latest (a worker that ended is not
/// shown as running). Replayed: the tree at its highest footprint (the report's) when it has
/// several processes and the window reaches it, else the latest tree of several processes in the
/// window (data-loader workers end before the job does), else the latest.
fn shown_tree<'a>(
    s: &'a ViewerState,
    samples: &'a [memsight_format::Snapshot],
    ui: &Ui,
) -> Option<(&'a memsight_format::host::ProcessTree, String)> {
    let latest = samples.iter().rev().find_map(|x| x.tree.as_ref());
    if !matches!(s.source, crate::state::Source::Replay { .. }) {
        return latest.map(|t| (t, "latest".to_string()));
    }
    let at = |ms: u64| format!("at {:.1}s", ms as f64 / 1000.0);
    let (start, end) = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => (a.t_ms, b.t_ms),
        _ => return None,
    };
    let peak = s
        .report
        .as_ref()
        .and_then(|r| r.process_tree.as_ref())
        .filter(|p| p.tree.processes.len() > 1)
        .filter(|p| ui.scroll == 0 || (start..=end).contains(&p.at.t_ms));
    if let Some(p) = peak {
        return Some((
            &p.tree,
            format!("at its peak, {:.1}s", p.at.t_ms as f64 / 1000.0),
        ));
    }
    samples
        .iter()
        .rev()
        .find_map(|x| {
            x.tree
                .as_ref()
                .filter(|t| t.processes.len() > 1)
                .map(|t| (t, at(x.t_ms)))
        })
        .or_else(|| latest.map(|t| (t, "latest".to_string())))
}

/// One line per headline peak (the report's figures): what, how much, where first reached.
fn peak_lines<'a>(s: &ViewerState) -> Vec<Line<'a>> {
    let figures = s.figures();
    if figures.is_empty() {
        return vec![Line::raw("peaks: none yet")];
    }
    let name_w = figures.iter().map(|f| f.what.len()).max().unwrap_or(0);
    figures
        .iter()
        .map(|fig| {
            let at = match (fig.note, fig.step, fig.phase.as_deref()) {
                (Some(note), _, _) => note.to_string(),
                (None, Some(st), Some(ph)) => format!("at step {st}, phase {ph}"),
                (None, Some(st), None) => format!("at step {st}, no phase"),
                (None, None, Some(ph)) => format!("in phase {ph}"),
                (None, None, None) => "before the first step".to_string(),
            };
            Line::from(vec![
                Span::styled("peak ", Style::default().add_modifier(Modifier::BOLD)),
                Span::styled(
                    format!("{:<name_w$} {:>10}", fig.what, fmt_bytes(fig.bytes)),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::raw(format!("  {at}")),
            ])
        })
        .collect()
}
