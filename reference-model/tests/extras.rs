//! nanoGPT's extras as a user meets them in a run: resuming a saved run goes on from its weights,
//! batches and learning-rate schedule; a pretrained base loads under LoRA adapters; a checkpoint
//! of another shape is refused with the reason; gradient clipping reports the norm it clipped.

use memsight_gpt::config::{Config, Preset};
use memsight_gpt::optim::Schedule;
use memsight_gpt::train::{self, RunSummary, Save};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// libtorch's generator is process-wide: runs seeded from it go one at a time.
static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|p| p.into_inner())
}

fn small(steps: u64) -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.steps = steps;
    c.batch_size = 8;
    c.micro_batch = 8;
    c.seq_len = 32;
    c.eval_every = 0;
    c.eval_batches = 1;
    c.lr = 3e-3;
    c
}

fn dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memsight-gpt-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn trained(steps: u64, path: &std::path::Path) -> RunSummary {
    let save = Save {
        path: path.to_path_buf(),
    };
    train::train(&small(steps), Some(&save), false).unwrap()
}

#[test]
fn resume_goes_on_from_the_saved_weights_and_schedule() {
    let _g = rng();
    let d = dir("resume");
    let ckpt = d.join("m.safetensors");
    let mut first = small(20);
    first.lr_schedule = Schedule::Cosine;
    first.warmup_steps = 2;
    let saved = train::train(&first, Some(&Save { path: ckpt.clone() }), false).unwrap();
    let fresh = train::train(&small(1), None, false).unwrap();
    let mut more = first.clone();
    more.steps = 24;
    more.init_from = Some(ckpt.clone());
    more.resume = true;
    let resumed = train::train(&more, None, false).unwrap();
    // Its first step starts from the trained weights, not from a fresh model's loss (~ln 256).
    assert!(
        resumed.first_loss < fresh.first_loss - 0.5,
        "resumed {:.3} vs fresh {:.3} (saved run ended at {:.3})",
        resumed.first_loss,
        fresh.first_loss,
        saved.final_loss
    );
    // The schedule goes on to the new last step: its rate there is --min-lr.
    assert!((resumed.lr - more.min_lr).abs() < 1e-12, "{}", resumed.lr);
    // A run that is already done is refused with the reason.
    more.steps = 20;
    let err = train::train(&more, None, false).unwrap_err();
    assert!(err.contains("has already run 20 steps"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn lora_trains_adapters_on_a_pretrained_base() {
    let _g = rng();
    let d = dir("lora-base");
    let ckpt = d.join("base.safetensors");
    let base = trained(20, &ckpt);
    let mut lora = small(1);
    lora.lora_rank = 4;
    let from_scratch = train::train(&lora, None, false).unwrap();
    lora.init_from = Some(ckpt.clone());
    let on_base = train::train(&lora, None, false).unwrap();
    assert!(
        on_base.first_loss < from_scratch.first_loss - 0.5,
        "on the base {:.3}, on a fresh model {:.3} (the base ended at {:.3})",
        on_base.first_loss,
        from_scratch.first_loss,
        base.final_loss
    );
    // The adapters are what trains: the frozen base's parameters are not counted as trainable.
    assert!(on_base.trainable_params < on_base.params / 10);
    // A checkpoint of another shape is refused, naming both shapes.
    let mut wide = lora.clone();
    wide.shape.vocab_size = 512;
    let err = train::train(&wide, None, false).unwrap_err();
    assert!(err.contains("is not this run's"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn gradient_clipping_reports_the_norm_it_clipped() {
    let _g = rng();
    let mut c = small(2);
    c.grad_clip = 0.01;
    let s = train::train(&c, None, false).unwrap();
    let norm = s.grad_norm.unwrap();
    assert!(
        norm > 0.01,
        "a fresh model's gradient norm is above 0.01: {norm}"
    );
    c.grad_clip = 0.0;
    assert!(train::train(&c, None, false).unwrap().grad_norm.is_none());
}
