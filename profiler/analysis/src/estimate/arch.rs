//! One parametric description of a transformer as `transformers` builds it — embeddings, one or two
//! stacks of blocks (attention with grouped KV heads, a plain or gated MLP or a mixture of
//! experts, LayerNorm or RMSNorm, biases where the family has them), the final norm and the head —
//! and what follows from it: the exact parameter count and the linear modules LoRA can target.

use serde::Serialize;

/// The normalisation layers of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Norm {
    /// LayerNorm with weight and bias.
    LayerNorm,
    /// RMSNorm (or T5's LayerNorm): weight only.
    RmsNorm,
}

impl Norm {
    /// Parameters of one norm over `d` features.
    pub fn params(self, d: u64) -> u64 {
        match self {
            Norm::LayerNorm => 2 * d,
            Norm::RmsNorm => d,
        }
    }
}

/// Attention projections of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: u64,
    /// Per-head dimension.
    pub head_dim: u64,
    /// Biases on the query, key and value projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// A norm over each query and key head (Qwen3, Phi's `qk_layernorm`).
    pub qk_norm: bool,
}

/// The feed-forward part of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MlpShape {
    /// Intermediate size (per expert).
    pub intermediate: u64,
    /// Gated (SwiGLU/GeGLU: gate, up and down matrices) or plain (up and down).
    pub gated: bool,
    /// Biases on the MLP matrices.
    pub bias: bool,
    /// Experts (0: a dense MLP; n: a router d→n and n MLPs).
    pub experts: u64,
    /// Experts each token is routed to.
    pub experts_per_token: u64,
}

impl MlpShape {
    /// Parameters of one expert's (or the dense) MLP over hidden size `d`.
    pub fn one_params(&self, d: u64) -> u64 {
        let i = self.intermediate;
        let mats = if self.gated { 3 } else { 2 };
        mats * d * i + if self.bias { i * (mats - 1) + d } else { 0 }
    }

    /// Parameters of the whole feed-forward part (router included).
    pub fn params(&self, d: u64) -> u64 {
        if self.experts > 0 {
            self.experts * self.one_params(d) + d * self.experts
        } else {
            self.one_params(d)
        }
    }
}

/// One stack of identical blocks (a decoder-only model has one; T5 has an encoder and a decoder).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stack {
    /// Blocks.
    pub layers: u64,
    /// Attention.
    pub attention: AttentionShape,
    /// Cross-attention to the encoder in each block (T5's decoder).
    pub cross_attention: bool,
    /// Feed-forward.
    pub mlp: MlpShape,
    /// Norms per block (2 pre/post-norm; 1 for Phi's parallel block; 3 with cross-attention).
    pub norms_per_block: u64,
    /// A final norm after the last block.
    pub final_norm: bool,
    /// Relative-position bias table (T5: buckets × heads, in the first block only).
    pub relative_bias: u64,
}

impl Stack {
    /// Parameters of one attention (self or cross) over hidden size `d`.
    pub fn attention_params(&self, d: u64) -> u64 {
        let a = self.attention;
        let q = a.heads * a.head_dim;
        let kv = a.kv_heads * a.head_dim;
        let w = d * q + 2 * d * kv + q * d;
        let b = if a.qkv_bias { q + 2 * kv } else { 0 } + if a.o_bias { d } else { 0 };
        w + b
    }

    /// Parameters of one block.
    pub fn block_params(&self, d: u64, norm: Norm) -> u64 {
        let qk_norm = if self.attention.qk_norm {
            2 * norm.params(self.attention.head_dim)
        } else {
            0
        };
        let attn = self.attention_params(d) * if self.cross_attention { 2 } else { 1 } + qk_norm;
        attn + self.mlp.params(d) + self.norms_per_block * norm.params(d)
    }

    /// Parameters of the stack: its blocks, the relative bias and the final norm.
    pub fn params(&self, d: u64, norm: Norm) -> u64 {
        self.layers * self.block_params(d, norm)
            + self.relative_bias
            + if self.final_norm { norm.params(d) } else { 0 }
    }
}

/// What sits on top of the last hidden state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Head {
    /// A language-model head d→V (tied: shares the token embedding; `bias`: Phi's).
    Lm {
        /// Shares the token embedding's weight.
        tied: bool,
        /// Has a V-sized bias.
        bias: bool,
    },
    /// BERT/RoBERTa masked-LM head: a d→d transform, a LayerNorm, the tied decoder and a V bias.
    MaskedLm,
    /// Sequence classification: BERT's pooler d→d then d→labels; RoBERTa's dense d→d then
    /// out_proj d→labels (the same count).
    SequenceClassifier {
        /// Labels.
        labels: u64,
    },
    /// A decoder's sequence classifier: `score`, d→labels without a bias.
    Score {
        /// Labels.
        labels: u64,
    },
    /// Per-token classification d→labels (question answering: 2 labels).
    TokenClassifier {
        /// Labels.
        labels: u64,
    },
    /// The bare encoder with BERT's pooler d→d.
    Pooler,
    /// No head.
    None,
}

/// A model as `transformers` builds it from a config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Arch {
    /// The config's `model_type` (`llama`, `bert`, …).
    pub family: String,
    /// The class built (`LlamaForCausalLM`, …).
    pub class: String,
    /// Vocabulary.
    pub vocab: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Rows of a learned position table (0: rotary or relative positions).
    pub positions: u64,
    /// Rows of a token-type table (BERT).
    pub token_types: u64,
    /// A norm right after the embeddings (BERT).
    pub embedding_norm: bool,
    /// The norm kind.
    pub norm: Norm,
    /// Encoder stack (encoder-decoder models and encoders).
    pub encoder: Option<Stack>,
    /// Decoder (or the only) stack of a decoder-only model.
    pub decoder: Option<Stack>,
    /// The head.
    pub head: Head,
    /// Whether the model is causal (generates left to right).
    pub causal: bool,
    /// The MLP's activation function as the config names it.
    pub activation: String,
}

/// A linear layer of a block: its name as the family spells it, in and out features, whether
/// it has a bias, and how many of it one block holds (experts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Linear {
    /// Module name (`q_proj`, `c_attn`, `query_key_value`, …).
    pub name: String,
    /// Role: `q`, `k`, `v`, `qkv`, `o`, `gate`, `up`, `gate_up`, `down`, `router`.
    pub role: &'static str,
    /// In features.
    pub fan_in: u64,
    /// Out features.
    pub fan_out: u64,
    /// Copies per block (experts).
    pub count: u64,
    /// Blocks holding it.
    pub layers: u64,
}

/// The most parameters a described model may have: 2^50 (about a thousand times the largest
/// model trained today). Below it every count and byte figure is exact in 64 bits; above it a
/// config is a typo or hostile, and is refused rather than sized with wrapped arithmetic.
pub const MAX_PARAMS: f64 = (1u64 << 50) as f64;

impl Arch {
    /// Whether the description is one `transformers` could build: every size at least 1, query
    /// heads a multiple of the key/value heads, a mixture of experts routing each token to 1 to
    /// `experts` experts, and at most [`MAX_PARAMS`] parameters (bounded in floating point, so
    /// that no size, however large, wraps). The error names the field.
    pub fn check(&self) -> Result<(), String> {
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(format!("`{name}` is 0: a model needs at least 1"))
            } else {
                Ok(())
            }
        };
        positive("vocab_size", self.vocab)?;
        positive("hidden_size", self.hidden)?;
        let f = |v: u64| v as f64 + 1.0;
        let labels = match self.head {
            Head::SequenceClassifier { labels }
            | Head::Score { labels }
            | Head::TokenClassifier { labels } => labels,
            _ => 0,
        };
        // Every term of `params`, each factor rounded up, so the bound is above it.
        let mut bound = 2.0
            * (f(self.vocab)
                + f(self.positions)
                + f(self.token_types)
                + f(labels)
                + f(self.hidden))
            * f(self.hidden);
        for st in self.stacks() {
            let (a, m) = (st.attention, st.mlp);
            positive("num_hidden_layers", st.layers)?;
            positive("num_attention_heads", a.heads)?;
            positive("num_key_value_heads", a.kv_heads)?;
            positive("head_dim", a.head_dim)?;
            positive("intermediate_size", m.intermediate)?;
            if a.heads % a.kv_heads != 0 {
                return Err(format!(
                    "{} attention heads are not a multiple of {} key/value heads",
                    a.heads, a.kv_heads
                ));
            }
            if m.experts > 0 && !(1..=m.experts).contains(&m.experts_per_token) {
                return Err(format!(
                    "each token is routed to {} of {} experts: it must be 1 to {}",
                    m.experts_per_token, m.experts, m.experts
                ));
            }
            let attn = 6.0 * f(a.heads.max(a.kv_heads)) * f(a.head_dim) * f(self.hidden);
            let mlp = 4.0 * f(m.experts) * f(m.intermediate) * f(self.hidden);
            bound += f(st.layers) * (attn + mlp + 8.0 * f(self.hidden)) + f(st.relative_bias);
        }
        if bound.is_nan() || bound > MAX_PARAMS {
            return Err(format!(
                "the sizes describe up to {bound:.3e} parameters, more than this estimator sizes \
                 ({MAX_PARAMS:.3e}): check the config's sizes"
            ));
        }
        Ok(())
    }

    /// The stacks, encoder first.
    pub fn stacks(&self) -> impl Iterator<Item = &Stack> {
        self.encoder.iter().chain(self.decoder.iter())
    }

    /// Blocks in all stacks.
    pub fn layers(&self) -> u64 {
        self.stacks().map(|s| s.layers).sum()
    }

    /// Embedding parameters: tokens, learned positions, token types, the embedding norm.
    pub fn embedding_params(&self) -> u64 {
        let d = self.hidden;
        (self.vocab + self.positions + self.token_types) * d
            + if self.embedding_norm {
                self.norm.params(d)
            } else {
                0
            }
    }

    /// Head parameters (a tied LM head adds nothing; `parameters()` counts the shared weight
    /// once).
    pub fn head_params(&self) -> u64 {
        let d = self.hidden;
        match self.head {
            Head::Lm { tied, bias } => {
                (if tied { 0 } else { self.vocab * d }) + if bias { self.vocab } else { 0 }
            }
            Head::MaskedLm => d * d + d + self.norm.params(d) + self.vocab,
            Head::SequenceClassifier { labels } => d * d + d + d * labels + labels,
            Head::TokenClassifier { labels } => d * labels + labels,
            Head::Score { labels } => d * labels,
            Head::Pooler => d * d + d,
            Head::None => 0,
        }
    }

    /// Every parameter, each shared tensor once: what `sum(p.numel() for p in
    /// model.parameters())` gives for the model `transformers` builds from the config.
    pub fn params(&self) -> u64 {
        self.embedding_params()
            + self
                .stacks()
                .map(|s| s.params(self.hidden, self.norm))
                .sum::<u64>()
            + self.head_params()
    }

    /// Parameters each token passes through (mixture of experts: only its routed experts).
    pub fn active_params(&self) -> u64 {
        let d = self.hidden;
        let inactive: u64 = self
            .stacks()
            .filter(|s| s.mlp.experts > 0)
            .map(|s| {
                let idle = s.mlp.experts.saturating_sub(s.mlp.experts_per_token);
                s.layers * idle * s.mlp.one_params(d)
            })
            .sum();
        self.params() - inactive
    }

    /// The 2-D tensors outside the blocks as (rows, columns): the token, position and token-type
    /// tables, an untied LM head, the heads' dense layers.
    pub fn outer_matrices(&self) -> Vec<(u64, u64)> {
        let d = self.hidden;
        let mut m = vec![(self.vocab, d)];
        for rows in [self.positions, self.token_types] {
            if rows > 0 {
                m.push((rows, d));
            }
        }
        match self.head {
            Head::Lm { tied: false, .. } => m.push((self.vocab, d)),
            Head::MaskedLm | Head::Pooler => m.push((d, d)),
            Head::SequenceClassifier { labels } => m.extend([(d, d), (labels, d)]),
            Head::TokenClassifier { labels } | Head::Score { labels } => m.push((labels, d)),
            Head::Lm { .. } | Head::None => {}
        }
        m
    }

    /// Parameters of the blocks' linear layers (the weights quantisation replaces).
    pub fn linear_params(&self) -> u64 {
        self.linears()
            .iter()
            .map(|l| l.layers * l.count * l.fan_in * l.fan_out)
            .sum()
    }

    /// The blocks' linear layers, named as the family names its modules.
    pub fn linears(&self) -> Vec<Linear> {
        let d = self.hidden;
        let mut out = Vec::new();
        for s in self.stacks() {
            let a = s.attention;
            let (q, kv) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
            let i = s.mlp.intermediate;
            let mut push = |name: &str, role: &'static str, fan_in: u64, fan_out: u64, n: u64| {
                out.push(Linear {
                    name: name.to_string(),
                    role,
                    fan_in,
                    fan_out,
                    count: n,
                    layers: s.layers,
                })
            };
            let names = module_names(&self.family, s.mlp.gated);
            match names.fused_qkv {
                Some(n) => push(n, "qkv", d, q + 2 * kv, 1),
                None => {
                    push(names.q, "q", d, q, 1);
                    push(names.k, "k", d, kv, 1);
                    push(names.v, "v", d, kv, 1);
                }
            }
            push(names.o, "o", q, d, 1);
            if s.cross_attention {
                push(names.q, "q", d, q, 1);
                push(names.k, "k", d, kv, 1);
                push(names.v, "v", d, kv, 1);
                push(names.o, "o", q, d, 1);
            }
            let e = s.mlp.experts.max(1);
            if s.mlp.experts > 0 {
                push("gate", "router", d, s.mlp.experts, 1);
            }
            match (s.mlp.gated, names.fused_gate_up) {
                (true, Some(n)) => push(n, "gate_up", d, 2 * i, e),
                (true, None) => {
                    push(names.gate, "gate", d, i, e);
                    push(names.up, "up", d, i, e);
                }
                (false, _) => push(names.up, "up", d, i, e),
            }
            push(names.down, "down", i, d, e);
        }
        out
    }
}

/// How a family names its linear modules (what LoRA's `target_modules` match).
struct ModuleNames {
    q: &'static str,
    k: &'static str,
    v: &'static str,
    fused_qkv: Option<&'static str>,
    o: &'static str,
    gate: &'static str,
    up: &'static str,
    fused_gate_up: Option<&'static str>,
    down: &'static str,
}

fn module_names(family: &str, gated: bool) -> ModuleNames {
    let llama = ModuleNames {
        q: "q_proj",
        k: "k_proj",
        v: "v_proj",
        fused_qkv: None,
        o: "o_proj",
        gate: "gate_proj",
        up: "up_proj",
        fused_gate_up: None,
        down: "down_proj",
    };
    match family {
        "gpt2" => ModuleNames {
            fused_qkv: Some("c_attn"),
            o: "c_proj",
            up: "c_fc",
            down: "c_proj",
            ..llama
        },
        "gpt_neox" => ModuleNames {
            fused_qkv: Some("query_key_value"),
            o: "dense",
            up: "dense_h_to_4h",
            down: "dense_4h_to_h",
            ..llama
        },
        "phi" => ModuleNames {
            o: "dense",
            up: "fc1",
            down: "fc2",
            ..llama
        },
        "phi3" => ModuleNames {
            fused_qkv: Some("qkv_proj"),
            fused_gate_up: Some("gate_up_proj"),
            ..llama
        },
        "mixtral" => ModuleNames {
            gate: "w1",
            up: "w3",
            down: "w2",
            ..llama
        },
        "bert" | "roberta" => ModuleNames {
            q: "query",
            k: "key",
            v: "value",
            o: "dense",
            up: "dense",
            down: "dense",
            ..llama
        },
        "t5" => ModuleNames {
            q: "q",
            k: "k",
            v: "v",
            o: "o",
            gate: "wi_0",
            up: if gated { "wi_1" } else { "wi" },
            down: "wo",
            ..llama
        },
        _ => llama,
    }
}
