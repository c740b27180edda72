//! The subcommands of `memsight-gpt` (the binary only parses and dispatches): their flags and
//! bodies — train under a memsight session, ablate, generate, analyze.

use crate::ablate;
use crate::cli::TrainArgs;
use crate::config::{Config, Preset};
use crate::train::{self, Save};
use clap::Args;
use std::path::PathBuf;

/// `memsight-gpt analyze`'s flags.
#[derive(Args)]
pub struct AnalyzeArgs {
    /// A checkpoint written by `train --save`.
    #[arg(long, value_name = "PATH.safetensors")]
    load: PathBuf,
    /// Blocks to load (embeddings and final norm always): 1 = first-layer-only.
    #[arg(long, default_value_t = 1)]
    layers: i64,
    /// Heads per chunk when computing maps.
    #[arg(long, default_value_t = 1)]
    head_chunk: i64,
    /// Sampling mode: maps for this many evenly spaced query rows only (0: all rows).
    #[arg(long, default_value_t = 0)]
    sample_rows: i64,
    /// Text to analyze (its first block-size bytes).
    #[arg(
        long,
        default_value = "The borrow checker compares scopes to determine whether all borrows are valid."
    )]
    text: String,
    /// Where the heatmaps go.
    #[arg(long, default_value = "out/attention")]
    out: PathBuf,
    /// Load the whole checkpoint the usual way (`VarStore::load`: the file read, every tensor
    /// copied out) instead of only the first --layers blocks: what first-layer loading saves.
    #[arg(long)]
    whole: bool,
    /// Write a memsight report (phases `load` and `maps`); under `memsight run` it goes where
    /// `run` says.
    #[arg(long)]
    report: Option<PathBuf>,
}

/// First-layer-only loading, then head-chunked maps or sampled rows as heatmaps.
pub fn analyze(a: AnalyzeArgs) -> Result<(), String> {
    use crate::analyze;
    use memsight::devices::tensors;
    use memsight::units::fmt_bytes;
    let cfg = Config::load_beside(&a.load)?;
    memsight_integrations::install();
    let mut builder = memsight::Session::builder().quiet();
    if let Some(p) = &a.report {
        builder = builder.report_path(p);
    }
    let session = builder.start().map_err(|e| e.to_string())?;
    let layers = if a.whole {
        cfg.shape.n_layer
    } else {
        a.layers.clamp(1, cfg.shape.n_layer)
    };
    memsight::reset_peak();
    tensors::reset_peak();
    let heap0 = memsight::stats().live_bytes;
    let (_vs, model, bytes) = {
        let _p = memsight::phase("load");
        if a.whole {
            let (vs, m) = analyze::load_whole(&a.load, cfg.shape)?;
            let bytes = vs
                .variables()
                .values()
                .map(|t| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64)
                .sum();
            (vs, m, bytes)
        } else {
            analyze::load_first_layers(&a.load, cfg.shape, layers)?
        }
    };
    eprintln!(
        "loaded {layers} of {} blocks{}: {} of parameters read; loading peak: heap {} (tensors {})",
        cfg.shape.n_layer,
        if a.whole { " (whole checkpoint)" } else { "" },
        fmt_bytes(bytes as u64),
        fmt_bytes(memsight::stats().peak_bytes.saturating_sub(heap0)),
        fmt_bytes(tensors::stats().unwrap_or_default().peak_bytes)
    );
    let tokens: Vec<i64> = crate::data::encode(&a.text)
        .iter()
        .take(cfg.shape.block_size as usize)
        .map(|&b| b as i64)
        .collect();
    let idx = tch::Tensor::from_slice(&tokens).view([1, -1]);
    let last = (layers - 1) as usize;
    tensors::reset_peak();
    let live = tensors::stats().unwrap_or_default().live_bytes;
    let maps_phase = memsight::phase("maps");
    let (what, files) = if a.sample_rows > 0 {
        // Sampling mode: only the sampled rows' scores exist; the full maps are never built.
        let (sampled, picks) = analyze::sampled_maps(&model, &idx, last, a.sample_rows);
        let files = analyze::write_heatmaps(&sampled, last, &a.out)?;
        (
            format!(
                "sampling mode: {} of {} query rows",
                picks.len(),
                tokens.len()
            ),
            files,
        )
    } else {
        let files = analyze::write_map_chunks(&model, &idx, last, a.head_chunk, &a.out)?;
        (format!("maps in chunks of {} heads", a.head_chunk), files)
    };
    drop(maps_phase);
    let peak = tensors::stats().unwrap_or_default().peak_bytes;
    eprintln!(
        "layer {last}: {what}: tensor peak above the model {}; {} heatmaps in {}",
        fmt_bytes(peak.saturating_sub(live)),
        files.len(),
        a.out.display()
    );
    session.finish().map_err(|e| e.to_string())?;
    Ok(())
}

/// `memsight-gpt generate`'s flags.
#[derive(Args)]
pub struct GenerateArgs {
    /// A checkpoint written by `train --save` (its .config.json gives the shape).
    #[arg(long, value_name = "PATH.safetensors")]
    load: Option<PathBuf>,
    /// Shape of a fresh (untrained) model when no checkpoint is given.
    #[arg(long, value_enum, default_value = "tiny")]
    preset: Preset,
    /// The prompt.
    #[arg(long, default_value = "fn main() {")]
    prompt: String,
    /// Tokens to generate (stops at the block size).
    #[arg(long, default_value_t = 64)]
    tokens: i64,
    /// How past keys and values are kept.
    #[arg(long, value_enum, default_value = "prealloc")]
    kv_cache: crate::generate::CacheMode,
    /// Sampling temperature (0: greedy, the most likely token each time).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample among the K most likely tokens only (0: all; with --temperature).
    #[arg(long, value_name = "K", default_value_t = 0)]
    top_k: i64,
    /// Seed of the sampling draws.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Weight-only quantization of the block projections: 8 or 4 bits (libtorch packed kernels).
    #[arg(long, value_name = "BITS")]
    quant: Option<u8>,
    /// Where to write the memsight report.
    #[arg(long, default_value = "memsight-gpt-generate.json")]
    report: PathBuf,
}

/// Greedy generation under memsight with the chosen KV cache (and quantization).
pub fn generate(a: GenerateArgs) -> Result<(), String> {
    use crate::generate;
    use crate::model::Gpt;
    if a.prompt.is_empty() {
        return Err("--prompt must not be empty".into());
    }
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) || a.top_k < 0 {
        return Err("--temperature and --top-k must not be negative".into());
    }
    let sampling = generate::Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
    };
    let shape = match &a.load {
        Some(p) => Config::load_beside(p)?.shape,
        None => a.preset.shape(),
    };
    memsight_integrations::install();
    let session = memsight::Session::builder()
        .report_path(&a.report)
        .quiet()
        .start()
        .map_err(|e| e.to_string())?;
    let mut vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let mut model = Gpt::new(&vs.root(), None, 0, shape, None);
    if let Some(p) = &a.load {
        vs.load(p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let fp32 = memsight::devices::tensors::stats()
        .unwrap_or_default()
        .live_bytes;
    if let Some(bits) = a.quant {
        model.quantize(bits)?;
        // The model keeps what it still uses; the fp32 projection weights go with the store.
        drop(vs);
        let now = memsight::devices::tensors::stats()
            .unwrap_or_default()
            .live_bytes;
        eprintln!(
            "int{bits} weights: tensors {} → {}",
            memsight::units::fmt_bytes(fp32),
            memsight::units::fmt_bytes(now)
        );
    }
    let prompt: Vec<i64> = crate::data::encode(&a.prompt)
        .iter()
        .map(|&b| b as i64)
        .collect();
    memsight::devices::tensors::reset_peak();
    let before = memsight::devices::tensors::stats()
        .unwrap_or_default()
        .live_bytes;
    let g = {
        let _p = memsight::phase("generate");
        tch::manual_seed(a.seed as i64);
        generate::generate_with(&model, &prompt, a.tokens, a.kv_cache, sampling)
    };
    let peak = memsight::devices::tensors::stats()
        .unwrap_or_default()
        .peak_bytes;
    let bytes: Vec<u8> = g.tokens.iter().map(|&t| t as u8).collect();
    println!("{}", crate::data::decode(&bytes));
    let est = crate::generate::estimated_cache_bytes(&shape, g.tokens.len() as i64);
    eprintln!(
        "kv cache ({:?}): {} held at the end (estimator: {}); tensor peak above the weights: {}",
        a.kv_cache,
        memsight::units::fmt_bytes(g.cache_bytes.max(0) as u64),
        memsight::units::fmt_bytes(est),
        memsight::units::fmt_bytes(peak.saturating_sub(before))
    );
    session.finish().map_err(|e| e.to_string())?;
    Ok(())
}

/// `memsight-gpt ablate`'s flags.
#[derive(Args)]
pub struct AblateArgs {
    /// Model shape of every run.
    #[arg(long, value_enum, default_value = "tiny")]
    preset: Preset,
    /// Steps per run.
    #[arg(long, default_value_t = 30)]
    steps: u64,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where ablation.md, ablation.json and ablation.svg go.
    #[arg(long, default_value = "docs/ablation")]
    out: PathBuf,
    /// Also run each training variant in PyTorch (reference-model/peer/gpt.py), under
    /// `memsight run` like memsight-gpt (default python: $VIRTUAL_ENV/bin/python when set).
    #[arg(long)]
    peer: bool,
    /// The python for --peer.
    #[arg(long)]
    python: Option<PathBuf>,
    /// The `memsight` binary every run goes under (`memsight run`; default: the one beside
    /// memsight-gpt).
    #[arg(long, value_name = "PATH")]
    memsight: Option<PathBuf>,
    /// Kill a run that takes longer than this many seconds (it is tried once more).
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    run_limit: u64,
    /// Only measure profiling overhead (memsight on, off, on with heap sampling) in N interleaved
    /// rounds and print it as JSON; the committed tables are left alone.
    #[arg(long, value_name = "N")]
    overhead_only: Option<usize>,
    /// `train` flags for every run, before each variant's (e.g. `-- --block-size 2048
    /// --seq-len 2048 --batch-size 8`).
    #[arg(last = true, value_name = "TRAIN FLAGS")]
    base: Vec<String>,
}

/// The ablation (or only its profiling-overhead rounds).
pub fn ablate(a: AblateArgs) -> Result<(), String> {
    let peer_python = if a.peer {
        Some(a.python.clone().unwrap_or_else(|| {
            std::env::var_os("VIRTUAL_ENV")
                .map(|v| PathBuf::from(v).join("bin/python"))
                .unwrap_or_else(|| PathBuf::from("python3"))
        }))
    } else {
        None
    };
    // The seed-000 measurement runs in this process and reads the tensor hook.
    memsight_integrations::install();
    let opts = ablate::Options {
        preset: a.preset,
        steps: a.steps,
        device: a.device,
        out: a.out,
        peer_python,
        base_args: a.base,
        memsight: a
            .memsight
            .or_else(ablate::memsight_beside_exe)
            .unwrap_or_else(|| PathBuf::from("memsight")),
        run_limit: std::time::Duration::from_secs(a.run_limit.max(1)),
    };
    if let Some(rounds) = a.overhead_only {
        std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
        let over = ablate::overhead(&opts, rounds.max(1))?;
        println!(
            "{}",
            serde_json::to_string_pretty(&over).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    // The command line as the table records it: no machine paths (--memsight, --python).
    let mut line = vec!["memsight-gpt".to_string()];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--memsight" | "--python" => {
                args.next();
            }
            a if a.starts_with("--memsight=") || a.starts_with("--python=") => {}
            _ => line.push(arg),
        }
    }
    let line = line.join(" ");
    ablate::run(&opts, &line)?;
    println!("{}", opts.out.join("ablation.md").display());
    Ok(())
}

/// Training under memsight (or without it, `--no-profile`), then the report's path on stdout.
pub fn train(a: TrainArgs) -> Result<(), String> {
    let cfg = a.config();
    cfg.validate()?;
    cfg.tch_device()?;
    // A checkpoint to start from must be readable before the session (and its report) starts.
    if let Some(p) = &cfg.init_from {
        Config::load_beside(p)?;
    }
    if a.no_profile {
        let summary = train::train(&cfg, a.save.map(|path| Save { path }).as_ref(), !a.quiet)?;
        if let Some(p) = &a.summary_json {
            let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
            std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        return Ok(());
    }
    // Hooks first: tensors created before the CPU hook are not counted.
    let installed = memsight_integrations::install();
    if !a.quiet {
        for line in installed.describe() {
            eprintln!("{line}");
        }
    }
    let mut builder = memsight::Session::builder().report_path(&a.report);
    if a.quiet {
        builder = builder.quiet();
    }
    let session = builder.start().map_err(|e| e.to_string())?;
    // MEMSIGHT_REPORT (set by `memsight run`) overrides --report: print where it really goes.
    let report_path = session
        .report_path()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| a.report.clone());
    let save = a.save.map(|path| Save { path });
    let result = train::train(&cfg, save.as_ref(), !a.quiet);
    let report = session.finish().map_err(|e| e.to_string())?;
    let summary = result?;
    if let Some(p) = &a.summary_json {
        let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if !a.quiet {
        eprintln!(
            "final loss {:.4} · val {} · {:.1} ms/step · tensors peak {}",
            summary.final_loss,
            summary
                .val_loss
                .map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "n/a".into()),
            summary.step_ms_median,
            report
                .peaks
                .tensor_peak_bytes
                .map(memsight::units::fmt_bytes)
                .unwrap_or_else(|| "n/a".into())
        );
    }
    println!("{}", report_path.display());
    Ok(())
}
