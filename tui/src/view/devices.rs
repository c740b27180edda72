//! Devices: libtorch tensor bytes and per-GPU memory over time (device 0 charted), the latest
//! sample of every device and backend, and any device OOM the job's observer caught.

use super::chart::{self, Series};
use crate::state::ViewerState;
use memsight::devices::DeviceSample;
use memsight_format::job_context::Language;
use memsight_format::units::fmt_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

/// Renders the devices screen.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState) {
    let has_tensors = s.timeline.iter().any(|x| x.tensors.is_some());
    let latest: Vec<&DeviceSample> = s
        .timeline
        .iter()
        .rev()
        .find(|x| !x.devices.is_empty())
        .map(|x| x.devices.iter().collect())
        .unwrap_or_default();
    if !has_tensors && latest.is_empty() && s.device_ooms.is_empty() && s.device_lines.is_empty() {
        // How this job's language turns its devices on.
        let install = match s
            .report
            .as_ref()
            .map(|r| memsight_format::job_context::JobContext::of(r).language)
        {
            Some(Some(Language::Python)) => {
                "a Python job that calls memsight.torch.install() (PyTorch's CUDA allocator, NVML)"
            }
            Some(Some(Language::Rust)) => {
                "a Rust job that calls memsight_integrations::install() (libtorch, NVML, cudarc)"
            }
            _ => {
                "jobs that call memsight_integrations::install() (Rust: libtorch, NVML, cudarc) \
                 or memsight.torch.install() (Python: PyTorch's CUDA allocator, NVML)"
            }
        };
        f.render_widget(
            Paragraph::new(format!(
                "No tensor or GPU data in this run: its samples carry host memory only. Tensor \
                 bytes, device memory, other processes on the GPU and device OOMs appear here for \
                 {install}; a backend that cannot work on the machine is listed with its reason in \
                 the report's sources (`memsight summary`)."
            ))
            .wrap(Wrap { trim: true })
            .block(Block::default().borders(Borders::ALL).title(" devices ")),
            area,
        );
        return;
    }
    let table_h = (latest.len() + s.device_ooms.len()) as u16 + 4;
    let segments = s
        .timeline
        .iter()
        .rev()
        .flat_map(|x| x.devices.iter())
        .find(|d| !d.segments.is_empty());
    let map_h = segments.map_or(0, |d| (d.segments.len() as u16 + 2).min(12));
    let by_line = line_rows(s);
    let lines_h = if by_line.is_empty() {
        0
    } else {
        (by_line.len() as u16 + 2).min(14)
    };
    let [top, bottom, lines_area, map_area] = Layout::vertical([
        Constraint::Min(8),
        Constraint::Length(table_h.max(5)),
        Constraint::Length(lines_h),
        Constraint::Length(map_h),
    ])
    .areas(area);
    if let Some(d) = segments {
        segment_map(f, map_area, d);
    }
    if !by_line.is_empty() {
        f.render_widget(
            Paragraph::new(by_line.join("\n")).block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(" device memory by Python line (PyTorch's allocator history) "),
            ),
            lines_area,
        );
    }
    let max = top.width as usize * 2;
    let series: Vec<Series> = [
        chart::series(&s.timeline, max, "tensors (CPU)", Color::Magenta, |x| {
            x.tensors.map(|t| t.live_bytes)
        }),
        chart::series(&s.timeline, max, "cuda:0 reserved", Color::Yellow, |x| {
            x.device(0).and_then(|d| d.reserved_bytes.or(d.used_bytes))
        }),
        chart::series(&s.timeline, max, "cuda:0 allocated", Color::Green, |x| {
            x.device(0).and_then(|d| d.allocated_bytes)
        }),
    ]
    .into_iter()
    .filter(|x| !x.points.is_empty())
    .collect();
    chart::draw(f, top, " tensors and device memory ", &series, &s.timeline);

    let opt = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "–".into());
    // Below 100 columns, the inactive-split and retry columns give way to the others.
    let wide = bottom.width >= 100;
    let keep = |cells: Vec<String>| -> Vec<String> {
        cells
            .into_iter()
            .enumerate()
            .filter(|(i, _)| wide || !matches!(i, 4 | 6))
            .map(|(_, c)| c)
            .collect()
    };
    let mut rows: Vec<Row> = latest
        .iter()
        .map(|d| {
            Row::new(keep(vec![
                format!("cuda:{}", d.index),
                d.backend.clone(),
                opt(d.allocated_bytes),
                opt(d.reserved_bytes.or(d.used_bytes)),
                opt(d.inactive_split_bytes),
                opt(d.total_bytes),
                d.alloc_retries
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "–".into()),
                fmt_bytes(d.others_bytes()),
            ]))
        })
        .collect();
    for o in &s.device_ooms {
        rows.push(
            Row::new(keep(vec![
                format!("cuda:{}", o.device),
                format!("OOM, step {}", o.step),
                format!("asked {}", fmt_bytes(o.requested_bytes)),
                opt(o.reserved_bytes),
                opt(o.inactive_split_bytes),
                format!("free {}", fmt_bytes(o.free_bytes)),
                String::new(),
                fmt_bytes(
                    o.processes
                        .iter()
                        .filter(|p| !p.is_job)
                        .filter_map(|p| p.used_bytes)
                        .sum(),
                ),
            ]))
            .style(Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)),
        );
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" latest device samples ");
    if rows.is_empty() {
        f.render_widget(
            Paragraph::new(
                "no GPU backend delivered data: tensor bytes above are libtorch's CPU tensors \
                 (the report's sources say why each GPU backend is absent)",
            )
            .wrap(Wrap { trim: true })
            .block(block),
            bottom,
        );
        return;
    }
    let header = Row::new(keep(
        [
            "device",
            "backend",
            "allocated",
            "reserved",
            "inact. split",
            "total",
            "retries",
            "others",
        ]
        .map(String::from)
        .to_vec(),
    ))
    .style(Style::default().add_modifier(Modifier::BOLD));
    let widths: Vec<Constraint> = [8, 14, 14, 12, 12, 14, 9, 10]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| wide || !matches!(i, 4 | 6))
        .map(|(_, w)| Constraint::Length(w))
        .collect();
    f.render_widget(Table::new(rows, widths).header(header).block(block), bottom);
}

/// The lines of the device-by-line panel: each device's peak, then each OOM that has its lines
/// (the request that failed first), top lines largest first.
pub fn line_rows(s: &ViewerState) -> Vec<String> {
    let mut out = Vec::new();
    let mut moment = |head: String, l: &memsight::devices::DeviceLines| {
        out.push(head);
        for line in l.lines.iter().take(5) {
            out.push(format!(
                "  {:>10}  {}  ({})",
                fmt_bytes(line.bytes),
                line.short(),
                line.category
            ));
        }
        if l.no_stack_bytes > 0 {
            out.push(format!(
                "  {:>10}  no Python stack (autograd's backward thread, or before the history)",
                fmt_bytes(l.no_stack_bytes)
            ));
        }
    };
    for l in &s.device_lines {
        let reach = match l.covers_peak {
            Some(false) => " (the history's window; the allocator's own peak is older)",
            _ => "",
        };
        moment(
            format!(
                "cuda:{} at its peak, {} allocated{reach}",
                l.device,
                fmt_bytes(l.live_bytes)
            ),
            l,
        );
    }
    for o in &s.device_ooms {
        if let Some(l) = &o.lines {
            let asked = l
                .failed_request
                .as_ref()
                .map(|f| format!(", asked at {}", f.short()))
                .unwrap_or_default();
            moment(
                format!(
                    "cuda:{} OOM at step {}: {} refused{asked}; {} allocated then",
                    o.device,
                    o.step,
                    fmt_bytes(o.requested_bytes),
                    fmt_bytes(l.live_bytes)
                ),
                l,
            );
        }
    }
    // File and function names come from the job: no control character of theirs reaches the
    // terminal.
    out.into_iter()
        .map(|l| memsight_format::text::line(&l).into_owned())
        .collect()
}

/// One character per slice of a segment: free `·`, then ░ ▒ ▓ █ as the allocated share grows.
fn cell_char(v: u8) -> char {
    match v {
        0 => '·',
        1..=63 => '░',
        64..=127 => '▒',
        128..=191 => '▓',
        _ => '█',
    }
}

/// A segment's cells resampled to `width` characters.
pub fn segment_bar(cells: &[u8], width: usize) -> String {
    if cells.is_empty() || width == 0 {
        return String::new();
    }
    (0..width)
        .map(|i| {
            let lo = i * cells.len() / width;
            let hi = ((i + 1) * cells.len() / width).max(lo + 1).min(cells.len());
            let sum: u32 = cells[lo..hi].iter().map(|&c| c as u32).sum();
            cell_char((sum / (hi - lo) as u32) as u8)
        })
        .collect()
}

/// The caching allocator's segments as bars, largest first: allocated slices filled, free dotted.
fn segment_map(f: &mut Frame, area: Rect, d: &DeviceSample) {
    let width = area.width.saturating_sub(26) as usize;
    let lines: Vec<ratatui::text::Line> = d
        .segments
        .iter()
        .map(|seg| {
            ratatui::text::Line::from(format!(
                "{:>10} {:>9} {}",
                fmt_bytes(seg.bytes),
                format!(
                    "{:.0}% used",
                    seg.allocated_bytes as f64 * 100.0 / seg.bytes.max(1) as f64
                ),
                segment_bar(&seg.cells, width)
            ))
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(format!(
            " segment map · cuda:{} ({}) · █ allocated · free ",
            d.index, d.backend
        ))),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_bars_show_allocated_and_free_slices() {
        let mut cells = vec![255u8; 16];
        cells.extend(vec![0u8; 8]);
        cells.extend(vec![100u8; 8]);
        assert_eq!(segment_bar(&cells, 8), "████··▒▒");
        assert_eq!(
            segment_bar(&cells, 32)
                .chars()
                .filter(|&c| c == '·')
                .count(),
            8
        );
        assert_eq!(segment_bar(&[], 8), "");
    }
}
