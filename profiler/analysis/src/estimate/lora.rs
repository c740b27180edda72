//! LoRA and DoRA adapters as `peft` builds them: which linear modules a target list selects (the
//! q/v projections, every linear layer but the output layer, or modules by name) and the trainable
//! parameters they add — r·(in + out) per wrapped linear, r·E·(in + out) per expert tensor, and
//! DoRA's magnitude vector (out features) per wrapped linear.

use super::arch::{Arch, Head};
use serde::Serialize;

/// Which modules get adapters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Targets {
    /// The query and value projections (a fused qkv module as a whole): the LoRA paper's choice
    /// and peft's default for most families.
    QueryValue,
    /// peft's `all-linear`: every linear layer but the output layer (LM or MLM decoder).
    AllLinear,
    /// Modules whose name is one of these (`q_proj,k_proj,v_proj,o_proj`).
    Named(Vec<String>),
}

impl Targets {
    /// Parses `qv`, `all-linear` (also `all`) or a comma list of module names.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "qv" | "q,v" | "q_proj,v_proj" => Ok(Targets::QueryValue),
            "all-linear" | "all" => Ok(Targets::AllLinear),
            "" => Err("--lora-targets is empty: use qv, all-linear or module names".into()),
            names => Ok(Targets::Named(
                names.split(',').map(|n| n.trim().to_string()).collect(),
            )),
        }
    }
}

/// A LoRA (or DoRA) configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lora {
    /// Rank r.
    pub rank: u64,
    /// Targeted modules.
    pub targets: Targets,
    /// DoRA: a magnitude vector per wrapped linear, and the weight's norm in forward.
    pub dora: bool,
}

/// One wrapped module: its shape, how many there are in the model, and experts per module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wrapped {
    /// In features.
    pub fan_in: u64,
    /// Out features.
    pub fan_out: u64,
    /// Modules of this shape in the model.
    pub count: u64,
    /// Experts stored in one tensor (1 for a plain linear).
    pub experts: u64,
    /// Its role in the block (`q`, `v`, `qkv`, `o`, `gate`, …; `head` for a head's linear).
    pub role: &'static str,
}

impl Lora {
    /// The modules the targets select.
    pub fn wrapped(&self, arch: &Arch) -> Vec<Wrapped> {
        let mut out: Vec<Wrapped> = arch
            .linears()
            .into_iter()
            .filter(|l| match &self.targets {
                Targets::QueryValue => matches!(l.role, "q" | "v" | "qkv"),
                Targets::AllLinear => true,
                Targets::Named(names) => names.contains(&l.name),
            })
            .map(|l| Wrapped {
                fan_in: l.fan_in,
                fan_out: l.fan_out,
                count: l.layers,
                experts: l.count,
                role: l.role,
            })
            .collect();
        if self.targets == Targets::AllLinear {
            let d = arch.hidden;
            let head: &[(u64, u64)] = match arch.head {
                Head::Pooler | Head::MaskedLm => &[(d, d)],
                Head::SequenceClassifier { labels } => &[(d, d), (d, labels)],
                Head::TokenClassifier { labels } | Head::Score { labels } => &[(d, labels)],
                Head::Lm { .. } | Head::None => &[],
            };
            out.extend(head.iter().map(|&(fan_in, fan_out)| Wrapped {
                fan_in,
                fan_out,
                count: 1,
                experts: 1,
                role: "head",
            }));
        }
        out
    }

    /// The module names of [`Targets::Named`] that name no linear of the model's blocks (a typo,
    /// or a module the estimate does not wrap, such as the LM head); none for the other targets.
    pub fn unmatched(&self, arch: &Arch) -> Vec<String> {
        let Targets::Named(names) = &self.targets else {
            return Vec::new();
        };
        let linears = arch.linears();
        names
            .iter()
            .filter(|n| !linears.iter().any(|l| &l.name == *n))
            .cloned()
            .collect()
    }

    /// The roles (`q`, `v`, `qkv`, `o`, `gate`, `up`, `down`, …) of the block linears wrapped.
    pub fn wrapped_roles(&self, arch: &Arch) -> Vec<&'static str> {
        arch.linears()
            .into_iter()
            .filter(|l| match &self.targets {
                Targets::QueryValue => matches!(l.role, "q" | "v" | "qkv"),
                Targets::AllLinear => true,
                Targets::Named(names) => names.contains(&l.name),
            })
            .map(|l| l.role)
            .collect()
    }

    /// Trainable parameters the adapters add.
    pub fn params(&self, arch: &Arch) -> u64 {
        self.wrapped(arch)
            .iter()
            .map(|w| {
                let dora = if self.dora && w.experts == 1 {
                    w.fan_out
                } else {
                    0
                };
                w.count * (self.rank * w.experts * (w.fan_in + w.fan_out) + dora)
            })
            .sum()
    }

    /// The largest wrapped linear's weight elements (DoRA computes its norm in forward).
    pub fn largest_wrapped(&self, arch: &Arch) -> u64 {
        self.wrapped(arch)
            .iter()
            .map(|w| w.fan_in * w.fan_out)
            .max()
            .unwrap_or(0)
    }
}
