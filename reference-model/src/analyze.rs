//! Attention analysis (seeds 002 and 004): load only the embeddings, the first `layers` blocks and
//! the final norm from a checkpoint, reading only those tensors' bytes; compute block-attention
//! maps a chunk of heads at a time and write each head's map as a heatmap image (binary PGM) before
//! the next chunk exists (peak B·chunk·S² instead of B·H·S²), or from sampled query rows only
//! (B·H·rows·S, never the full maps).

use crate::checkpoint;
use crate::config::ModelShape;
use crate::model::Gpt;
use std::io::Write;
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};

/// A model holding only its first `layers` blocks (plus embeddings and final norm), loaded from a
/// checkpoint by reading only those tensors; returns the model, its VarStore and the bytes of the
/// parameters it holds.
pub fn load_first_layers(
    path: &Path,
    shape: ModelShape,
    layers: i64,
) -> Result<(nn::VarStore, Gpt, i64), String> {
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Gpt::new(&vs.root(), None, 0, shape, Some(layers));
    let bytes = checkpoint::load_vars(&vs, path)?;
    Ok((vs, m, bytes as i64))
}

/// The whole model loaded the usual way (`VarStore::load`: the file read into memory, then every
/// tensor copied out of it) — what first-layer-only loading is measured against.
pub fn load_whole(path: &Path, shape: ModelShape) -> Result<(nn::VarStore, Gpt), String> {
    let mut vs = nn::VarStore::new(Device::Cpu);
    let m = Gpt::new(&vs.root(), None, 0, shape, None);
    vs.load(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((vs, m))
}

/// Attention maps of block `layer` for `idx` (B, S) as one (B, H, S, S) tensor, computed `chunk`
/// heads at a time but concatenated: for comparisons (tests) only — it holds the full maps.
pub fn maps(m: &Gpt, idx: &Tensor, layer: usize, chunk: i64) -> Tensor {
    let mut parts = Vec::new();
    tch::no_grad(|| {
        m.blocks[layer].for_each_map_chunk(&layer_input(m, idx, layer), chunk, |_, t| parts.push(t))
    });
    Tensor::cat(&parts, 1)
}

/// Writes each head's map of block `layer` (batch row 0) into `dir` as `layer{L}-head{H}.pgm`,
/// computing `chunk` heads at a time and releasing each chunk once written.
pub fn write_map_chunks(
    m: &Gpt,
    idx: &Tensor,
    layer: usize,
    chunk: i64,
    dir: &Path,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let mut err = None;
    tch::no_grad(|| {
        m.blocks[layer].for_each_map_chunk(&layer_input(m, idx, layer), chunk, |h0, t| {
            for j in 0..t.size()[1] {
                let p = dir.join(format!("layer{layer}-head{}.pgm", h0 + j));
                match write_pgm(&t.get(0).get(j), &p) {
                    Ok(()) => files.push(p),
                    Err(e) => err = err.take().or(Some(e)),
                }
            }
        })
    });
    match err {
        Some(e) => Err(e),
        None => Ok(files),
    }
}

fn layer_input(m: &Gpt, idx: &Tensor, layer: usize) -> Tensor {
    let mut x = m.embed(idx, 0);
    for b in &m.blocks[..layer] {
        x = b.forward(&x, crate::config::Attention::Sdpa, 64);
    }
    x
}

/// Sampling mode: maps for `rows` evenly spaced query positions only, (B, H, rows, S) — scores
/// for those rows alone, never the S² matrix — and the positions picked.
pub fn sampled_maps(m: &Gpt, idx: &Tensor, layer: usize, rows: i64) -> (Tensor, Vec<i64>) {
    let s = idx.size()[1];
    let n = rows.clamp(1, s);
    let picks: Vec<i64> = (0..n).map(|i| i * s / n).collect();
    let maps = tch::no_grad(|| m.blocks[layer].attention_rows(&layer_input(m, idx, layer), &picks));
    (maps, picks)
}

/// Largest absolute difference between sampled rows and the same rows of the full maps.
pub fn sampling_error(full: &Tensor, sampled: &Tensor, picks: &[i64]) -> f64 {
    let sel = Tensor::from_slice(picks).to_device(full.device());
    (full.index_select(2, &sel) - sampled)
        .abs()
        .max()
        .double_value(&[])
}

/// Writes one (S, S) map as an 8-bit binary PGM heatmap (white = 1).
pub fn write_pgm(map: &Tensor, path: &Path) -> Result<(), String> {
    let size = map.size();
    let (h, w) = (size[0], size[1]);
    let flat: Vec<f32> = Vec::try_from(map.to_kind(Kind::Float).contiguous().view([-1]))
        .map_err(|e: tch::TchError| e.to_string())?;
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    write!(f, "P5\n{w} {h}\n255\n").map_err(|e| e.to_string())?;
    let px: Vec<u8> = flat
        .iter()
        .map(|v| (v.clamp(0.0, 1.0).sqrt() * 255.0) as u8)
        .collect();
    f.write_all(&px)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes every head's map of batch row 0 into `dir` as `layer{L}-head{H}.pgm`.
pub fn write_heatmaps(maps: &Tensor, layer: usize, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let heads = maps.size()[1];
    (0..heads)
        .map(|h| {
            let p = dir.join(format!("layer{layer}-head{h}.pgm"));
            write_pgm(&maps.get(0).get(h), &p).map(|_| p)
        })
        .collect()
}

/// How well the sampled rows stand for all rows: the largest absolute difference between each
/// head's mean attention over all query rows and its mean over the sampled rows.
pub fn profile_error(full: &Tensor, sampled: &Tensor) -> f64 {
    let mean = |t: &Tensor| t.mean_dim([2i64].as_slice(), false, Kind::Float);
    (mean(full) - mean(sampled)).abs().max().double_value(&[])
}
