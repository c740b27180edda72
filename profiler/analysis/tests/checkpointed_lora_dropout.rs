//! Full checkpointing keeps each block's input only: LoRA's dropped copies and masks, made inside
//! the block's linears, are made again with the block in backward, not kept for every block
//! (break-it pass 4: Llama-2-13B, q/k/v LoRA with dropout, 2 × 8192 tokens kept 35 GiB where the
//! block inputs are 6.9 GiB).

use memsight_analysis::estimate::hf;
use memsight_analysis::estimate::lora::{Lora, Targets};
use memsight_analysis::estimate::recipe::{Checkpointing, Precision, Recipe};
use memsight_analysis::estimate::train::{self, ArchEstimate};

fn term(e: &ArchEstimate, prefix: &str) -> u64 {
    e.terms
        .iter()
        .find(|t| t.name.starts_with(prefix))
        .map(|t| t.bytes)
        .unwrap()
}

#[test]
fn checkpointed_blocks_keep_no_lora_dropout_copies() {
    let a = hf::parse(
        r#"{"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":5120,
            "intermediate_size":13824,"num_hidden_layers":40,"num_attention_heads":40,
            "vocab_size":32000}"#,
    )
    .unwrap();
    let mut r = Recipe::new(8192);
    r.batch = 2;
    r.precision = Precision::Bf16;
    r.lora = Some(Lora {
        rank: 8,
        targets: Targets::Named(vec!["q_proj".into(), "k_proj".into(), "v_proj".into()]),
        dora: false,
    });
    r.checkpointing = Checkpointing::Full;
    let plain = train::estimate(&a, &r);
    r.lora_dropout = true;
    let dropout = train::estimate(&a, &r);
    // Kept across the step: the same block inputs with or without dropout.
    assert_eq!(
        term(&dropout, "activations kept"),
        term(&plain, "activations kept")
    );
    // One block's dropped copies (3 modules, bf16 copy + 1-byte mask of 2 · 8192 · 5120) are
    // in the block recomputed in backward, so the peak grows by at most those.
    let block = 3 * 3 * 2 * 8192 * 5120u64;
    let (p, d) = (plain.figures.allocated, dropout.figures.allocated);
    assert!(d >= p && d - p <= block, "{p} → {d}");
    // Without checkpointing every block keeps its copies (in place of the wrapped linears' own
    // inputs): at least the 1-byte masks more, in all 40 blocks.
    r.checkpointing = Checkpointing::None;
    let eager = train::estimate(&a, &r);
    r.lora_dropout = false;
    let eager_plain = train::estimate(&a, &r);
    let masks = 40 * 3 * 2 * 8192 * 5120u64;
    assert!(term(&eager, "activations kept") >= term(&eager_plain, "activations kept") + masks);
}

/// peft's `prepare_model_for_kbit_training` leaves embeddings and norms in fp32, so the residual
/// stream — what each checkpointed block keeps — is fp32: 4 bytes per hidden element, twice the
/// bf16 stream of the same QLoRA run without it (break-it pass 4: QLoRA rows 13–37% low).
#[test]
fn kbit_preparation_makes_the_checkpointed_stream_fp32() {
    use memsight_analysis::estimate::recipe::Quant;
    let a = hf::parse(
        r#"{"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":4096,
            "intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,
            "vocab_size":32000}"#,
    )
    .unwrap();
    let mut r = Recipe::new(4096);
    r.precision = Precision::Bf16;
    r.quant = Quant::Nf4 { double_quant: true };
    r.lora = Some(Lora {
        rank: 8,
        targets: Targets::QueryValue,
        dora: false,
    });
    r.checkpointing = Checkpointing::Full;
    let bf16 = term(&train::estimate(&a, &r), "activations kept");
    r.kbit_fp32_rest = true;
    let fp32 = term(&train::estimate(&a, &r), "activations kept");
    // 32 block inputs and the embedding's output, 4096 tokens × 4096 features, 2 bytes more each.
    let stream = 33 * 4096 * 4096u64;
    assert_eq!(fp32 - bf16, 2 * stream, "{bf16} → {fp32}");
}
