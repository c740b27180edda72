//! The memory-over-time chart: one line per series, y in bytes, x in seconds since the start (its
//! ends labelled with their steps), a marker at each series' peak, and the legend under the plot.

use memsight_format::units::fmt_bytes;
use memsight_format::Snapshot;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType, Paragraph};
use ratatui::Frame;

/// The legend name of the memory limit's series (no peak marker; drawn only near the curves).
pub const CGROUP_LIMIT: &str = "cgroup limit";

/// A named series of (seconds, bytes).
pub struct Series {
    /// Legend name.
    pub name: &'static str,
    /// Line colour.
    pub color: Color,
    /// Points.
    pub points: Vec<(f64, f64)>,
}

/// One series, thinned to at most `max_points` by keeping each bucket's highest point (peaks
/// survive; a braille chart cannot show more points than twice its width anyway).
pub fn series(
    samples: &[Snapshot],
    max_points: usize,
    name: &'static str,
    color: Color,
    f: impl Fn(&Snapshot) -> Option<u64>,
) -> Series {
    let all = samples
        .iter()
        .filter_map(|s| f(s).map(|v| (s.t_ms as f64 / 1000.0, v as f64)));
    let n = samples.len();
    let points = if n <= max_points.max(1) {
        all.collect()
    } else {
        let per = n.div_ceil(max_points.max(1));
        let mut out: Vec<(f64, f64)> = Vec::with_capacity(max_points + 1);
        for (i, p) in all.enumerate() {
            if i % per == 0 {
                out.push(p);
            } else if let Some(last) = out.last_mut() {
                if p.1 > last.1 {
                    *last = p;
                }
            }
        }
        out
    };
    Series {
        name,
        color,
        points,
    }
}

/// Draws `series` in `area` under `title`: the plot, and under it, outside the plot, the legend
/// (one entry per series and the peak marker), so no legend ever covers a curve. The x axis is in
/// seconds, its ends labelled with the step of the first and last of `samples`.
pub fn draw(f: &mut Frame, area: Rect, title: &str, series: &[Series], samples: &[Snapshot]) {
    let block = Block::default()
        .borders(Borders::ALL)
        .title(title.to_string());
    let inner = block.inner(area);
    f.render_widget(block, area);
    let legend = legend(series, inner.width as usize);
    let rows = legend.len().min(3) as u16;
    let [plot, key] = Layout::vertical([Constraint::Min(1), Constraint::Length(rows)]).areas(inner);
    f.render_widget(Paragraph::new(legend), key);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 > x1 {
        (0.0, 1.0)
    } else if x1 - x0 < 1.0 {
        (x0, x0 + 1.0)
    } else {
        (x0, x1)
    };
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.05;
    // Peaks as single points drawn over the lines.
    let peaks: Vec<[(f64, f64); 1]> = series
        .iter()
        .map(|s| {
            let p = s
                .points
                .iter()
                .copied()
                .fold((0.0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
            [p]
        })
        .collect();
    let mut data: Vec<Dataset> = series
        .iter()
        .map(|s| {
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::default().fg(s.color))
                .data(&s.points)
        })
        .collect();
    for (s, p) in series.iter().zip(&peaks) {
        if !s.points.is_empty() && s.name != CGROUP_LIMIT {
            data.push(
                Dataset::default()
                    .marker(Marker::Dot)
                    .graph_type(GraphType::Scatter)
                    .style(Style::default().fg(s.color))
                    .data(p),
            );
        }
    }
    let end = |t: f64, s: Option<&Snapshot>| match s {
        Some(s) => Line::from(format!("{t:.0}s step {}", s.step)),
        None => Line::from(format!("{t:.0}s")),
    };
    let chart = Chart::new(data)
        .legend_position(None)
        .x_axis(
            Axis::default()
                .bounds([x0, x1])
                .labels(vec![end(x0, samples.first()), end(x1, samples.last())]),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, ymax])
                .labels(y_labels(plot.height.saturating_sub(2), ymax)),
        );
    f.render_widget(chart, plot);
}

/// The y axis's labels for a plot `rows` high: bottom, middle and top where there is room; no
/// middle where labels would share a row (a one-row plot drew the middle label under the top one:
/// "1.56 GiBiB"). On one row the top label, drawn last, covers the bottom one.
fn y_labels(rows: u16, ymax: f64) -> Vec<Span<'static>> {
    let label = |v: f64| Span::raw(fmt_bytes(v.max(0.0) as u64));
    if rows < 5 {
        vec![label(0.0), label(ymax)]
    } else {
        vec![label(0.0), label(ymax / 2.0), label(ymax)]
    }
}

/// The legend's lines: a coloured line and the series' name per entry, then the peak marker, as
/// many entries to a line as fit in `width` (an entry is never split).
fn legend(series: &[Series], width: usize) -> Vec<Line<'static>> {
    let mut entries: Vec<(Color, String)> = series
        .iter()
        .map(|s| (s.color, format!("{}  ", s.name)))
        .collect();
    if !series.is_empty() {
        entries.push((Color::Reset, "peak".into()));
    }
    let mut lines: Vec<Line<'static>> = Vec::new();
    let mut current: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    for (color, name) in entries {
        let w = 2 + name.chars().count();
        if used > 0 && used + w > width {
            lines.push(Line::from(std::mem::take(&mut current)));
            used = 0;
        }
        let mark = if name == "peak" { "● " } else { "━ " };
        current.push(Span::styled(mark, Style::default().fg(color)));
        current.push(Span::raw(name));
        used += w;
    }
    if !current.is_empty() {
        lines.push(Line::from(current));
    }
    lines
}
