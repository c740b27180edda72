//! The viewer's library half: [`state`] (what the wire said; no ratatui) and [`view`] (screens that
//! render it, intents from keys). The `memsight` binary's verbs live in `main.rs` and its modules.

pub mod state;
pub mod view;
