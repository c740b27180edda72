//! `--hf-config`: for every tiny config in `tests/fixtures/hf-configs`, the parameter count equals
//! what `transformers` builds from it, and LoRA/DoRA's trainable counts equal what `peft` gives
//! (the numbers in `params.json`, made by `scripts/hf-param-counts.py`; no Python needed here).

use memsight_analysis::estimate::hf;
use memsight_analysis::estimate::lora::{Lora, Targets};
use std::path::Path;

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-configs")
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("params.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Fixtures whose `all-linear` count peft makes differently from its documented rule: peft
/// 0.21.2 wraps Mixtral's fused 3-D expert tensors with `ParamWrapper`, nesting the gate/up
/// wrapper inside the down wrapper, and that nested wrapper gets rank 2·r·E, not r·E.
const PEFT_EXPERT_QUIRK: [&str; 1] = ["mixtral"];

#[test]
fn every_family_counts_exactly_what_transformers_and_peft_build() {
    let want = expected();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (name, row) in want.as_object().unwrap() {
        if name.starts_with('_') {
            continue;
        }
        let text = std::fs::read_to_string(fixtures().join(format!("{name}.json"))).unwrap();
        let arch = hf::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut check = |what: &str, got: u64, key: &str| {
            let Some(w) = row[key].as_u64() else { return };
            rows.push(format!("{name:<18}{what:<20}{w:>10}{got:>10}"));
            if got != w {
                failures.push(format!(
                    "{name} {what}: transformers/peft {w}, memsight {got}"
                ));
            }
        };
        check("params", arch.params(), "params");
        let lora = |targets, dora| Lora {
            rank: 8,
            targets,
            dora,
        };
        check(
            "lora r8 q/v",
            lora(Targets::QueryValue, false).params(&arch),
            "lora_r8_qv",
        );
        if !PEFT_EXPERT_QUIRK.contains(&name.as_str()) {
            check(
                "lora r8 all-linear",
                lora(Targets::AllLinear, false).params(&arch),
                "lora_r8_all_linear",
            );
            check(
                "dora r8 all-linear",
                lora(Targets::AllLinear, true).params(&arch),
                "dora_r8_all_linear",
            );
        }
    }
    println!(
        "{:<18}{:<20}{:>10}{:>10}",
        "fixture", "count", "reference", "memsight"
    );
    for r in &rows {
        println!("{r}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rows.len() >= 80, "{} rows checked", rows.len());
}
