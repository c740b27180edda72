//! `hf::parse` refuses a config `transformers` could not build, or one too large to size in 64
//! bits, with a reason naming the field, rather than sizing it with zeros or wrapped arithmetic
//! (break-it pass 4).

use memsight_analysis::estimate::hf;

/// A Llama-shaped config with `extra` keys added or overriding.
fn llama(extra: &str) -> String {
    let base = r#""architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":32000,
        "hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32"#;
    if extra.is_empty() {
        format!("{{{base}}}")
    } else {
        format!("{{{base},{extra}}}")
    }
}

fn refused(text: &str) -> String {
    match hf::parse(text) {
        Ok(a) => panic!("accepted, {} params: {text}", a.params()),
        Err(e) => e,
    }
}

#[test]
fn a_size_of_zero_is_refused_with_its_field() {
    for key in [
        "hidden_size",
        "vocab_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
    ] {
        let e = refused(&llama(&format!(r#""{key}":0"#)));
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn query_heads_must_be_a_multiple_of_the_key_value_heads() {
    let e = refused(&llama(r#""num_key_value_heads":5"#));
    assert!(
        e.contains("32 attention heads") && e.contains("5 key/value"),
        "{e}"
    );
    assert!(hf::parse(&llama(r#""num_key_value_heads":8"#)).is_ok());
}

#[test]
fn a_mixture_of_experts_routes_to_one_to_all_of_its_experts() {
    let moe = |experts: u64, k: u64| {
        format!(
            r#"{{"architectures":["MixtralForCausalLM"],"model_type":"mixtral","num_local_experts":{experts},"num_experts_per_tok":{k}}}"#
        )
    };
    assert!(refused(&moe(0, 2)).contains("num_local_experts"));
    assert!(refused(&moe(8, 9)).contains("9 of 8 experts"));
    assert!(refused(&moe(8, 0)).contains("0 of 8 experts"));
    assert!(hf::parse(&moe(8, 8)).is_ok());
}

#[test]
fn sizes_whose_parameters_would_wrap_64_bits_are_refused() {
    // 1e8 layers of hidden 1e8: about 1.6e25 parameters; u64 arithmetic wrapped it to 1.4e19.
    let e = refused(
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":100000000,
            "hidden_size":100000000,"intermediate_size":100000000,"num_hidden_layers":100000000,
            "num_attention_heads":1,"num_key_value_heads":1}"#,
    );
    assert!(e.contains("parameters"), "{e}");
    // The largest JSON integer in every field: refused, no overflow panic in a debug build.
    let m = u64::MAX;
    assert!(!refused(&llama(&format!(
        r#""hidden_size":{m},"num_hidden_layers":{m}"#
    )))
    .is_empty());
}

#[test]
fn a_trillion_parameter_config_is_sized_exactly() {
    // 128 blocks, hidden 25600, 200 heads over 8 KV heads, MLP 102400, vocabulary 256000.
    let a = hf::parse(
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":256000,
            "hidden_size":25600,"intermediate_size":102400,"num_hidden_layers":128,
            "num_attention_heads":200,"num_key_value_heads":8}"#,
    )
    .unwrap();
    let (d, i, v, l, kv) = (25_600u64, 102_400u64, 256_000u64, 128u64, 8 * 128u64);
    let block = 2 * d * d + 2 * d * kv + 3 * d * i + 2 * d;
    assert_eq!(a.params(), 2 * v * d + l * block + d);
}
