//! The memory-over-time chart: one line per series, y in bytes, x in seconds since the start, with
//! a marker at each series' peak.

use memsight_format::units::fmt_bytes;
use memsight_format::Snapshot;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType};
use ratatui::Frame;

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

/// Draws `series` in `area` under `title`.
pub fn draw(f: &mut Frame, area: Rect, title: &str, series: &[Series]) {
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
                .name(s.name)
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::default().fg(s.color))
                .data(&s.points)
        })
        .collect();
    for (s, p) in series.iter().zip(&peaks) {
        if !s.points.is_empty() && s.name != "cgroup limit" {
            data.push(
                Dataset::default()
                    .marker(Marker::Dot)
                    .graph_type(GraphType::Scatter)
                    .style(Style::default().fg(s.color))
                    .data(p),
            );
        }
    }
    let label = |v: f64| Span::raw(fmt_bytes(v.max(0.0) as u64));
    // Up to a third of the width and half the height for the legend (tensors and devices add
    // series; ratatui's default quarter hides the legend then).
    let chart = Chart::new(data)
        .hidden_legend_constraints((
            ratatui::layout::Constraint::Ratio(1, 3),
            ratatui::layout::Constraint::Ratio(1, 2),
        ))
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(title.to_string()),
        )
        .x_axis(Axis::default().bounds([x0, x1]).labels(vec![
            Line::from(format!("{x0:.0}s")),
            Line::from(format!("{x1:.0}s")),
        ]))
        .y_axis(Axis::default().bounds([0.0, ymax]).labels(vec![
            label(0.0),
            label(ymax / 2.0),
            label(ymax),
        ]));
    f.render_widget(chart, area);
}
