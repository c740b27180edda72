//! The GPT-2-style model (nanoGPT's model.py in tch): token + position embeddings, pre-LN blocks
//! of causal self-attention and a 4× GELU MLP, a final LayerNorm and an LM head tied to the token
//! embedding. Parameter names follow GPT-2's (`h.0.attn.c_attn.weight`). Optional LoRA adapters on
//! every attention and MLP projection live in a separate VarStore, so the base can be frozen and
//! the optimizer built from the adapters alone.

use crate::attention;
use crate::config::{Attention, ModelShape};
pub use crate::linear::Linear;
use tch::nn::{self, Init};
use tch::{Kind, Tensor};

/// LayerNorm computed in fp32 whatever the autocast dtype.
pub struct LayerNorm {
    w: Tensor,
    b: Tensor,
    n: i64,
}

impl LayerNorm {
    /// A LayerNorm over `n` features (weight 1, bias 0) under `p`.
    pub fn new(p: &nn::Path, n: i64) -> Self {
        LayerNorm {
            w: p.var("weight", &[n], Init::Const(1.0)),
            b: p.var("bias", &[n], Init::Const(0.0)),
            n,
        }
    }

    /// Normalizes the last dimension (in fp32).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.to_kind(Kind::Float)
            .layer_norm([self.n], Some(&self.w), Some(&self.b), 1e-5, false)
    }
}

/// One pre-LN transformer block.
pub struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
    n_head: i64,
}

impl Block {
    fn new(p: &nn::Path, lora: Option<&nn::Path>, rank: i64, s: &ModelShape) -> Self {
        let d = s.n_embd;
        let std = 0.02;
        // GPT-2's scaled init of residual projections.
        let proj_std = 0.02 / (2.0 * s.n_layer as f64).sqrt();
        let sub = |name: &str| lora.map(|l| l / name);
        let la = sub("attn");
        let lm = sub("mlp");
        Block {
            ln_1: LayerNorm::new(&(p / "ln_1"), d),
            c_attn: Linear::new(
                &(p / "attn" / "c_attn"),
                la.as_ref().map(|l| l / "c_attn").as_ref(),
                rank,
                d,
                3 * d,
                std,
            ),
            attn_proj: Linear::new(
                &(p / "attn" / "c_proj"),
                la.as_ref().map(|l| l / "c_proj").as_ref(),
                rank,
                d,
                d,
                proj_std,
            ),
            ln_2: LayerNorm::new(&(p / "ln_2"), d),
            c_fc: Linear::new(
                &(p / "mlp" / "c_fc"),
                lm.as_ref().map(|l| l / "c_fc").as_ref(),
                rank,
                d,
                4 * d,
                std,
            ),
            mlp_proj: Linear::new(
                &(p / "mlp" / "c_proj"),
                lm.as_ref().map(|l| l / "c_proj").as_ref(),
                rank,
                4 * d,
                d,
                proj_std,
            ),
            n_head: s.n_head,
        }
    }

    /// The attention's inputs: q, k, v as (B, H, S, D).
    pub fn qkv(&self, x: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (b, t, c) = x.size3().unwrap_or((1, 1, 1));
        let qkv = self.c_attn.forward(&self.ln_1.forward(x));
        let parts = qkv.split(c, 2);
        let heads = |t_: &Tensor| {
            t_.view([b, t, self.n_head, c / self.n_head])
                .transpose(1, 2)
        };
        (heads(&parts[0]), heads(&parts[1]), heads(&parts[2]))
    }

    /// The rest of the block given the attention output `o` (B, H, S, D): projection, residual, MLP.
    pub fn finish(&self, x: &Tensor, o: &Tensor) -> Tensor {
        let (b, t, c) = x.size3().unwrap_or((1, 1, 1));
        let o = o.transpose(1, 2).contiguous().view([b, t, c]);
        let x = x + self.attn_proj.forward(&o);
        let h = self.c_fc.forward(&self.ln_2.forward(&x)).gelu("tanh");
        &x + self.mlp_proj.forward(&h)
    }

    /// Quantizes every projection of the block (inference only).
    pub fn quantize(&mut self, bits: u8) -> Result<(), String> {
        for l in [
            &mut self.c_attn,
            &mut self.attn_proj,
            &mut self.c_fc,
            &mut self.mlp_proj,
        ] {
            l.quantize(bits)?;
        }
        Ok(())
    }

    /// The whole block.
    pub fn forward(&self, x: &Tensor, mode: Attention, block: i64) -> Tensor {
        let (q, k, v) = self.qkv(x);
        let o = attention::attend(&q, &k, &v, mode, block);
        self.finish(x, &o)
    }

    /// Sampling mode: attention probabilities of the query rows `picks` only, (B, H, rows, S).
    pub fn attention_rows(&self, x: &Tensor, picks: &[i64]) -> Tensor {
        let (q, k, _) = self.qkv(x);
        let rows = Tensor::from_slice(picks).to_device(q.device());
        attention::causal_probs(&q.index_select(2, &rows), &k, &rows)
    }

    /// The block's attention probability maps, `chunk` heads at a time: `f(h0, maps)` receives
    /// heads h0.. as (B, chunk, S, S) and each chunk is released before the next is computed, so
    /// at most B·chunk·S² map elements exist at once (never the full (B, H, S, S)).
    pub fn for_each_map_chunk(&self, x: &Tensor, chunk: i64, mut f: impl FnMut(i64, Tensor)) {
        let (q, k, _) = self.qkv(x);
        let h = q.size()[1];
        let rows = attention::positions(&q);
        let mut h0 = 0;
        while h0 < h {
            let n = chunk.max(1).min(h - h0);
            f(
                h0,
                attention::causal_probs(&q.narrow(1, h0, n), &k.narrow(1, h0, n), &rows),
            );
            h0 += n;
        }
    }
}

/// The model.
pub struct Gpt {
    /// Token embedding, also the LM head (tied).
    pub wte: Tensor,
    /// Position embedding.
    pub wpe: Tensor,
    /// Blocks.
    pub blocks: Vec<Block>,
    ln_f: LayerNorm,
    /// Shape.
    pub shape: ModelShape,
}

impl Gpt {
    /// Builds the model under `vs` (and LoRA adapters under `lora` when `rank > 0`). `layers`
    /// limits the blocks built (first-layer-only loading); `None` builds all.
    pub fn new(
        vs: &nn::Path,
        lora: Option<&nn::Path>,
        rank: i64,
        shape: ModelShape,
        layers: Option<i64>,
    ) -> Self {
        let n = layers.unwrap_or(shape.n_layer).min(shape.n_layer);
        let h = vs / "h";
        let lh = lora.map(|l| l / "h");
        Gpt {
            wte: vs.var(
                "wte",
                &[shape.vocab_size, shape.n_embd],
                Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            ),
            wpe: vs.var(
                "wpe",
                &[shape.block_size, shape.n_embd],
                Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            ),
            blocks: (0..n)
                .map(|i| {
                    let l = lh.as_ref().map(|l| l / i);
                    Block::new(&(&h / i), l.as_ref(), rank, &shape)
                })
                .collect(),
            ln_f: LayerNorm::new(&(vs / "ln_f"), shape.n_embd),
            shape,
        }
    }

    /// Weight-only int8 or int4 quantization of every block projection (embeddings, norms and the
    /// tied head stay fp32). Inference only; drop the VarStore afterwards to free the fp32 weights.
    pub fn quantize(&mut self, bits: u8) -> Result<(), String> {
        self.blocks.iter_mut().try_for_each(|b| b.quantize(bits))
    }

    /// Token + position embeddings of `idx` (B, S), positions starting at `pos0`.
    pub fn embed(&self, idx: &Tensor, pos0: i64) -> Tensor {
        let s = idx.size()[1];
        let pos = Tensor::arange_start(pos0, pos0 + s, (Kind::Int64, idx.device()));
        Tensor::embedding(&self.wte, idx, -1, false, false)
            + Tensor::embedding(&self.wpe, &pos, -1, false, false)
    }

    /// Logits of the last `keep` positions (all when `None`): the LM head only where needed.
    pub fn head(&self, x: &Tensor, keep: Option<i64>) -> Tensor {
        let x = match keep {
            Some(k) => {
                let s = x.size()[1];
                x.narrow(1, s - k.min(s), k.min(s))
            }
            None => x.shallow_clone(),
        };
        self.ln_f.forward(&x).linear::<Tensor>(&self.wte, None)
    }

    /// Logits for `idx` with autograd (the plain path).
    pub fn forward(&self, idx: &Tensor, mode: Attention, block: i64, keep: Option<i64>) -> Tensor {
        let mut x = self.embed(idx, 0);
        for b in &self.blocks {
            x = b.forward(&x, mode, block);
        }
        self.head(&x, keep)
    }
}

/// Mean cross-entropy of `logits` (B, S, V) against `targets` (B, S), in fp32.
pub fn loss(logits: &Tensor, targets: &Tensor) -> Tensor {
    let v = logits.size()[2];
    logits
        .to_kind(Kind::Float)
        .reshape([-1, v])
        .cross_entropy_loss::<Tensor>(
            &targets.reshape([-1]),
            None,
            tch::Reduction::Mean,
            -100,
            0.0,
        )
}
