//! The model's linear layer, `x·Wᵀ + b`, in the forms it takes: an fp32 weight; an fp32 base with
//! a LoRA update `(x·Aᵀ)·Bᵀ · α` (its adapters in their own VarStore, so the base can be frozen);
//! and, after [`Linear::quantize`], a weight-only int8 or int4 copy for inference (libtorch's
//! packed CPU kernels). One enum variant per form.

use tch::nn::{self, Init};
use tch::{Kind, Tensor};

/// A linear layer: a bias and one form of weight.
pub struct Linear {
    /// Bias, (out).
    bias: Tensor,
    /// The weight, in one of its forms.
    weight: Weight,
}

/// The weight of a [`Linear`].
pub enum Weight {
    /// fp32, (out, in).
    Dense(Tensor),
    /// fp32 base with a LoRA adapter.
    Lora(Lora),
    /// int8 (out, in) with one fp32 scale per output channel.
    Int8 {
        /// The quantized weight.
        w: Tensor,
        /// Per-output-channel scales.
        scales: Tensor,
    },
    /// int4 packed for the CPU kernel, with per-group (scale, zero).
    Int4 {
        /// The packed weight.
        packed: Tensor,
        /// Input features per (scale, zero) pair.
        group: i64,
        /// (in / group, out, 2) scales and zeros.
        scale_zeros: Tensor,
    },
}

/// A base weight and its low-rank update `α·B·A`.
pub struct Lora {
    /// Base weight, (out, in).
    w: Tensor,
    /// Down-projection, (rank, in).
    a: Tensor,
    /// Up-projection, (out, rank); starts at zero, so the adapted model starts equal to the base.
    b: Tensor,
    /// Scale of the update.
    alpha: f64,
}

/// Int4 quantization group (input features per scale/zero pair).
const INT4_GROUP: i64 = 32;

/// Scale of the LoRA update.
const LORA_ALPHA: f64 = 2.0;

impl Linear {
    /// A layer `din → dout` under `p` (weight N(0, std²), bias 0), with a LoRA adapter of `rank`
    /// under `lora` when both are given.
    pub fn new(
        p: &nn::Path,
        lora: Option<&nn::Path>,
        rank: i64,
        din: i64,
        dout: i64,
        std: f64,
    ) -> Self {
        let w = p.var(
            "weight",
            &[dout, din],
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        );
        let bias = p.var("bias", &[dout], Init::Const(0.0));
        let weight = match lora.filter(|_| rank > 0) {
            Some(lp) => {
                let bound = 1.0 / (din as f64).sqrt();
                Weight::Lora(Lora {
                    w,
                    a: lp.var(
                        "lora_a",
                        &[rank, din],
                        Init::Uniform {
                            lo: -bound,
                            up: bound,
                        },
                    ),
                    b: lp.var("lora_b", &[dout, rank], Init::Const(0.0)),
                    alpha: LORA_ALPHA,
                })
            }
            None => Weight::Dense(w),
        };
        Linear { bias, weight }
    }

    /// The weight's form.
    pub fn weight(&self) -> &Weight {
        &self.weight
    }

    /// Replaces the fp32 weight (a LoRA adapter folded in) by an int8 (per output channel) or int4
    /// (per group of 32 inputs, asymmetric) copy; inference only (the packed kernels have no
    /// backward). The fp32 weight is released once its VarStore is.
    pub fn quantize(&mut self, bits: u8) -> Result<(), String> {
        let w = match &self.weight {
            Weight::Dense(w) => w.detach().to_kind(Kind::Float),
            Weight::Lora(l) => {
                (l.w.detach() + l.b.detach().mm(&l.a.detach()) * l.alpha).to_kind(Kind::Float)
            }
            Weight::Int8 { .. } | Weight::Int4 { .. } => {
                return Err("the layer is already quantized".into())
            }
        };
        self.weight = match bits {
            8 => quantize_int8(&w),
            4 => quantize_int4(&w)?,
            b => {
                return Err(format!(
                    "quantization to {b} bits is not supported (8 or 4)"
                ))
            }
        };
        Ok(())
    }

    /// Applies the layer.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        match &self.weight {
            Weight::Dense(w) => x.linear(w, Some(&self.bias)),
            Weight::Lora(l) => {
                // The scale multiplies the rank-r activation, not the output; the update is added
                // in place (the projection's backward does not keep its output): no output-sized
                // temporaries.
                let mut y = x.linear(&l.w, Some(&self.bias));
                let update =
                    (x.linear::<Tensor>(&l.a, None) * l.alpha).linear::<Tensor>(&l.b, None);
                let _ = y.g_add_(&update);
                y
            }
            Weight::Int8 { w, scales } => {
                self.packed(x, |x2| x2.internal_weight_int8pack_mm(w, scales))
            }
            Weight::Int4 {
                packed,
                group,
                scale_zeros,
            } => self.packed(x, |x2| {
                x2.internal_weight_int4pack_mm_for_cpu(packed, *group, scale_zeros)
            }),
        }
    }

    /// A packed kernel `mm` over `x` flattened to (rows, in), plus the bias, in `x`'s shape.
    fn packed(&self, x: &Tensor, mm: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        let shape = x.size();
        let x2 = x.to_kind(Kind::Float).reshape([-1, shape[shape.len() - 1]]);
        let y = mm(&x2);
        let mut out = shape.clone();
        let last = out.len() - 1;
        out[last] = self.bias.size()[0];
        (y + &self.bias).view(out.as_slice())
    }
}

fn quantize_int8(w: &Tensor) -> Weight {
    let scales = (w.abs().amax([1i64].as_slice(), false) / 127.0).clamp_min(1e-12);
    let q = (w / scales.unsqueeze(1))
        .round()
        .clamp(-127.0, 127.0)
        .to_kind(Kind::Int8);
    Weight::Int8 { w: q, scales }
}

fn quantize_int4(w: &Tensor) -> Result<Weight, String> {
    let (n, k) = (w.size()[0], w.size()[1]);
    if n % 16 != 0 || k % INT4_GROUP != 0 {
        return Err(format!(
            "int4 needs out % 16 == 0 and in % {INT4_GROUP} == 0, got {n}×{k}"
        ));
    }
    let g = w.view([n, k / INT4_GROUP, INT4_GROUP]);
    let lo = g.amin([2i64].as_slice(), true);
    let hi = g.amax([2i64].as_slice(), true);
    let scale = ((&hi - &lo) / 15.0).clamp_min(1e-12);
    // w ≈ (q − 8)·scale + zero with zero = lo + 8·scale, q in 0..=15.
    let zero = &lo + &scale * 8.0;
    let q = ((&g - &lo) / &scale)
        .round()
        .clamp(0.0, 15.0)
        .to_kind(Kind::Int)
        .view([n, k]);
    let packed = q.internal_convert_weight_to_int4pack_for_cpu(1);
    let scale_zeros = Tensor::stack(&[scale.squeeze_dim(2), zero.squeeze_dim(2)], 2)
        .transpose(0, 1)
        .contiguous();
    Ok(Weight::Int4 {
        packed,
        group: INT4_GROUP,
        scale_zeros,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn each_form_is_its_own_variant_and_a_lora_layer_quantizes_with_its_update_folded_in() {
        let vs = nn::VarStore::new(Device::Cpu);
        let lvs = nn::VarStore::new(Device::Cpu);
        let mut plain = Linear::new(&(vs.root() / "p"), None, 0, 64, 32, 0.02);
        let mut lora = Linear::new(&(vs.root() / "l"), Some(&lvs.root()), 4, 64, 32, 0.02);
        assert!(matches!(plain.weight(), Weight::Dense(_)));
        assert!(matches!(lora.weight(), Weight::Lora(_)));
        // A non-zero update, so folding it in matters.
        tch::no_grad(|| {
            let mut b = lvs.variables()["lora_b"].shallow_clone();
            let _ = b.fill_(0.05);
        });
        let x = Tensor::randn([3, 64], (Kind::Float, Device::Cpu));
        let want = lora.forward(&x);
        lora.quantize(8).unwrap();
        assert!(matches!(lora.weight(), Weight::Int8 { .. }));
        let got = lora.forward(&x);
        let err = (&got - &want).abs().max().double_value(&[]);
        let scale = want.abs().max().double_value(&[]);
        // int8 rounding over a 64-term dot product on random data reaches ~1% of the output's
        // largest value (1 run in ~20 went past 1%); dropping the adapter's update is far more.
        assert!(
            err < 0.02 * scale,
            "int8 of the folded weight: {err} of {scale}"
        );
        plain.quantize(4).unwrap();
        assert!(matches!(plain.weight(), Weight::Int4 { .. }));
        assert_eq!(
            plain.quantize(8).unwrap_err(),
            "the layer is already quantized"
        );
    }
}
