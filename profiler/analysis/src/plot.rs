//! `memsight summary --format svg`: the memory timeline drawn with plotters (feature `plot`): the
//! series that dominate an ML job (device reserved and allocated, tensors, process heap, RSS, the
//! process tree's PSS, jemalloc resident) and the cgroup limit where it applied with the cgroup's
//! usage (what the limit bounds), on an axis that holds them all, seconds below and steps above,
//! a marker at each device OOM and at the job's end when it was killed or ran out of memory, and
//! the legend beside the plot, never over it.

use memsight_format::units::fmt_bytes;
use memsight_format::{Report, Snapshot};
use plotters::prelude::*;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 520;
/// The legend's column, right of the plot.
const LEGEND_WIDTH: u32 = 230;

/// Renders the timeline as an SVG document.
pub fn svg(r: &Report) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        draw(r, &root).map_err(|e| format!("plotting failed: {e}"))?;
        root.present()
            .map_err(|e| format!("plotting failed: {e}"))?;
    }
    Ok(out)
}

/// One plotted series: its legend name, colour and points (seconds, bytes).
struct Series {
    name: String,
    color: RGBColor,
    points: Vec<(f64, u64)>,
}

/// A vertical marker: when (seconds), what, colour.
struct Marker {
    t: f64,
    label: String,
    color: RGBColor,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn secs(t_ms: u64) -> f64 {
    t_ms as f64 / 1000.0
}

fn line(
    tl: &[Snapshot],
    name: impl Into<String>,
    color: RGBColor,
    f: impl Fn(&Snapshot) -> Option<u64>,
) -> Series {
    Series {
        name: name.into(),
        color,
        points: tl
            .iter()
            .filter_map(|s| f(s).map(|v| (secs(s.t_ms), v)))
            .collect(),
    }
}

/// The series that dominate the job, device memory first; those with no data are left out.
fn series(r: &Report) -> Vec<Series> {
    let tl = &r.timeline;
    let mut out = Vec::new();
    let mut devices: Vec<u32> = tl
        .iter()
        .flat_map(|s| s.devices.iter().map(|d| d.index))
        .collect();
    devices.sort_unstable();
    devices.dedup();
    let shades = [
        (RGBColor(148, 103, 189), RGBColor(197, 176, 213)),
        (RGBColor(140, 86, 75), RGBColor(196, 156, 148)),
    ];
    for (i, dev) in devices.iter().take(2).enumerate() {
        let (dark, light) = shades[i];
        out.push(line(tl, format!("cuda:{dev} reserved"), dark, |s| {
            s.device(*dev)
                .and_then(|d| d.reserved_bytes.or(d.used_bytes))
        }));
        out.push(line(tl, format!("cuda:{dev} allocated"), light, |s| {
            s.device(*dev).and_then(|d| d.allocated_bytes)
        }));
    }
    out.push(line(tl, "tensors", RGBColor(227, 119, 194), |s| {
        s.tensors.map(|t| t.live_bytes)
    }));
    if r.heap_measured() {
        out.push(line(tl, "process heap", RGBColor(31, 119, 180), |s| {
            (s.heap.allocations > 0).then_some(s.heap.live_bytes)
        }));
    }
    out.push(line(tl, "RSS", RGBColor(214, 39, 40), |s| {
        s.process.map(|p| p.rss)
    }));
    out.push(line(tl, "tree PSS", RGBColor(255, 127, 14), |s| {
        s.tree
            .as_ref()
            .filter(|t| t.processes.len() > 1)
            .and_then(|t| t.total_pss)
    }));
    out.push(line(tl, "jemalloc resident", RGBColor(44, 160, 44), |s| {
        s.jemalloc.map(|j| j.resident)
    }));
    out.retain(|s| s.points.iter().any(|p| p.1 > 0));
    out
}

/// Device OOMs where they happened, and the job's end when it was killed or ran out of memory.
fn markers(r: &Report) -> Vec<Marker> {
    let red = RGBColor(200, 0, 0);
    let mut out: Vec<Marker> = r
        .device_ooms
        .iter()
        .map(|o| Marker {
            t: secs(o.t_ms),
            label: format!("cuda:{} OOM (step {})", o.device, o.step),
            color: red,
        })
        .collect();
    if let Some(pm) = &r.post_mortem {
        let label = match pm.cause.as_str() {
            "oom_killed" => Some("OOM kill".to_string()),
            "out_of_memory" => Some("out of memory".to_string()),
            "signaled" => Some(format!("killed (signal {})", pm.signal.unwrap_or(0))),
            _ => None,
        };
        if let Some(label) = label {
            let end = r.timeline.last().map_or(0, |s| s.t_ms) + pm.last_sample_age_ms.unwrap_or(0);
            out.push(Marker {
                t: secs(end),
                label,
                color: RGBColor(0, 0, 0),
            });
        }
    }
    out
}

/// Whether a memory limit is drawn beside series whose highest value is `max_bytes`: only when it
/// is within 4× of them. A far limit (a whole machine's cgroup, 128 GiB on the GPU machine, over a
/// job of 2 GiB) would flatten every curve to the axis; the limit is stated in text instead. The
/// SVG and the viewer's Overview chart share this rule.
pub fn limit_in_view(limit: u64, max_bytes: u64) -> bool {
    limit < max_bytes.saturating_mul(4)
}

/// Beside a drawn cgroup limit, the cgroup's usage: what the limit bounds (every process in the
/// cgroup, page cache included). RSS is not: it counts the file pages the process maps, also those
/// charged to another cgroup (libraries loaded before the job entered its cgroup), so it can pass
/// a limit the cgroup never reached; its legend then says so.
fn with_cgroup_usage(tl: &[Snapshot], limit: u64, series: &mut Vec<Series>) {
    let usage = line(
        tl,
        "cgroup usage (all its processes)",
        RGBColor(90, 90, 90),
        |s| s.cgroup.map(|c| c.usage),
    );
    // The limit each sample ran under: none before the job entered its cgroup when some samples
    // name one, the run's when none does.
    let sampled = tl.iter().any(|s| s.cgroup.and_then(|c| c.limit).is_some());
    let limit_at = |t: f64| {
        tl.iter()
            .find(|s| secs(s.t_ms) == t)
            .and_then(|s| s.cgroup.and_then(|c| c.limit))
            .unwrap_or(if sampled { u64::MAX } else { limit })
    };
    let usage_crossed = usage.points.iter().any(|p| p.1 > limit_at(p.0));
    if let Some(rss) = series.iter_mut().find(|s| s.name == "RSS") {
        if !usage_crossed && rss.points.iter().any(|p| p.1 > limit_at(p.0)) {
            rss.name = "RSS (with pages charged elsewhere)".into();
        }
    }
    if !usage.points.is_empty() {
        series.push(usage);
    }
}

/// The step at `t` seconds: that of the last sample at or before it.
fn step_at(tl: &[Snapshot], t: f64) -> Option<u64> {
    let i = tl.partition_point(|s| secs(s.t_ms) <= t + 1e-9);
    tl.get(i.checked_sub(1)?).map(|s| s.step)
}

fn draw(r: &Report, root: &Area<'_>) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let tl = &r.timeline;
    let mut series = series(r);
    let markers = markers(r);
    let max_bytes = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    let limit = r
        .peaks
        .cgroup_limit_bytes
        .filter(|&l| limit_in_view(l, max_bytes));
    if let Some(l) = limit {
        with_cgroup_usage(tl, l, &mut series);
    }
    // The axis holds every series and the limit.
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(limit)
        .max()
        .unwrap_or(0);
    let (unit, div) = if top >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    };
    let y = |b: u64| b as f64 / div;
    let x_max = tl
        .last()
        .map(|s| secs(s.t_ms))
        .into_iter()
        .chain(markers.iter().map(|m| m.t))
        .fold(0.001f64, f64::max);
    let y_max = (y(top) * 1.1).max(1e-6);
    let title = format!(
        "{} — peak heap {}, peak RSS {}",
        r.job
            .command
            .first()
            .map(|c| c.rsplit('/').next().unwrap_or(c))
            .unwrap_or("job"),
        if r.heap_measured() {
            fmt_bytes(r.peaks.heap_peak_bytes)
        } else {
            "not measured".into()
        },
        r.peaks
            .rss_peak_bytes
            .map(fmt_bytes)
            .unwrap_or_else(|| "n/a".into())
    );
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .top_x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?
        .set_secondary_coord(0.0..x_max, 0.0..y_max);
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(unit)
        .draw()?;
    let step_label = |t: &f64| step_at(tl, *t).map_or(String::new(), |s| s.to_string());
    chart
        .configure_secondary_axes()
        .x_desc("step")
        .x_labels(10)
        .x_label_formatter(&step_label)
        .y_labels(0)
        .draw()?;
    for s in &series {
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(t, b)| (t, y(b))).collect();
        chart.draw_series(LineSeries::new(pts, s.color.stroke_width(2)))?;
    }
    if let Some(l) = limit {
        // Where the samples say which limit applied (a job that entered its cgroup while it ran has
        // none before), else across the run.
        let applied: Vec<(f64, f64)> = tl
            .iter()
            .filter_map(|s| s.cgroup.and_then(|c| c.limit).map(|v| (secs(s.t_ms), y(v))))
            .collect();
        let pts = if applied.is_empty() {
            vec![(0.0, y(l)), (x_max, y(l))]
        } else {
            applied
        };
        chart.draw_series(LineSeries::new(pts, BLACK.stroke_width(1)))?;
    }
    for m in &markers {
        chart.draw_series(LineSeries::new(
            vec![(m.t, 0.0), (m.t, y_max)],
            m.color.stroke_width(2),
        ))?;
        chart.draw_series(std::iter::once(TriangleMarker::new(
            (m.t, y_max * 0.97),
            6,
            m.color.filled(),
        )))?;
    }
    draw_legend(&legend_area, &series, limit.is_some(), &markers)
}

/// The legend, in its own column: one entry per series, the limit, then each marker.
fn draw_legend(
    area: &Area<'_>,
    series: &[Series],
    limit: bool,
    markers: &[Marker],
) -> Result<(), Box<dyn std::error::Error>> {
    let font = ("sans-serif", 14).into_font();
    let mut y = 60;
    let mut entry = |color: RGBColor, text: &str, marker: bool| -> Result<(), String> {
        let shape = if marker {
            PathElement::new(vec![(8, y - 8), (8, y + 8)], color.stroke_width(2))
        } else {
            PathElement::new(vec![(0, y), (22, y)], color.stroke_width(2))
        };
        area.draw(&shape).map_err(|e| e.to_string())?;
        area.draw(&Text::new(text.to_string(), (30, y - 8), font.clone()))
            .map_err(|e| e.to_string())?;
        y += 22;
        Ok(())
    };
    for s in series {
        entry(s.color, &s.name, false)?;
    }
    if limit {
        entry(BLACK, "cgroup limit", false)?;
    }
    for m in markers {
        entry(m.color, &m.label, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsight_format::device::{DeviceOom, DeviceSample, TensorStats};
    use memsight_format::heap::HeapStats;
    use memsight_format::host::ProcessMemory;
    use memsight_format::report::PostMortem;

    /// A job of 20 steps whose device fills until an OOM at step 15, then an OOM kill.
    fn report() -> Report {
        let mib = 1u64 << 20;
        let timeline: Vec<Snapshot> = (0..40)
            .map(|i| Snapshot {
                t_ms: i * 500,
                step: i / 2,
                heap: HeapStats {
                    live_bytes: (100 + i) * mib,
                    allocations: 10,
                    ..Default::default()
                },
                process: Some(ProcessMemory {
                    rss: (300 + i) * mib,
                    ..Default::default()
                }),
                tensors: Some(TensorStats {
                    live_bytes: 50 * mib,
                    ..Default::default()
                }),
                devices: vec![DeviceSample {
                    index: 0,
                    backend: "libtorch-cuda".into(),
                    allocated_bytes: Some(i * 20 * mib),
                    reserved_bytes: Some(i * 25 * mib),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        let mut r = Report {
            timeline,
            ..Default::default()
        };
        r.peaks.heap_peak_bytes = 139 * mib;
        r.device_ooms.push(DeviceOom {
            t_ms: 15_000,
            step: 15,
            device: 0,
            ..Default::default()
        });
        r.post_mortem = Some(PostMortem {
            cause: "oom_killed".into(),
            last_sample_age_ms: Some(300),
            ..Default::default()
        });
        r
    }

    /// Issue 37: a job that entered a 512 MiB cgroup after its libraries were loaded: its RSS
    /// (600 MiB, file pages charged to the cgroup it came from) passes a limit the cgroup's usage
    /// (300 MiB) never reached.
    #[test]
    fn rss_above_a_limit_the_cgroup_never_reached_is_said_and_the_usage_is_drawn() {
        let mib = 1u64 << 20;
        let timeline: Vec<Snapshot> = (0..20)
            .map(|i| Snapshot {
                t_ms: i * 500,
                process: Some(ProcessMemory {
                    rss: 600 * mib,
                    ..Default::default()
                }),
                cgroup: Some(memsight_format::host::CgroupMemory {
                    version: 1,
                    limit: (i >= 5).then_some(512 * mib),
                    usage: if i >= 5 { 300 * mib } else { 2048 * mib },
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let mut r = Report {
            timeline,
            ..Default::default()
        };
        r.peaks.cgroup_limit_bytes = Some(512 * mib);
        let svg = svg(&r).expect("an svg");
        for want in [
            "cgroup limit",
            "cgroup usage (all its processes)",
            "RSS (with pages charged elsewhere)",
        ] {
            assert!(svg.contains(want), "{want} missing");
        }
        // Before the job entered the cgroup no limit applied: the usage of 2 GiB then is not a
        // crossing, and the axis holds it (GiB).
        let axis = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .any(|t| t.trim() == "GiB");
        assert!(axis, "the axis is not in GiB");
    }

    #[test]
    fn the_plot_has_the_dominant_series_steps_and_oom_markers_with_the_legend_beside_it() {
        let svg = svg(&report()).expect("an svg");
        for want in [
            "cuda:0 reserved",
            "cuda:0 allocated",
            "tensors",
            "process heap",
            "RSS",
            "cuda:0 OOM (step 15)",
            "OOM kill",
            "step",
            "seconds",
        ] {
            assert!(svg.contains(want), "{want} missing");
        }
        // Every legend entry is drawn right of the plot, never over it.
        let legend_x0 = (WIDTH - LEGEND_WIDTH) as f64;
        for name in ["cuda:0 reserved", "process heap", "OOM kill"] {
            // A text element holding exactly `name`.
            let at = svg
                .match_indices(name)
                .map(|(i, _)| i)
                .find(|&i| {
                    svg[i + name.len()..].trim_start().starts_with("</text>")
                        && svg[..i].trim_end().ends_with('>')
                })
                .expect("a legend text");
            let tag = &svg[svg[..at].rfind("<text").expect("its tag")..at];
            let x: f64 = tag
                .split("x=\"")
                .nth(1)
                .and_then(|v| v.split('"').next())
                .and_then(|v| v.parse().ok())
                .expect("an x");
            assert!(x >= legend_x0, "{name} at x={x}, inside the plot");
        }
        // The step axis labels steps of the run (0 to 19), not seconds.
        let texts: Vec<&str> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .map(str::trim)
            .collect();
        assert!(
            texts
                .iter()
                .any(|t| t.parse::<u64>().is_ok_and(|n| n >= 15)),
            "no late step label in {texts:?}"
        );
    }
}
