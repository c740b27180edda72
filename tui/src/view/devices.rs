//! Devices: per-GPU memory, when the job's snapshots carry device data.

use crate::state::ViewerState;
use ratatui::layout::Rect;
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

/// Renders the devices screen.
pub fn render(f: &mut Frame, area: Rect, _s: &ViewerState) {
    // Snapshots carry no device section yet: the tch/CUDA/NVML integrations feed it.
    f.render_widget(
        Paragraph::new(
            "No GPU data in this run: its samples carry host memory only. Device memory, other \
             processes on the GPU and the caching allocator's segments appear here for jobs built \
             with the memsight CUDA integrations.",
        )
        .wrap(Wrap { trim: true })
        .block(Block::default().borders(Borders::ALL).title(" devices ")),
        area,
    );
}
