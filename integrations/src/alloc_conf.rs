//! The CUDA caching allocator's configuration: read PYTORCH_ALLOC_CONF (torch ≥ 2.9) or the older
//! PYTORCH_CUDA_ALLOC_CONF, report it, and set options such as `expandable_segments` before CUDA
//! initialises (the allocator reads the variable once, at its first use).

/// The variables libtorch reads, newest first.
pub const VARS: [&str; 2] = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];

/// The effective allocator configuration: (variable, value), if one is set.
pub fn read() -> Option<(&'static str, String)> {
    VARS.iter()
        .find_map(|v| std::env::var(v).ok().map(|val| (*v, val)))
        .filter(|(_, v)| !v.trim().is_empty())
}

/// The value of one option (`expandable_segments`) in a configuration string.
pub fn option(conf: &str, key: &str) -> Option<String> {
    conf.split(',').find_map(|kv| {
        let (k, v) = kv.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// `conf` with `key` set to `value` (replaced if present, appended otherwise).
pub fn with_option(conf: &str, key: &str, value: &str) -> String {
    let mut parts: Vec<String> = conf
        .split(',')
        .map(str::trim)
        .filter(|kv| !kv.is_empty())
        .filter(|kv| kv.split(':').next().map(str::trim) != Some(key))
        .map(String::from)
        .collect();
    parts.push(format!("{key}:{value}"));
    parts.join(",")
}

/// Sets `expandable_segments` in the effective variable. Must run before the first CUDA
/// allocation (and before other threads read the environment); returns the new value.
pub fn set_expandable_segments(on: bool) -> String {
    let (var, cur) = read().unwrap_or((VARS[0], String::new()));
    let new = with_option(
        &cur,
        "expandable_segments",
        if on { "True" } else { "False" },
    );
    std::env::set_var(var, &new);
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_options_without_losing_others() {
        let c = "max_split_size_mb:128,expandable_segments:False";
        assert_eq!(option(c, "expandable_segments").as_deref(), Some("False"));
        assert_eq!(
            with_option(c, "expandable_segments", "True"),
            "max_split_size_mb:128,expandable_segments:True"
        );
        assert_eq!(
            with_option("", "expandable_segments", "True"),
            "expandable_segments:True"
        );
        assert_eq!(option(c, "garbage_collection_threshold"), None);
    }
}
