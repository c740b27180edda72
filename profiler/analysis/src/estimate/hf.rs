//! Reads a Hugging Face `config.json` (offline, nothing downloaded) into an [`Arch`]: the keys each
//! family's configuration class reads, with the defaults `transformers` gives a missing key, and
//! the head from `architectures[0]`.

use super::arch::{Arch, AttentionShape, Head, MlpShape, Norm, Stack};
use serde_json::Value;

/// The families `--hf-config` knows (the config's `model_type`).
pub const FAMILIES: [&str; 13] = [
    "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "phi3", "mixtral",
    "bert", "roberta", "t5",
];

/// One config, with `transformers`' defaults for missing keys.
struct Config<'a> {
    v: &'a Value,
}

impl Config<'_> {
    fn u(&self, keys: &[&str], default: Option<u64>) -> Result<u64, String> {
        for k in keys {
            match self.v.get(*k) {
                Some(Value::Null) | None => continue,
                Some(x) => {
                    return x
                        .as_u64()
                        .ok_or_else(|| format!("`{k}` is not a non-negative integer: {x}"))
                }
            }
        }
        default.ok_or_else(|| format!("the config has no `{}`", keys.join("` or `")))
    }

    fn b(&self, key: &str, default: bool) -> bool {
        self.v.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    fn s(&self, key: &str, default: &str) -> String {
        self.v
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    }

    /// `num_labels`, else the size of `id2label`, else 2 (`PretrainedConfig`'s default).
    fn labels(&self) -> u64 {
        self.v
            .get("num_labels")
            .and_then(Value::as_u64)
            .or_else(|| {
                self.v
                    .get("id2label")
                    .and_then(Value::as_object)
                    .map(|m| m.len() as u64)
            })
            .unwrap_or(2)
    }
}

/// Parses the text of a `config.json`.
pub fn parse(text: &str) -> Result<Arch, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    from_value(&v)
}

/// Reads a parsed `config.json`.
pub fn from_value(v: &Value) -> Result<Arch, String> {
    let arch = describe(v)?;
    arch.check()?;
    Ok(arch)
}

/// The family's description of a parsed `config.json`, unchecked.
fn describe(v: &Value) -> Result<Arch, String> {
    let c = Config { v };
    let family = c.s("model_type", "");
    let class = v
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_string);
    match family.as_str() {
        "gpt2" => gpt2(&c, class),
        "gpt_neox" => gpt_neox(&c, class),
        "llama" | "mistral" | "qwen2" | "qwen3" | "gemma" | "phi3" | "mixtral" => {
            llama_like(&c, &family, class)
        }
        "phi" => phi(&c, class),
        "bert" | "roberta" => bert(&c, &family, class),
        "t5" => t5(&c, class),
        "" => Err("the config has no `model_type`".into()),
        other => Err(format!(
            "model_type `{other}` is not one this estimator describes: {}",
            FAMILIES.join(", ")
        )),
    }
}

/// The head a causal-LM family's class carries.
fn causal_head(c: &Config, class: &str, tied: bool, bias: bool) -> Result<Head, String> {
    if class.ends_with("ForCausalLM") || class.ends_with("LMHeadModel") {
        Ok(Head::Lm { tied, bias })
    } else if class.ends_with("ForSequenceClassification") {
        Ok(Head::Score { labels: c.labels() })
    } else if class.ends_with("ForTokenClassification") {
        Ok(Head::TokenClassifier { labels: c.labels() })
    } else if class.ends_with("Model") {
        Ok(Head::None)
    } else {
        Err(format!(
            "class `{class}` is not one this estimator describes"
        ))
    }
}

fn decoder(layers: u64, attention: AttentionShape, mlp: MlpShape, norms: u64) -> Stack {
    Stack {
        layers,
        attention,
        cross_attention: false,
        mlp,
        norms_per_block: norms,
        final_norm: true,
        relative_bias: 0,
    }
}

fn gpt2(c: &Config, class: Option<String>) -> Result<Arch, String> {
    let d = c.u(&["n_embd", "hidden_size"], Some(768))?;
    let heads = c.u(&["n_head", "num_attention_heads"], Some(12))?;
    let class = class.unwrap_or_else(|| "GPT2LMHeadModel".into());
    let attention = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim: d / heads.max(1),
        qkv_bias: true,
        o_bias: true,
        qk_norm: false,
    };
    let mlp = MlpShape {
        intermediate: c.u(&["n_inner"], Some(4 * d))?,
        gated: false,
        bias: true,
        experts: 0,
        experts_per_token: 0,
    };
    Ok(Arch {
        family: "gpt2".into(),
        head: causal_head(c, &class, c.b("tie_word_embeddings", true), false)?,
        class,
        vocab: c.u(&["vocab_size"], Some(50257))?,
        hidden: d,
        positions: c.u(&["n_positions", "max_position_embeddings"], Some(1024))?,
        token_types: 0,
        embedding_norm: false,
        norm: Norm::LayerNorm,
        encoder: None,
        decoder: Some(decoder(
            c.u(&["n_layer", "num_hidden_layers"], Some(12))?,
            attention,
            mlp,
            2,
        )),
        causal: true,
        activation: c.s("activation_function", "gelu_new"),
    })
}

fn gpt_neox(c: &Config, class: Option<String>) -> Result<Arch, String> {
    let d = c.u(&["hidden_size"], Some(6144))?;
    let heads = c.u(&["num_attention_heads"], Some(64))?;
    let bias = c.b("attention_bias", true);
    let class = class.unwrap_or_else(|| "GPTNeoXForCausalLM".into());
    let attention = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim: d / heads.max(1),
        qkv_bias: bias,
        o_bias: bias,
        qk_norm: false,
    };
    let mlp = MlpShape {
        intermediate: c.u(&["intermediate_size"], Some(24576))?,
        gated: false,
        bias: true,
        experts: 0,
        experts_per_token: 0,
    };
    Ok(Arch {
        family: "gpt_neox".into(),
        head: causal_head(c, &class, c.b("tie_word_embeddings", false), false)?,
        class,
        vocab: c.u(&["vocab_size"], Some(50432))?,
        hidden: d,
        positions: 0,
        token_types: 0,
        embedding_norm: false,
        norm: Norm::LayerNorm,
        encoder: None,
        decoder: Some(decoder(
            c.u(&["num_hidden_layers"], Some(44))?,
            attention,
            mlp,
            2,
        )),
        causal: true,
        activation: c.s("hidden_act", "gelu"),
    })
}

/// Llama and its descendants: RoPE, RMSNorm, a gated MLP, grouped KV heads; per family the
/// defaults of its configuration class and where it has biases.
fn llama_like(c: &Config, family: &str, class: Option<String>) -> Result<Arch, String> {
    // (vocab, hidden, intermediate, layers, heads, kv heads, tied, qkv bias, o bias)
    let (vocab, d, i, l, h, kv, tied) = match family {
        "mistral" => (32000, 4096, 14336, 32, 32, Some(8), false),
        "mixtral" => (32000, 4096, 14336, 32, 32, Some(8), false),
        "qwen2" => (151936, 4096, 22016, 32, 32, Some(32), false),
        "qwen3" => (151936, 4096, 22016, 32, 32, Some(32), false),
        "gemma" => (256000, 3072, 24576, 28, 16, Some(16), true),
        "phi3" => (32064, 3072, 8192, 32, 32, None, false),
        _ => (32000, 4096, 11008, 32, 32, None, false),
    };
    let d = c.u(&["hidden_size"], Some(d))?;
    let heads = c.u(&["num_attention_heads"], Some(h))?;
    let kv_heads = c.u(&["num_key_value_heads"], kv.or(Some(heads)))?;
    let head_dim = c.u(
        &["head_dim"],
        Some(if family == "gemma" {
            256
        } else {
            d / heads.max(1)
        }),
    )?;
    let (qkv_bias, o_bias, mlp_bias) = match family {
        "llama" => {
            let b = c.b("attention_bias", false);
            (b, b, c.b("mlp_bias", false))
        }
        "qwen2" => (true, false, false),
        "qwen3" | "gemma" => {
            let b = c.b("attention_bias", false);
            (b, b, false)
        }
        _ => (false, false, false),
    };
    let class = class.unwrap_or_else(|| "LlamaForCausalLM".into());
    let moe = family == "mixtral";
    let attention = AttentionShape {
        heads,
        kv_heads,
        head_dim,
        qkv_bias,
        o_bias,
        qk_norm: family == "qwen3",
    };
    let mlp = MlpShape {
        intermediate: c.u(&["intermediate_size"], Some(i))?,
        gated: true,
        bias: mlp_bias,
        experts: if moe {
            match c.u(&["num_local_experts"], Some(8))? {
                0 => {
                    return Err(
                        "`num_local_experts` is 0: a mixture of experts needs at least 1".into(),
                    )
                }
                n => n,
            }
        } else {
            0
        },
        experts_per_token: if moe {
            c.u(&["num_experts_per_tok"], Some(2))?
        } else {
            0
        },
    };
    Ok(Arch {
        family: family.into(),
        head: causal_head(c, &class, c.b("tie_word_embeddings", tied), false)?,
        class,
        vocab: c.u(&["vocab_size"], Some(vocab))?,
        hidden: d,
        positions: 0,
        token_types: 0,
        embedding_norm: false,
        norm: Norm::RmsNorm,
        encoder: None,
        decoder: Some(decoder(
            c.u(&["num_hidden_layers"], Some(l))?,
            attention,
            mlp,
            2,
        )),
        causal: true,
        activation: c.s("hidden_act", "silu"),
    })
}

/// Phi-1/1.5/2: a parallel block under one LayerNorm, biases everywhere, a biased LM head.
fn phi(c: &Config, class: Option<String>) -> Result<Arch, String> {
    let d = c.u(&["hidden_size"], Some(2048))?;
    let heads = c.u(&["num_attention_heads"], Some(32))?;
    let class = class.unwrap_or_else(|| "PhiForCausalLM".into());
    let attention = AttentionShape {
        heads,
        kv_heads: c.u(&["num_key_value_heads"], Some(heads))?,
        head_dim: d / heads.max(1),
        qkv_bias: true,
        o_bias: true,
        qk_norm: c.b("qk_layernorm", false),
    };
    let mlp = MlpShape {
        intermediate: c.u(&["intermediate_size"], Some(8192))?,
        gated: false,
        bias: true,
        experts: 0,
        experts_per_token: 0,
    };
    Ok(Arch {
        family: "phi".into(),
        head: causal_head(c, &class, c.b("tie_word_embeddings", false), true)?,
        class,
        vocab: c.u(&["vocab_size"], Some(51200))?,
        hidden: d,
        positions: 0,
        token_types: 0,
        embedding_norm: false,
        norm: Norm::LayerNorm,
        encoder: None,
        decoder: Some(decoder(
            c.u(&["num_hidden_layers"], Some(24))?,
            attention,
            mlp,
            1,
        )),
        causal: true,
        activation: c.s("hidden_act", "gelu_new"),
    })
}

/// BERT and RoBERTa: learned positions and token types, post-LayerNorm blocks with biases.
fn bert(c: &Config, family: &str, class: Option<String>) -> Result<Arch, String> {
    let d = c.u(&["hidden_size"], Some(768))?;
    let heads = c.u(&["num_attention_heads"], Some(12))?;
    let class = class.unwrap_or_else(|| "BertModel".into());
    let head = if class.ends_with("ForMaskedLM") {
        Head::MaskedLm
    } else if class.ends_with("ForSequenceClassification") {
        Head::SequenceClassifier { labels: c.labels() }
    } else if class.ends_with("ForTokenClassification") {
        Head::TokenClassifier { labels: c.labels() }
    } else if class.ends_with("ForQuestionAnswering") {
        Head::TokenClassifier { labels: 2 }
    } else if class.ends_with("Model") {
        Head::Pooler
    } else {
        return Err(format!(
            "class `{class}` is not one this estimator describes"
        ));
    };
    let attention = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim: d / heads.max(1),
        qkv_bias: true,
        o_bias: true,
        qk_norm: false,
    };
    let mlp = MlpShape {
        intermediate: c.u(&["intermediate_size"], Some(3072))?,
        gated: false,
        bias: true,
        experts: 0,
        experts_per_token: 0,
    };
    Ok(Arch {
        family: family.into(),
        class,
        vocab: c.u(
            &["vocab_size"],
            Some(if family == "bert" { 30522 } else { 50265 }),
        )?,
        hidden: d,
        positions: c.u(&["max_position_embeddings"], Some(512))?,
        token_types: c.u(&["type_vocab_size"], Some(2))?,
        embedding_norm: true,
        norm: Norm::LayerNorm,
        encoder: Some(Stack {
            final_norm: false,
            ..decoder(c.u(&["num_hidden_layers"], Some(12))?, attention, mlp, 2)
        }),
        decoder: None,
        head,
        causal: false,
        activation: c.s("hidden_act", "gelu"),
    })
}

/// T5 (v1.0: ReLU; v1.1, Flan: gated GELU): relative position bias in each stack's
/// first block, RMS-style norms, no biases.
fn t5(c: &Config, class: Option<String>) -> Result<Arch, String> {
    let d = c.u(&["d_model"], Some(512))?;
    let heads = c.u(&["num_heads"], Some(8))?;
    let layers = c.u(&["num_layers"], Some(6))?;
    let dec_layers = c.u(&["num_decoder_layers"], Some(layers))?;
    let buckets = c.u(&["relative_attention_num_buckets"], Some(32))?;
    let proj = c.s("feed_forward_proj", "relu");
    let class = class.unwrap_or_else(|| "T5ForConditionalGeneration".into());
    let attention = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim: c.u(&["d_kv"], Some(64))?,
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
    };
    let mlp = MlpShape {
        intermediate: c.u(&["d_ff"], Some(2048))?,
        gated: proj.starts_with("gated-"),
        bias: false,
        experts: 0,
        experts_per_token: 0,
    };
    let encoder = Stack {
        relative_bias: buckets * heads,
        ..decoder(layers, attention, mlp, 2)
    };
    let head = if class.ends_with("ForConditionalGeneration") {
        // transformers 5 always ties T5's head (`tie_word_embeddings: false` now only turns
        // off the decoder output's scaling; `T5Config.__init__`).
        Head::Lm {
            tied: true,
            bias: false,
        }
    } else if class == "T5EncoderModel" || class.ends_with("Model") {
        Head::None
    } else {
        return Err(format!(
            "class `{class}` is not one this estimator describes"
        ));
    };
    let with_decoder = class != "T5EncoderModel";
    Ok(Arch {
        family: "t5".into(),
        class,
        vocab: c.u(&["vocab_size"], Some(32128))?,
        hidden: d,
        positions: 0,
        token_types: 0,
        embedding_norm: false,
        norm: Norm::RmsNorm,
        encoder: Some(encoder),
        decoder: with_decoder.then_some(Stack {
            layers: dec_layers,
            cross_attention: true,
            norms_per_block: 3,
            ..encoder
        }),
        head,
        causal: false,
        activation: proj,
    })
}
