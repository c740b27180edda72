//! Generation with a KV cache (seed 001's cache management): `prealloc` allocates every layer's
//! keys and values for the whole length up front and writes into them; `grow` concatenates one
//! step's keys and values at a time (each step reallocates: transiently two copies); `none`
//! recomputes the whole sequence for each new token. All three give the same tokens (tested); the
//! memory each holds is measured against the estimator's KV-cache figure.

use crate::model::{Block, Gpt};
use tch::{Kind, Tensor};

/// How keys and values of past positions are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Whole-length buffers allocated once.
    Prealloc,
    /// Concatenated per step.
    Grow,
    /// No cache: the whole prefix is recomputed per token.
    None,
}

/// One layer's cached keys and values, (B, H, len, D).
struct LayerCache {
    k: Tensor,
    v: Tensor,
    len: i64,
}

/// The KV cache of every layer.
pub struct KvCache {
    mode: CacheMode,
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `m`, batch `b`, room for `max_len` positions (prealloc).
    pub fn new(m: &Gpt, mode: CacheMode, b: i64, max_len: i64) -> KvCache {
        let s = m.shape;
        let hd = s.n_embd / s.n_head;
        let dev = m.wte.device();
        let layers = m
            .blocks
            .iter()
            .map(|_| {
                let shape = match mode {
                    CacheMode::Prealloc => [b, s.n_head, max_len, hd],
                    _ => [b, s.n_head, 0, hd],
                };
                LayerCache {
                    k: Tensor::zeros(shape, (Kind::Float, dev)),
                    v: Tensor::zeros(shape, (Kind::Float, dev)),
                    len: 0,
                }
            })
            .collect();
        KvCache { mode, layers }
    }

    /// Bytes the cache's tensors hold now.
    pub fn bytes(&self) -> i64 {
        self.layers
            .iter()
            .map(|l| (l.k.numel() + l.v.numel()) as i64 * 4)
            .sum()
    }
}

fn attend_cached(b: &Block, x: &Tensor, c: &mut LayerCache, mode: CacheMode) -> Tensor {
    let (q, k, v) = b.qkv(x);
    let n = q.size()[2];
    let (keys, values) = match mode {
        CacheMode::Prealloc => {
            c.k.narrow(2, c.len, n).copy_(&k);
            c.v.narrow(2, c.len, n).copy_(&v);
            (c.k.narrow(2, 0, c.len + n), c.v.narrow(2, 0, c.len + n))
        }
        _ => {
            c.k = Tensor::cat(&[&c.k, &k], 2);
            c.v = Tensor::cat(&[&c.v, &v], 2);
            (c.k.shallow_clone(), c.v.shallow_clone())
        }
    };
    c.len += n;
    // Prefill (the cache was empty) is causal among the new tokens; a one-token step sees all.
    let causal = c.len == n && n > 1;
    let o = Tensor::scaled_dot_product_attention(
        &q,
        &keys,
        &values,
        None::<Tensor>,
        0.0,
        causal,
        None,
        false,
    );
    b.finish(x, &o)
}

/// Logits of the next token after `idx` (B, S) — through the cache when there is one.
fn next_logits(m: &Gpt, idx: &Tensor, cache: &mut KvCache, pos0: i64) -> Tensor {
    if cache.mode == CacheMode::None {
        return m.forward(idx, crate::config::Attention::Sdpa, 64, Some(1));
    }
    let new = idx.narrow(1, pos0, idx.size()[1] - pos0);
    let mut x = m.embed(&new, pos0);
    for (b, c) in m.blocks.iter().zip(cache.layers.iter_mut()) {
        x = attend_cached(b, &x, c, cache.mode);
    }
    m.head(&x, Some(1))
}

/// What a generation produced and held.
#[derive(Debug, serde::Serialize)]
pub struct Generated {
    /// Prompt and generated tokens.
    pub tokens: Vec<i64>,
    /// The last step's logits (for parity checks).
    #[serde(skip)]
    pub last_logits: Option<Tensor>,
    /// Bytes the KV cache held at the end.
    pub cache_bytes: i64,
}

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0: greedy (the most likely token).
    pub temperature: f64,
    /// Draw among the `top_k` most likely tokens only (0: all).
    pub top_k: i64,
}

impl Sampling {
    /// The most likely token each time.
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: 0,
    };

    /// The next token for `logits` (1, V): the argmax at temperature 0, else a draw from
    /// softmax(logits / temperature) restricted to the `top_k` largest logits (nanoGPT's sample).
    pub fn pick(&self, logits: &Tensor) -> Tensor {
        if self.temperature <= 0.0 {
            return logits.argmax(-1, false).view([1, 1]);
        }
        let mut l = logits.to_kind(Kind::Float) / self.temperature;
        let v = l.size()[l.dim() - 1];
        if self.top_k > 0 && self.top_k < v {
            let (top, _) = l.topk(self.top_k, -1, true, true);
            let kth = top.narrow(-1, self.top_k - 1, 1);
            l = l.masked_fill(&l.lt_tensor(&kth), f64::NEG_INFINITY);
        }
        l.softmax(-1, Kind::Float)
            .multinomial(1, false)
            .view([1, 1])
    }
}

/// Greedy generation of `n` tokens after `prompt` (B = 1), never past the block size.
pub fn generate(m: &Gpt, prompt: &[i64], n: i64, mode: CacheMode) -> Generated {
    generate_with(m, prompt, n, mode, Sampling::GREEDY)
}

/// Generation of `n` tokens after `prompt` (B = 1) with the given sampling, never past the block
/// size.
pub fn generate_with(
    m: &Gpt,
    prompt: &[i64],
    n: i64,
    mode: CacheMode,
    sampling: Sampling,
) -> Generated {
    tch::no_grad(|| {
        let dev = m.wte.device();
        let max_len = (prompt.len() as i64 + n).min(m.shape.block_size);
        let mut cache = KvCache::new(m, mode, 1, max_len);
        let mut idx = Tensor::from_slice(prompt).view([1, -1]).to_device(dev);
        let mut pos0 = 0;
        let mut last = None;
        while idx.size()[1] < max_len {
            let logits = next_logits(m, &idx, &mut cache, pos0);
            pos0 = idx.size()[1];
            let next = sampling.pick(&logits);
            idx = Tensor::cat(&[&idx, &next], 1);
            last = Some(logits);
        }
        let tokens: Vec<i64> = Vec::try_from(idx.view([-1])).unwrap_or_default();
        Generated {
            tokens,
            last_logits: last,
            cache_bytes: cache.bytes(),
        }
    })
}

/// The estimator's KV-cache figure for `len` positions at batch 1 in fp32.
pub fn estimated_cache_bytes(shape: &crate::config::ModelShape, len: i64) -> u64 {
    let mut e = memsight_analysis::estimate::EstimateInput::for_shape(shape.to_estimate());
    e.seq = len as u64;
    e.batch = 1;
    e.optimizer = memsight_analysis::estimate::Optimizer::None;
    memsight_analysis::estimate::estimate(&e)
        .kv_cache_bytes
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Tensor {
        Tensor::from_slice(&[0.0f32, 3.0, 1.0, 2.5, -1.0, 0.5]).view([1, 6])
    }

    fn draws(s: Sampling, n: usize) -> Vec<i64> {
        tch::manual_seed(7);
        let l = logits();
        (0..n).map(|_| s.pick(&l).int64_value(&[0, 0])).collect()
    }

    #[test]
    fn temperature_zero_and_top_1_are_greedy() {
        assert!(draws(Sampling::GREEDY, 5).iter().all(|&t| t == 1));
        let top1 = Sampling {
            temperature: 2.0,
            top_k: 1,
        };
        assert!(draws(top1, 50).iter().all(|&t| t == 1));
    }

    #[test]
    fn top_k_draws_only_among_the_k_most_likely() {
        let top2 = Sampling {
            temperature: 5.0,
            top_k: 2,
        };
        let d = draws(top2, 400);
        assert!(d.iter().all(|&t| t == 1 || t == 3), "{d:?}");
        assert!(
            d.contains(&1) && d.contains(&3),
            "both are drawn at a high temperature"
        );
    }

    #[test]
    fn a_higher_temperature_spreads_the_draws() {
        let count = |t: f64| {
            let d = draws(
                Sampling {
                    temperature: t,
                    top_k: 0,
                },
                600,
            );
            d.iter().filter(|&&x| x != 1).count()
        };
        let (cold, hot) = (count(0.2), count(3.0));
        assert!(
            hot > cold + 100,
            "not the argmax: {cold} at T=0.2, {hot} at T=3"
        );
    }
}
