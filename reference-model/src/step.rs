//! One micro-batch's forward and backward. The plain path lets autograd keep every activation.
//! The segmented path (activation checkpointing and/or efficient attention) cuts the graph at each
//! block's input and drives backward block by block with explicit grad outputs
//! (`memsight_integrations::torch::backward`): a checkpointed block keeps only its input and is
//! recomputed in backward; efficient attention keeps only q, k, v and its output and
//! supplies its own gradients.

use crate::attention;
use crate::config::{Attention, Config};
use crate::model::{self, Block, Gpt};
use memsight_integrations::torch::{self, TorchError};
use tch::{Device, Kind, Tensor};

/// Runs `f` under bf16 autocast when the config asks for it.
pub fn maybe_autocast<T>(
    cfg: &Config,
    device: Device,
    f: impl FnOnce() -> T,
) -> Result<T, TorchError> {
    if cfg.bf16 {
        torch::autocast(device, Kind::BFloat16, f)
    } else {
        Ok(f())
    }
}

/// What backward needs of one block.
enum Tape {
    /// Checkpointed: only the block's input; recomputed in backward.
    Input(Tensor),
    /// Efficient attention kept: its pieces, and the graphs on both sides of it.
    Efficient(EfficientTape),
}

struct EfficientTape {
    x: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    o_leaf: Tensor,
    y: Tensor,
}

fn efficient_block(b: &Block, x: &Tensor, block: i64) -> EfficientTape {
    let (q, k, v) = b.qkv(x);
    let o = attention::efficient_forward(&q, &k, &v, block);
    let o_leaf = o.detach().set_requires_grad(true);
    let y = b.finish(x, &o_leaf);
    EfficientTape {
        x: x.shallow_clone(),
        q,
        k,
        v,
        o,
        o_leaf,
        y,
    }
}

fn efficient_backward(t: &EfficientTape, g: &Tensor, block: i64) -> Result<(), TorchError> {
    torch::backward(&[&t.y], &[g])?;
    let dout = t.o_leaf.grad();
    let (dq, dk, dv) =
        tch::no_grad(|| attention::efficient_backward(&t.q, &t.k, &t.v, &t.o, &dout, block));
    torch::backward(&[&t.q, &t.k, &t.v], &[&dq, &dk, &dv])
}

/// Forward and backward of one micro-batch; gradients accumulate into the parameters, scaled by
/// `scale` (1 / micro-batches per step). Returns the (unscaled) loss.
pub fn forward_backward(
    m: &Gpt,
    cfg: &Config,
    x: &Tensor,
    y: &Tensor,
    keep: Option<i64>,
    scale: f64,
) -> Result<f64, TorchError> {
    let device = x.device();
    let targets = match keep {
        Some(k) => y.narrow(1, y.size()[1] - k, k),
        None => y.shallow_clone(),
    };
    let segmented = cfg.checkpoint || cfg.attention == Attention::Efficient;
    if !segmented {
        let loss = {
            let _f = memsight::phase("forward");
            maybe_autocast(cfg, device, || {
                let logits = m.forward(x, cfg.attention, cfg.attention_block, keep);
                model::loss(&logits, &targets)
            })?
        };
        let _b = memsight::phase("backward");
        (&loss * scale).backward();
        return Ok(loss.double_value(&[]));
    }
    let blk = cfg.attention_block;
    let (emb, tapes, xf, loss) = {
        let _f = memsight::phase("forward");
        maybe_autocast(cfg, device, || {
            let emb = m.embed(x, 0);
            let mut h = emb.detach();
            let mut tapes = Vec::with_capacity(m.blocks.len());
            for b in &m.blocks {
                let xin = h.set_requires_grad(true);
                if cfg.checkpoint {
                    h = tch::no_grad(|| b.forward(&xin, cfg.attention, blk));
                    tapes.push(Tape::Input(xin));
                } else {
                    let t = efficient_block(b, &xin, blk);
                    h = t.y.detach();
                    tapes.push(Tape::Efficient(t));
                }
            }
            let xf = h.set_requires_grad(true);
            let logits = m.head(&xf, keep);
            let loss = model::loss(&logits, &targets);
            (emb, tapes, xf, loss)
        })?
    };
    let _b = memsight::phase("backward");
    (&loss * scale).backward();
    let mut g = xf.grad();
    for (b, tape) in m.blocks.iter().zip(tapes).rev() {
        let xin = match tape {
            Tape::Input(xin) => {
                if cfg.attention == Attention::Efficient {
                    let t = maybe_autocast(cfg, device, || efficient_block(b, &xin, blk))?;
                    efficient_backward(&t, &g, blk)?;
                } else {
                    let yb = maybe_autocast(cfg, device, || b.forward(&xin, cfg.attention, blk))?;
                    torch::backward(&[&yb], &[&g])?;
                }
                xin
            }
            Tape::Efficient(t) => {
                efficient_backward(&t, &g, blk)?;
                t.x
            }
        };
        g = xin.grad();
    }
    // With a frozen base (LoRA) the embeddings need no gradient.
    if emb.requires_grad() {
        torch::backward(&[&emb], &[&g])?;
    }
    Ok(loss.double_value(&[]))
}

/// Mean validation loss of `x`/`y` (B, S) evaluated in segments of at most `segment` tokens, each
/// segment an independent sequence (chunked evaluation: memory bounded by the segment length).
pub fn evaluate(
    m: &Gpt,
    cfg: &Config,
    x: &Tensor,
    y: &Tensor,
    segment: i64,
) -> Result<f64, TorchError> {
    let s = x.size()[1];
    let mut total = 0.0;
    let mut n = 0.0;
    let mut p0 = 0;
    while p0 < s {
        let len = segment.min(s - p0);
        let xs = x.narrow(1, p0, len);
        let ys = y.narrow(1, p0, len);
        let l = tch::no_grad(|| {
            maybe_autocast(cfg, x.device(), || {
                let logits = m.forward(&xs, cfg.attention, cfg.attention_block, None);
                model::loss(&logits, &ys).double_value(&[])
            })
        })?;
        total += l * len as f64;
        n += len as f64;
        p0 += len;
    }
    Ok(total / n.max(1.0))
}
