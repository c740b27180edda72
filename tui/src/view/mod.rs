//! Screens that render a [`ViewerState`], plus the view's own state ([`Ui`]: screen, window, help,
//! pause) and the mapping from keys to [`Intent`]s.

mod allocations;
mod chart;
mod devices;
mod overview;
mod phases;
mod tips;
mod tree;

use crate::state::{Source, ViewerState};
use memsight_format::units::fmt_bytes;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

/// The screens, in Tab order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    /// Header, timeline chart, gauges.
    Overview,
    /// Phases and steps.
    Phases,
    /// Size histogram.
    Allocations,
    /// GPUs.
    Devices,
    /// Tips and the post-mortem.
    Tips,
}

const SCREENS: [Screen; 5] = [
    Screen::Overview,
    Screen::Phases,
    Screen::Allocations,
    Screen::Devices,
    Screen::Tips,
];

impl Screen {
    fn title(self) -> &'static str {
        match self {
            Screen::Overview => "1 Overview",
            Screen::Phases => "2 Phases",
            Screen::Allocations => "3 Allocations",
            Screen::Devices => "4 Devices",
            Screen::Tips => "5 Tips & diagnosis",
        }
    }
}

/// The chart's time window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The last minute.
    OneMinute,
    /// The last ten minutes.
    TenMinutes,
    /// The last hour.
    OneHour,
    /// Everything.
    All,
}

impl Window {
    /// Milliseconds shown, `None` for all.
    pub fn span_ms(self) -> Option<u64> {
        match self {
            Window::OneMinute => Some(60_000),
            Window::TenMinutes => Some(600_000),
            Window::OneHour => Some(3_600_000),
            Window::All => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Window::OneMinute => "1m",
            Window::TenMinutes => "10m",
            Window::OneHour => "1h",
            Window::All => "all",
        }
    }

    fn next(self) -> Self {
        match self {
            Window::OneMinute => Window::TenMinutes,
            Window::TenMinutes => Window::OneHour,
            Window::OneHour => Window::All,
            Window::All => Window::OneMinute,
        }
    }
}

/// What the person asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Next screen (Tab).
    Next,
    /// Previous screen (Shift-Tab).
    Previous,
    /// A screen by number.
    Go(Screen),
    /// Toggle the help.
    Help,
    /// Freeze the display (live data keeps arriving).
    Pause,
    /// Cycle the time window.
    Window,
    /// Scroll back in time / forward again.
    Scroll(i64),
    /// Esc: closes the help when it is shown, else leaves.
    Back,
    /// Leave.
    Quit,
}

/// The view's own state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ui {
    /// Current screen.
    pub screen: Screen,
    /// Help overlay shown.
    pub help: bool,
    /// Display frozen.
    pub paused: bool,
    /// Chart window.
    pub window: Window,
    /// How far back the window ends, in samples (0: now).
    pub scroll: usize,
    /// Samples visible when paused (so new data does not move the picture).
    pub frozen_len: Option<usize>,
}

impl Default for Ui {
    fn default() -> Self {
        Ui {
            screen: Screen::Overview,
            help: false,
            paused: false,
            window: Window::TenMinutes,
            scroll: 0,
            frozen_len: None,
        }
    }
}

/// Maps a key to an intent.
pub fn intent(k: KeyEvent) -> Option<Intent> {
    Some(match k.code {
        KeyCode::Tab => Intent::Next,
        KeyCode::BackTab => Intent::Previous,
        KeyCode::Char('1') => Intent::Go(Screen::Overview),
        KeyCode::Char('2') => Intent::Go(Screen::Phases),
        KeyCode::Char('3') => Intent::Go(Screen::Allocations),
        KeyCode::Char('4') => Intent::Go(Screen::Devices),
        KeyCode::Char('5') => Intent::Go(Screen::Tips),
        KeyCode::Char('?') => Intent::Help,
        KeyCode::Char(' ') | KeyCode::Char('p') => Intent::Pause,
        KeyCode::Char('w') => Intent::Window,
        KeyCode::Left => Intent::Scroll(1),
        KeyCode::Right => Intent::Scroll(-1),
        KeyCode::Esc => Intent::Back,
        KeyCode::Char('q') => Intent::Quit,
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Intent::Quit,
        _ => return None,
    })
}

impl Ui {
    /// Applies an intent; false when the viewer should quit.
    pub fn apply(&mut self, i: Intent, samples: usize) -> bool {
        let at = SCREENS.iter().position(|s| *s == self.screen).unwrap_or(0);
        match i {
            Intent::Next => self.screen = SCREENS[(at + 1) % SCREENS.len()],
            Intent::Previous => self.screen = SCREENS[(at + SCREENS.len() - 1) % SCREENS.len()],
            Intent::Go(s) => self.screen = s,
            Intent::Help => self.help = !self.help,
            Intent::Pause => {
                self.paused = !self.paused;
                self.frozen_len = self.paused.then_some(samples);
            }
            Intent::Window => self.window = self.window.next(),
            Intent::Scroll(d) => {
                let step = (samples / 20).max(1);
                self.scroll = if d > 0 {
                    (self.scroll + step).min(samples.saturating_sub(1))
                } else {
                    self.scroll.saturating_sub(step)
                };
            }
            Intent::Back if self.help => self.help = false,
            Intent::Back | Intent::Quit => return false,
        }
        true
    }

    /// The samples this view shows: up to the pause point and scroll, within the window.
    pub fn visible<'a>(&self, s: &'a ViewerState) -> &'a [memsight_format::Snapshot] {
        let end = self
            .frozen_len
            .unwrap_or(s.timeline.len())
            .min(s.timeline.len())
            .saturating_sub(self.scroll);
        let all = &s.timeline[..end];
        match (self.window.span_ms(), all.last()) {
            (Some(span), Some(last)) => {
                let from = last.t_ms.saturating_sub(span);
                let start = all.partition_point(|x| x.t_ms < from);
                &all[start..]
            }
            _ => all,
        }
    }
}

/// Draws the whole frame.
pub fn render(f: &mut Frame, s: &ViewerState, ui: &Ui) {
    let [tabs, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let mut spans = Vec::new();
    for sc in SCREENS {
        let style = if sc == ui.screen {
            Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        } else {
            Style::default()
        };
        spans.push(Span::styled(format!(" {} ", sc.title()), style));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), tabs);
    match ui.screen {
        Screen::Overview => overview::render(f, body, s, ui),
        Screen::Phases => phases::render(f, body, s),
        Screen::Allocations => allocations::render(f, body, s),
        Screen::Devices => devices::render(f, body, s),
        Screen::Tips => tips::render(f, body, s),
    }
    let state = match (&s.source, ui.paused) {
        (_, true) => "PAUSED".to_string(),
        (
            Source::Live {
                connected: false, ..
            },
            _,
        ) if s.ended.is_none() => match &s.down {
            Some(d) if !d.retry => format!("disconnected: {}", d.why),
            Some(d) => format!("reconnecting… ({})", d.why),
            None => "reconnecting…".into(),
        },
        (Source::Live { .. }, _) => "live".into(),
        (Source::Replay { .. }, _) => "replay".into(),
    };
    // The connection's state first; shorter words where the whole line does not fit.
    let w = ui.window.label();
    let keys = [
        format!(" {state} · q quit · Tab/1-5 screens · w window {w} · space pause · ←/→ scroll · ? help"),
        format!(" {state} · q quit · Tab/1-5 screens · w {w} · space pause · ←/→ scroll · ? help"),
        format!(" {state} · q quit · Tab screens · w {w} · space pause · ←/→ · ? help"),
        format!(" {state} · q quit · ? help"),
    ]
    .into_iter()
    .find(|k| k.chars().count() <= footer.width as usize)
    .unwrap_or_else(|| format!(" {state} · ? help"));
    f.render_widget(
        Paragraph::new(keys).style(Style::default().fg(Color::DarkGray)),
        footer,
    );
    if ui.help {
        help(f, body);
    }
}

fn help(f: &mut Frame, area: Rect) {
    let w = area.width.min(60);
    let h = area.height.min(12);
    let r = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let text = "Tab / Shift-Tab, 1-5   switch screens\n\
                w                     time window: 1m, 10m, 1h, all\n\
                space or p            pause the display\n\
                ← / →                 scroll back / forward in time\n\
                ?                     this help\n\
                Esc                   close this help (else quit)\n\
                q, Ctrl-C             quit (the job keeps running)";
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(" help ")),
        r,
    );
}

/// `1.50 GiB`, or `—` when unknown.
pub(crate) fn bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "—".to_string(), fmt_bytes)
}
