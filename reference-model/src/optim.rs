//! nanoGPT's optimizer extras around libtorch's AdamW: the learning rate with linear warm-up and
//! cosine decay, gradient clipping by the global norm, and decoupled weight decay for the matmul
//! weights only (biases, LayerNorm and the embeddings are not decayed).

use serde::{Deserialize, Serialize};
use tch::Tensor;

/// How the learning rate changes after the warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The learning rate stays at --lr.
    #[default]
    Constant,
    /// Cosine decay from --lr to --min-lr at the last step (nanoGPT's).
    Cosine,
}

/// The learning-rate schedule of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Learning rate at the end of a cosine decay.
    pub min_lr: f64,
    /// Steps of linear warm-up.
    pub warmup: u64,
    /// Steps of the whole run (the decay ends at the last).
    pub steps: u64,
    /// What follows the warm-up.
    pub schedule: Schedule,
}

impl LrSchedule {
    /// The learning rate of step `it` (from 0): `lr·(it+1)/(warmup+1)` during the warm-up, then
    /// `lr`, or the cosine from `lr` down to `min_lr` reached at the last step.
    pub fn at(&self, it: u64) -> f64 {
        if it < self.warmup {
            return self.lr * (it + 1) as f64 / (self.warmup + 1) as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = self.steps.saturating_sub(self.warmup + 1).max(1);
                let t = ((it - self.warmup) as f64 / span as f64).min(1.0);
                let coeff = 0.5 * (1.0 + (std::f64::consts::PI * t).cos());
                self.min_lr + coeff * (self.lr - self.min_lr)
            }
        }
    }
}

/// Whether AdamW decays the parameter named `name` (a VarStore path): the matmul weights
/// (`h.0.attn.c_attn.weight`, LoRA's `lora_a`/`lora_b`) are decayed; biases, LayerNorm
/// (`ln_1`, `ln_2`, `ln_f`) and the embeddings (`wte`, `wpe`) are not.
pub fn decays(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    match last {
        "lora_a" | "lora_b" => true,
        "weight" => !name.split('.').any(|part| part.starts_with("ln_")),
        _ => false,
    }
}

/// The trainable variables of `vs` that AdamW decays, by [`decays`].
pub fn decayed(vs: &tch::nn::VarStore) -> Vec<Tensor> {
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(name, t)| t.requires_grad() && decays(name))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named.into_iter().map(|(_, t)| t).collect()
}

/// Decoupled weight decay (AdamW's `p ← p·(1 − lr·wd)`), applied before the optimizer's step to
/// the decayed parameters only; the optimizer itself runs with no decay.
pub fn apply_weight_decay(params: &[Tensor], lr: f64, wd: f64) {
    if wd <= 0.0 {
        return;
    }
    tch::no_grad(|| {
        for p in params {
            let mut p = p.shallow_clone();
            let _ = p.g_mul_scalar_(1.0 - lr * wd);
        }
    });
}

/// Scales the gradients of `params` so that their global L2 norm is at most `max`; returns the
/// norm before clipping (what nanoGPT logs). Parameters without a gradient are skipped.
pub fn clip_grad_norm(params: &[Tensor], max: f64) -> f64 {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .collect();
        let total = grads
            .iter()
            .map(|g| {
                g.pow_tensor_scalar(2)
                    .sum(tch::Kind::Double)
                    .double_value(&[])
            })
            .sum::<f64>()
            .sqrt();
        if total > max {
            let scale = max / (total + 1e-6);
            for g in &grads {
                let mut g = g.shallow_clone();
                let _ = g.g_mul_scalar_(scale);
            }
        }
        total
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn sched(schedule: Schedule) -> LrSchedule {
        LrSchedule {
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 10,
            steps: 110,
            schedule,
        }
    }

    #[test]
    fn warm_up_rises_linearly_then_cosine_decays_to_the_minimum_at_the_last_step() {
        let s = sched(Schedule::Cosine);
        assert!((s.at(0) - 1e-3 / 11.0).abs() < 1e-12);
        assert!((s.at(9) - 1e-3 * 10.0 / 11.0).abs() < 1e-12);
        assert!(
            (s.at(10) - 1e-3).abs() < 1e-12,
            "the peak right after warm-up"
        );
        let mid = s.at(10 + 99 / 2);
        assert!(
            (mid - 5.5e-4).abs() < 1e-5,
            "halfway: the mean of lr and min_lr, got {mid}"
        );
        assert!((s.at(109) - 1e-4).abs() < 1e-12, "the last step: min_lr");
        for it in 10..109 {
            assert!(s.at(it + 1) <= s.at(it), "decay is monotonic at {it}");
        }
        for it in 0..10 {
            assert!(s.at(it + 1) > s.at(it), "warm-up rises at {it}");
        }
    }

    #[test]
    fn constant_schedule_keeps_the_rate_after_warm_up() {
        let s = sched(Schedule::Constant);
        assert!(s.at(5) < 1e-3);
        assert_eq!(s.at(10), 1e-3);
        assert_eq!(s.at(109), 1e-3);
    }

    #[test]
    fn only_matmul_weights_decay() {
        for name in [
            "h.0.attn.c_attn.weight",
            "h.3.mlp.c_proj.weight",
            "h.1.attn.c_proj.lora_a",
            "h.1.mlp.c_fc.lora_b",
        ] {
            assert!(decays(name), "{name}");
        }
        for name in [
            "wte",
            "wpe",
            "ln_f.weight",
            "h.0.ln_1.weight",
            "h.0.ln_2.bias",
            "h.0.attn.c_attn.bias",
        ] {
            assert!(!decays(name), "{name}");
        }
    }

    #[test]
    fn the_models_decay_group_is_its_projection_weights() {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let shape = crate::config::Preset::Tiny.shape();
        let _m = crate::model::Gpt::new(&vs.root(), None, 0, shape, None);
        let decayed: i64 = decayed(&vs).iter().map(|t| t.numel() as i64).sum();
        let d = shape.n_embd;
        assert_eq!(decayed, shape.n_layer * 12 * d * d);
    }

    #[test]
    fn weight_decay_shrinks_decayed_parameters_only() {
        let w = Tensor::ones([3, 3], (Kind::Float, Device::Cpu));
        apply_weight_decay(std::slice::from_ref(&w), 0.5, 0.1);
        assert!((w.double_value(&[0, 0]) - 0.95).abs() < 1e-6);
        apply_weight_decay(std::slice::from_ref(&w), 0.5, 0.0);
        assert!((w.double_value(&[0, 0]) - 0.95).abs() < 1e-6);
    }

    #[test]
    fn clipping_bounds_the_global_norm_and_keeps_the_direction() {
        let a = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let loss = (&a * Tensor::from_slice(&[3.0f32, 0.0])).sum(Kind::Float)
            + (&b * Tensor::from_slice(&[4.0f32])).sum(Kind::Float);
        loss.backward();
        let before = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 1.0);
        assert!((before - 5.0).abs() < 1e-6);
        assert!((a.grad().double_value(&[0]) - 0.6).abs() < 1e-5);
        assert!((b.grad().double_value(&[0]) - 0.8).abs() < 1e-5);
        let after = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 10.0);
        assert!(
            (after - 1.0).abs() < 1e-5,
            "already under the bound: unchanged"
        );
    }
}
