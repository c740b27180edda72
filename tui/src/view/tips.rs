//! Tips & diagnosis: the tips with their evidence, and after the job's end its post-mortem.

use crate::state::ViewerState;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

/// Renders the tips screen.
pub fn render(f: &mut Frame, area: Rect, s: &ViewerState) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut lines: Vec<Line> = Vec::new();
    if let Some(pm) = &s.post_mortem {
        lines.push(Line::styled(
            format!("POST-MORTEM ({})", pm.cause),
            bold.fg(Color::Yellow),
        ));
        lines.push(Line::raw(pm.description.clone()));
        for fnd in &pm.findings {
            lines.push(Line::raw(format!(
                "verdict {}: {}",
                fnd.verdict, fnd.evidence
            )));
            for (i, r) in fnd.remedies.iter().enumerate() {
                lines.push(Line::raw(format!("  {}. {r}", i + 1)));
            }
        }
        lines.push(Line::raw(""));
    } else if let Some(e) = &s.ended {
        lines.push(Line::styled(
            format!("job exited: {e}"),
            bold.fg(Color::Yellow),
        ));
        lines.push(Line::raw(""));
    }
    if s.tips.is_empty() {
        lines.push(Line::raw(
            "No tips: nothing in the numbers calls for a change.",
        ));
    }
    for t in &s.tips {
        let color = if t.severity == "warning" {
            Color::Yellow
        } else {
            Color::Reset
        };
        lines.push(Line::styled(t.title.clone(), bold.fg(color)));
        let evidence: Vec<String> = t.evidence.iter().map(|(k, v)| format!("{k} {v}")).collect();
        lines.push(Line::raw(format!("  evidence: {}", evidence.join(", "))));
        lines.push(Line::raw(format!("  do: {}", t.advice)));
    }
    f.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" tips & diagnosis "),
        ),
        area,
    );
}
