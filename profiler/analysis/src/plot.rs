//! `memsight summary --format svg`: the memory timeline drawn with plotters (feature `plot`).

use memsight_format::units::fmt_bytes;
use memsight_format::Report;
use plotters::prelude::*;

/// Renders the timeline (live heap, jemalloc resident, RSS, cgroup limit) as an SVG document.
pub fn svg(r: &Report) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (960, 480)).into_drawing_area();
        draw(r, &root).map_err(|e| format!("plotting failed: {e}"))?;
        root.present()
            .map_err(|e| format!("plotting failed: {e}"))?;
    }
    Ok(out)
}

/// One plotted series: its legend name, colour and points.
type Series = (&'static str, RGBColor, Vec<(f64, f64)>);

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw(r: &Report, root: &Area<'_>) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let tl = &r.timeline;
    let secs = |t: u64| t as f64 / 1000.0;
    let max_bytes = tl
        .iter()
        .map(|s| {
            s.heap
                .live_bytes
                .max(s.process.map_or(0, |p| p.rss))
                .max(s.jemalloc.map_or(0, |j| j.resident))
        })
        .max()
        .unwrap_or(0);
    let (unit, div) = if max_bytes >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    };
    let gib = |b: u64| b as f64 / div;
    let series: Vec<Series> = vec![
        (
            "live heap",
            RGBColor(31, 119, 180),
            tl.iter()
                .map(|s| (secs(s.t_ms), gib(s.heap.live_bytes)))
                .collect(),
        ),
        (
            "jemalloc resident",
            RGBColor(44, 160, 44),
            tl.iter()
                .filter_map(|s| Some((secs(s.t_ms), gib(s.jemalloc?.resident))))
                .collect(),
        ),
        (
            "RSS",
            RGBColor(214, 39, 40),
            tl.iter()
                .filter_map(|s| Some((secs(s.t_ms), gib(s.process?.rss))))
                .collect(),
        ),
    ];
    let x_max = tl.last().map(|s| secs(s.t_ms)).unwrap_or(1.0).max(0.001);
    let mut y_max = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let limit = r.peaks.cgroup_limit_bytes.map(gib);
    if let Some(l) = limit {
        if l < y_max * 4.0 {
            y_max = y_max.max(l);
        }
    }
    let y_max = (y_max * 1.1).max(1e-6);
    let title = format!(
        "{} — peak heap {}, peak RSS {}",
        r.job
            .command
            .first()
            .map(|c| c.rsplit('/').next().unwrap_or(c))
            .unwrap_or("job"),
        fmt_bytes(r.peaks.heap_peak_bytes),
        r.peaks
            .rss_peak_bytes
            .map(fmt_bytes)
            .unwrap_or_else(|| "n/a".into())
    );
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(unit)
        .draw()?;
    for (name, color, pts) in series {
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    if let Some(l) = limit.filter(|l| *l <= y_max) {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, l), (x_max, l)],
                BLACK.stroke_width(1),
            ))?
            .label("cgroup limit")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    Ok(())
}
