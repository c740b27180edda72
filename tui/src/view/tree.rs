//! The process-tree panel of the overview: the job and its workers (data-loader processes and
//! other children) at the latest sample (replayed: at the tree's peak), each with its role in the job (rank N, worker, launcher…)
//! and exact heap where it carries memsight, PSS (its share of every page it maps), USS (pages
//! only it maps) and RSS, and the tree's totals.

use super::bytes;
use memsight_format::host::ProcessTree;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Borders, Row, Table};
use ratatui::Frame;

/// Most worker rows shown; the totals row covers the rest.
const MAX_ROWS: usize = 8;

/// Lines the panel needs for `tree` (borders, header, rows, totals).
pub fn height(tree: &ProcessTree) -> u16 {
    tree.processes.len().min(MAX_ROWS) as u16 + 4
}

/// Renders `tree` as one row per process and a totals row.
pub fn render(f: &mut Frame, area: Rect, tree: &ProcessTree, when: &str) {
    let mut rows: Vec<Row> = tree
        .processes
        .iter()
        .take(MAX_ROWS)
        .map(|p| {
            Row::new(vec![
                p.pid.to_string(),
                p.name.clone(),
                p.role.clone().unwrap_or_default(),
                bytes(p.heap),
                bytes(p.pss),
                bytes(p.uss),
                bytes(Some(p.rss)),
            ])
        })
        .collect();
    rows.push(
        Row::new(vec![
            String::new(),
            format!("total ({} processes)", tree.processes.len()),
            String::new(),
            bytes(heap_total(tree)),
            bytes(tree.total_pss),
            bytes(tree.total_uss),
            bytes(Some(tree.total_rss)),
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    );
    let header = Row::new(vec!["pid", "name", "role", "heap", "PSS", "USS", "RSS"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = [
        Constraint::Length(8),
        Constraint::Min(16),
        Constraint::Length(16),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(11),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(Block::default().borders(Borders::ALL).title(format!(
                " process tree ({when}): PSS = footprint, USS = private, RSS counts shared pages per process "
            ))),
        area,
    );
}

/// The heaps of the processes that carry memsight, summed (`None` when none does).
fn heap_total(tree: &ProcessTree) -> Option<u64> {
    let heaps: Vec<u64> = tree.processes.iter().filter_map(|p| p.heap).collect();
    (!heaps.is_empty()).then(|| heaps.iter().sum())
}
