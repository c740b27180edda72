//! The model being estimated: a GPT-style decoder (nanoGPT layout: learned positions, pre-LayerNorm
//! blocks with biases, 4× MLP, tied LM head), given by preset or by shape, and its parameter count.

use serde::Serialize;

/// A decoder-only transformer's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModelShape {
    /// Transformer blocks.
    pub layers: u64,
    /// Hidden size (d_model).
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Positions of the learned position embedding (the context length).
    pub positions: u64,
}

/// Named shapes: the GPT-2 family.
pub const PRESETS: [(&str, ModelShape); 4] = [
    ("gpt2", shape(12, 768, 12)),
    ("gpt2-medium", shape(24, 1024, 16)),
    ("gpt2-large", shape(36, 1280, 20)),
    ("gpt2-xl", shape(48, 1600, 25)),
];

const fn shape(layers: u64, hidden: u64, heads: u64) -> ModelShape {
    ModelShape {
        layers,
        hidden,
        heads,
        vocab: 50257,
        positions: 1024,
    }
}

/// The shape of a preset name.
pub fn preset(name: &str) -> Option<ModelShape> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

impl ModelShape {
    /// Parameters of one block: attention (qkv d→3d and projection d→d, with biases), MLP
    /// (d→4d→d, with biases) and two LayerNorms: 12·d² + 13·d.
    pub fn block_params(&self) -> u64 {
        12 * self.hidden * self.hidden + 13 * self.hidden
    }

    /// Token and position embeddings (the LM head is tied to the token embedding).
    pub fn embedding_params(&self) -> u64 {
        (self.vocab + self.positions) * self.hidden
    }

    /// Every parameter: embeddings, blocks and the final LayerNorm (GPT-2 small: 124,439,808).
    pub fn params(&self) -> u64 {
        self.embedding_params() + self.layers * self.block_params() + 2 * self.hidden
    }

    /// Parameters when only the first `n` blocks are loaded (analysis jobs): embeddings, `n`
    /// blocks and the final LayerNorm.
    pub fn params_first_layers(&self, n: u64) -> u64 {
        self.embedding_params() + n.min(self.layers) * self.block_params() + 2 * self.hidden
    }

    /// Per-head dimension.
    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_parameter_counts_match_the_published_ones() {
        assert_eq!(preset("gpt2").unwrap().params(), 124_439_808);
        assert_eq!(preset("gpt2-medium").unwrap().params(), 354_823_168);
        assert_eq!(preset("gpt2-large").unwrap().params(), 774_030_080);
        assert_eq!(preset("gpt2-xl").unwrap().params(), 1_557_611_200);
    }
}
