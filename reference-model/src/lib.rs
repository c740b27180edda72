//! memsight's reference job: a GPT-2-style model trained with tch under memsight, where every
//! memory optimization is a switch ([`config::Config`]) and every switch is tested for parity.

pub mod ablate;
pub mod analyze;
pub mod attention;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod config;
pub mod data;
pub mod generate;
pub mod linear;
pub mod model;
pub mod optim;
pub mod step;
pub mod train;
