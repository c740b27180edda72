//! The ablation's markdown (memsight-gpt's per-phase peaks against the estimate and the seeds'
//! claims; memsight-gpt vs PyTorch by the same instrument; the inference rows; overhead; seed 000)
//! and its SVG.

use super::extras::ms_list;
use super::inference::{self, InferenceRow};
use super::variants;
use super::{Ablation, Options, Row};
use memsight::units::fmt_bytes;
use std::fmt::Write as _;

fn opt(v: Option<u64>) -> String {
    v.map(fmt_bytes).unwrap_or_else(|| "–".into())
}

fn ratio(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => format!("{:.2}×", a as f64 / b as f64),
        _ => "–".into(),
    }
}

fn percent(base: Option<u64>, m: Option<u64>) -> String {
    match (base, m) {
        (Some(b), Some(m)) if b > 0 => format!("{:+.0}%", (b as f64 - m as f64) / b as f64 * 100.0),
        _ => "–".into(),
    }
}

/// The row `r`'s saving is measured against (its variant's `against`, else the first row).
fn reference<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
    let against = variants::find(&r.name).map_or("", |v| v.against);
    if against.is_empty() {
        rows.first()
    } else {
        rows.iter().find(|x| x.name == against)
    }
}

/// The whole markdown page.
pub fn markdown(a: &Ablation, o: &Options, command_line: &str) -> String {
    let mut s = format!(
        "# Ablation: memsight-gpt, preset {:?}, {} steps, device {}\n\nMade with `{command_line}`. \
         Every row is its own process under `memsight run` (sampling every 20 ms). Tensor peaks are \
         the libtorch CPU hook's exact peaks inside each phase (`train`: the steps; `eval`: the \
         evaluation at the end) — the device allocator's on a GPU; the estimate is `memsight \
         estimate`'s training peak for the same shape and switches (weights + grads + AdamW + \
         activations); a saving is measured against the baseline unless the row names another.\n\n",
        o.preset, o.steps, o.device
    );
    training_table(&mut s, &a.rows);
    if a.rows.iter().any(|r| r.peer.is_some()) {
        peer_table(&mut s, &a.rows);
    }
    inference_table(&mut s, &a.inference);
    let over = &a.overhead;
    let _ = write!(
        s,
        "\n## Profiling on vs off\n\nBaseline, {} interleaved rounds of runs; median step time with \
         memsight's session, libtorch hooks and sampler vs `--no-profile` (the global allocator stays \
         in both), and with jemalloc's heap profiler sampling every 512 KiB as `memsight run` \
         starts jobs:\n\n| on (ms) | off (ms) | on ÷ off | + heap sampling (ms) | heap ÷ on |\n\
         |---|---|---:|---|---:|\n| {} | {} | {:.3}× | {} | {:.3}× |\n",
        over.pairs,
        ms_list(&over.on_ms),
        ms_list(&over.off_ms),
        over.ratio,
        ms_list(&over.heap_ms),
        over.heap_ratio
    );
    let tensors = a
        .seed_000
        .iter()
        .find(|c| c.mode == "efficient" && c.claimed_score_bytes > 0)
        .map_or(0.0, |c| {
            c.measured_peak_bytes as f64 / c.claimed_score_bytes as f64
        });
    let _ = write!(
        s,
        "\n## Seed 000, measured\n\nOne layer's attention, forward and backward, B=4, S=2048, \
         H=12, D=64, fp32 (tensor peak above q, k, v and the output gradient, from the libtorch \
         hook). With D = 64 one 64-row tile's scores (B·H·64·S, the seed's figure) are as large as \
         q, k, v or the output (B·H·S·D); the efficient peak is {tensors:.1} such tensors: \
         backward holds the output, dq, dk and dv beside the tile's scores, probabilities and \
         their gradients, where the seed counts the scores alone:\n\n\
         | attention | seed's scores per layer | measured peak | time |\n|---|---:|---:|---:|\n"
    );
    for c in &a.seed_000 {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} ms |",
            c.mode,
            fmt_bytes(c.claimed_score_bytes.max(0) as u64),
            fmt_bytes(c.measured_peak_bytes),
            c.ms
        );
    }
    s
}

fn training_table(s: &mut String, rows: &[Row]) {
    let device = rows.iter().any(|r| r.ours.device_peak_bytes.is_some());
    *s += "## memsight-gpt: per-phase peaks, the estimate and the seeds' claims\n\n\
           | variant | train tensor peak | saving | eval tensor peak | eval saving | estimate | \
           train ÷ est | seed's claim | heap peak | peak RSS | RSS at end |";
    if device {
        *s += " device reserved peak |";
    }
    *s += " step ms | final loss |\n|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|";
    if device {
        *s += "---:|";
    }
    *s += "---:|---:|\n";
    for r in rows {
        let base = reference(rows, r);
        let train = r.ours.train_peak();
        let eval = r.ours.eval_peak();
        let claim = variants::find(&r.name).map_or("", |v| v.claim);
        let _ = write!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {claim} | {} | {} | {} |",
            r.name,
            opt(train),
            percent(base.and_then(|b| b.ours.train_peak()), train),
            opt(eval),
            percent(base.and_then(|b| b.ours.eval_peak()), eval),
            fmt_bytes(r.estimate_bytes),
            ratio(train, Some(r.estimate_bytes)),
            fmt_bytes(r.ours.heap_peak_bytes),
            opt(r.ours.rss_peak_bytes),
            opt(r.ours.rss_end_bytes),
        );
        if device {
            let _ = write!(s, " {} |", opt(r.ours.device_peak_bytes));
        }
        let _ = writeln!(s, " {:.1} | {:.4} |", r.ours.step_ms, r.ours.final_loss);
    }
}

fn peer_table(s: &mut String, rows: &[Row]) {
    *s += "\n## memsight-gpt vs PyTorch, by the same instrument\n\nBoth programs run under \
           `memsight run` and mark the same phases; each figure is an increment over the \
           process's own baseline — its live heap and RSS when training starts (model, optimizer \
           and data ready), read from the session's snapshot by the job itself. Heap is the whole \
           process heap, exact: memsight-gpt's jemalloc (Rust and libtorch's C++ allocations) and, \
           in Python, glibc's malloc counted by the preloaded library — CPU tensor storage is in \
           both. PyTorch exposes no exact count of CPU tensor bytes, so the peer has no tensor \
           column on a CPU (on a GPU `memsight.torch` records the caching allocator's). The peer \
           runs on glibc's malloc, memsight-gpt on jemalloc: the allocator is part of what is \
           compared, and the column *peer applies* says where a switch is the peer's own \
           equivalent.\n\n\
           | variant | peer applies | baseline heap, RSS (ours; PyTorch) | heap + train (ours) | \
           PyTorch | ours ÷ PyTorch | heap + eval (ours) | PyTorch | RSS + (ours) | PyTorch | \
           ours ÷ PyTorch | step ms (ours) | PyTorch | val loss (ours) | PyTorch |\n\
           |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        let Some(p) = &r.peer else { continue };
        let o = &r.ours;
        let (ht, pt) = (o.heap_increment(&o.train), p.heap_increment(&p.train));
        let (he, pe) = (o.heap_increment(&o.eval), p.heap_increment(&p.eval));
        let (rr, pr) = (o.rss_increment(), p.rss_increment());
        let val = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.4}"));
        let _ = writeln!(
            s,
            "| {} | {} | {}, {}; {}, {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} |",
            r.name,
            r.peer_applies,
            opt(o.baseline_heap_bytes),
            opt(o.baseline_rss_bytes),
            opt(p.baseline_heap_bytes),
            opt(p.baseline_rss_bytes),
            opt(ht),
            opt(pt),
            ratio(ht, pt),
            opt(he),
            opt(pe),
            opt(rr),
            opt(pr),
            ratio(rr, pr),
            o.step_ms,
            p.step_ms,
            val(o.val_loss),
            val(p.val_loss),
        );
    }
}

fn inference_table(s: &mut String, rows: &[InferenceRow]) {
    *s += "\n## Inference switches (memsight-gpt)\n\nEach row is `memsight-gpt generate` or \
           `analyze` on a checkpoint of the same preset, its own process under `memsight run`, \
           measured in the phase its switch acts on: the phase's tensor peak (weights included) \
           and its heap rise above the phase's entry (what the phase needed; CPU tensors are heap \
           blocks). The saving is read from the metric in bold.\n\n\
           | row | phase | tensor peak in phase | heap rise in phase | saving | against | \
           seed's claim | peak RSS | command |\n|---|---|---:|---:|---:|---|---|---:|---|\n";
    for r in rows {
        let Some(v) = inference::find(&r.name) else {
            continue;
        };
        let (mut t, mut h) = (opt(r.tensor_peak_bytes), opt(r.heap_rise_bytes));
        match v.metric {
            inference::Metric::TensorPeak => t = format!("**{t}**"),
            inference::Metric::HeapRise => h = format!("**{h}**"),
        }
        let saving = inference::saving(rows, r).map_or("–".into(), |p| format!("{p:+.0}%"));
        let _ = writeln!(
            s,
            "| {} | {} | {t} | {h} | {saving} | {} | {} | {} | `{}` |",
            r.name,
            r.phase,
            v.against,
            v.claim,
            opt(r.rss_peak_bytes),
            r.args.join(" ")
        );
    }
}

/// Horizontal bars per training row: memsight-gpt's train tensor peak (blue), its heap increment
/// in training (grey) and PyTorch's (orange).
pub fn svg(rows: &[Row]) -> String {
    let bars = |r: &Row| {
        let o = &r.ours;
        [
            o.train_peak().unwrap_or(0),
            o.heap_increment(&o.train).unwrap_or(0),
            r.peer
                .as_ref()
                .and_then(|p| p.heap_increment(&p.train))
                .unwrap_or(0),
        ]
    };
    let max = rows.iter().flat_map(bars).max().unwrap_or(1).max(1) as f64;
    let (left, width, row_h) = (300.0, 480.0, 44.0);
    let h = 40.0 + row_h * rows.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"18\">per variant: memsight-gpt train tensor peak (blue); heap added in training over the baseline, memsight-gpt (grey) and PyTorch (orange)</text>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 30.0 + row_h * i as f64;
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.0}\">{}</text>",
            y + 20.0,
            r.name.replace('&', "&amp;").replace('<', "&lt;")
        );
        for (j, (b, colour)) in bars(r)
            .into_iter()
            .zip(["#3b6fb6", "#999", "#e08a2c"])
            .enumerate()
        {
            let w = b as f64 / max * width;
            let yb = y + 4.0 + 11.0 * j as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{left}\" y=\"{yb:.0}\" width=\"{w:.1}\" height=\"10\" fill=\"{colour}\"/>\n\
                 <text x=\"{:.0}\" y=\"{:.0}\" font-size=\"10\">{}</text>",
                left + w + 4.0,
                yb + 9.0,
                fmt_bytes(b)
            );
        }
    }
    s += "</svg>\n";
    s
}
