//! The viewer's library half: [`state`] (what the wire said; no ratatui), [`view`] (screens that
//! render it, intents from keys) and [`sites`] (a running job's allocation sites). The `memsight` binary's verbs live in `main.rs` and its modules.

pub mod sites;
pub mod state;
pub mod view;
