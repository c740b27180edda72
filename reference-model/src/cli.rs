//! The `train` flags, shared by the binary and the ablation (which parses each variant's flags
//! with the same parser, so a variant's configuration is exactly what `train` runs).

use crate::config::Config;
use clap::{Args, Parser};
use std::path::PathBuf;

/// The flags of `memsight-gpt train` (the ablation parses its variants' flags with them too):
/// the run's [`Config`], two shape overrides and where the outputs go.
#[derive(Args)]
pub struct TrainArgs {
    /// The run's configuration, one flag per field.
    #[command(flatten)]
    pub config: Config,
    /// Longest sequence the model takes (its position table), instead of the preset's; the
    /// sequence length follows it unless --seq-len is given.
    #[arg(long)]
    pub block_size: Option<i64>,
    /// Vocabulary size instead of the byte tokenizer's 256 (e.g. 50257, GPT-2's BPE): widens the
    /// embedding and the LM head only.
    #[arg(long)]
    pub vocab_size: Option<i64>,
    /// Where to write the memsight report.
    #[arg(long, default_value = "memsight-gpt-report.json")]
    pub report: PathBuf,
    /// Save a safetensors checkpoint (and PATH.config.json) at the end.
    #[arg(long, value_name = "PATH.safetensors")]
    pub save: Option<PathBuf>,
    /// Write the run's summary (losses, step time, parameters) as JSON.
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
    /// No progress line and no memsight blocks.
    #[arg(long)]
    pub quiet: bool,
    /// Run without the memsight session and libtorch hooks (for the on/off overhead comparison;
    /// the global allocator stays). Writes no report.
    #[arg(long)]
    pub no_profile: bool,
}

impl TrainArgs {
    /// The run configuration these flags describe.
    pub fn config(&self) -> Config {
        let mut c = self.config.clone();
        c.resolve(self.block_size, self.vocab_size);
        c
    }
}

/// `train` flags on their own, for parsing a flag list.
#[derive(Parser)]
#[command(no_binary_name = true, args_override_self = true)]
pub struct TrainFlags {
    /// The flags.
    #[command(flatten)]
    pub args: TrainArgs,
}
