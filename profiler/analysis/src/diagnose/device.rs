//! The device's memory when a log states it outside the OOM message: a runtime's device listing
//! (TensorFlow, PyTorch, llama.cpp, nvidia-smi) or a GPU model name with a known memory size.

use super::scan::{compile, size_at, str_at};
use regex::Regex;
use std::sync::LazyLock;

/// Printed device sizes: TensorFlow `totalMemory: 10.92GiB` / `deviceMemorySize: 4.00GiB`, PyTorch
/// `total capacity of 23.69 GiB` / `23.69 GiB total capacity`, nvidia-smi `1234MiB / 24564MiB`.
static STATED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(?:totalMemory|deviceMemorySize|total_gpu_memory|total capac(?:i)?ty of)[:\s(]\s*{SIZE}|{SIZE} total capac(?:i)?ty|[0-9]+MiB\s*/\s*([0-9]+)(MiB)\b",
    )
});

/// TensorFlow's BFC allocator statistics (`Stats:` then `Limit:                  3157432729`, in
/// bytes): the most memory the allocator may hold on its device.
static BFC_LIMIT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?m)^[\t ]*Limit:[\t ]+([0-9]+)[\t ]*\r?$").ok());

/// A person's words for the card's memory: `8gb VRAM`, `GPU with 8gb`, `24GB of GPU memory`.
static SAID: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?i)\b([0-9]{1,3}) ?gb (?:of )?(?:vram|gpu memory|graphics memory)\b|\b(?:gpu|graphics card) with ([0-9]{1,3}) ?gb\b").ok()
});

/// GPU models and their memory in GiB; names as drivers and runtimes print them.
static MODEL: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:NVIDIA |GeForce |Tesla |Quadro |AMD |Radeon )+(RTX 4090|RTX 3090(?: Ti)?|RTX 4080|RTX 3080 Ti|RTX 3080|RTX 4070|RTX 3070|RTX 3060|RTX 4060|RTX 2080 Ti|GTX 1080 Ti|RTX A6000|RTX A5000|RTX A4500|RTX A4000|RTX 6000 Ada|A100[- ](?:SXM4?|PCIE)[- ]80GB|A100[- ](?:SXM4?|PCIE)[- ]40GB|A100 80GB|A100|H100|H200|V100[- ]\w+[- ]32GB|V100|T4|L4|L40S?|A10G?|A40|MI300X|MI250X?|MI210|MI100)\b",
    )
    .ok()
});

/// Memory of a GPU model (GiB) as the first device listing reports it.
fn model_gib(name: &str) -> Option<u128> {
    let n = name.to_ascii_uppercase();
    Some(match n.as_str() {
        "RTX 4090" | "A10" | "A10G" | "L4" | "RTX 3080 TI" | "RTX A5000" => 24,
        "RTX A4500" => 20,
        "RTX A4000" => 16,
        "MI210" => 64,
        "MI100" => 32,
        s if s.starts_with("RTX 3090") => 24,
        "RTX 4080" | "T4" | "V100" => 16,
        "RTX 3080" => 10,
        "RTX 4070" | "RTX 3060" => 12,
        "RTX 3070" | "RTX 4060" => 8,
        "RTX 2080 TI" | "GTX 1080 TI" => 11,
        "RTX A6000" | "RTX 6000 ADA" | "L40" | "L40S" | "A40" => 48,
        "H100" => 80,
        "H200" => 141,
        "MI300X" => 192,
        "MI250" | "MI250X" => 64,
        "A100" => 40,
        s if s.starts_with("A100") && s.contains("80") => 80,
        s if s.starts_with("A100") => 40,
        s if s.starts_with("V100") => 32,
        _ => return None,
    })
}

/// The first device size the log states, else the limit TensorFlow's allocator states, else the
/// memory of the first GPU model it names.
pub fn total_from_log(text: &str) -> Option<u128> {
    if let Some(c) = STATED.as_ref().and_then(|re| re.captures(text)) {
        let stated = size_at(&c, 1)
            .or_else(|| size_at(&c, 3))
            .or_else(|| size_at(&c, 5))
            .and_then(|v| u128::try_from(v).ok());
        if stated.is_some_and(|v| v > 0) {
            return stated;
        }
    }
    if let Some(c) = BFC_LIMIT.as_ref().and_then(|re| re.captures(text)) {
        let limit = str_at(&c, 1).and_then(|v| v.parse::<u128>().ok());
        if limit.is_some_and(|v| v > 0) {
            return limit;
        }
    }
    if let Some(c) = MODEL.as_ref().and_then(|re| re.captures(text)) {
        return model_gib(str_at(&c, 1)?).map(|g| g << 30);
    }
    let c = SAID.as_ref()?.captures(text)?;
    let gib: u128 = str_at(&c, 1).or_else(|| str_at(&c, 2))?.parse().ok()?;
    (gib > 0).then_some(gib << 30)
}

#[cfg(test)]
mod tests {
    use super::total_from_log;

    #[test]
    fn sizes_from_listings_and_model_names() {
        let gib = 1u128 << 30;
        assert_eq!(
            total_from_log("name: Tesla K80 major: 3 minor: 7 memoryClockRate(GHz): 0.8235\ntotalMemory: 11.17GiB freeMemory: 11.10GiB"),
            Some(11993696174)
        );
        assert_eq!(
            total_from_log("|  23028MiB / 24564MiB |"),
            Some(24564 << 20)
        );
        assert_eq!(
            total_from_log("Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9"),
            Some(24 * gib)
        );
        assert_eq!(total_from_log("GPU: NVIDIA A100-SXM4-80GB"), Some(80 * gib));
        assert_eq!(total_from_log("a T4 of paper"), None);
        // tensorflow-27842: the BFC allocator's stats.
        assert_eq!(
            total_from_log("I tensorflow/core/common_runtime/bfc_allocator.cc:686] Stats:\nLimit:                  3157432729\nInUse:                        9984"),
            Some(3157432729)
        );
        assert_eq!(
            total_from_log("Any suggestions appreciated. Nvidia gpu with 8gb."),
            Some(8 * gib)
        );
    }
}
