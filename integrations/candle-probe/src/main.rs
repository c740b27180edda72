//! An ordinary candle training loop — nothing of memsight in it — for measuring a framework's device
//! memory from outside (`memsight run --cupti`): an MLP regressor trained with AdamW on synthetic
//! data, whose batch doubles every `--grow-every` steps so its device memory has steps to see.
//!
//! Usage: `candle-probe [--steps N] [--batch B] [--hidden H] [--grow-every K] [--pause-ms MS]`

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{linear, AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use std::time::Duration;

struct Options {
    steps: usize,
    batch: usize,
    hidden: usize,
    grow_every: usize,
    pause_ms: u64,
}

fn options() -> std::result::Result<Options, String> {
    let mut o = Options { steps: 40, batch: 256, hidden: 4096, grow_every: 10, pause_ms: 150 };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number: u64 = value.parse().map_err(|_| format!("{flag}: not a number: {value}"))?;
        match flag.as_str() {
            "--steps" => o.steps = number as usize,
            "--batch" => o.batch = number as usize,
            "--hidden" => o.hidden = number as usize,
            "--grow-every" => o.grow_every = number.max(1) as usize,
            "--pause-ms" => o.pause_ms = number,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

fn train(o: &Options) -> Result<()> {
    let device = Device::new_cuda(0)?;
    let width = 1024;
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &device);
    let up = linear(width, o.hidden, vb.pp("up"))?;
    let down = linear(o.hidden, width, vb.pp("down"))?;
    let mut optimizer = AdamW::new(vars.all_vars(), ParamsAdamW { lr: 1e-3, ..Default::default() })?;
    for step in 0..o.steps {
        let batch = o.batch << (step / o.grow_every);
        let x = Tensor::randn(0f32, 1.0, (batch, width), &device)?;
        let target = x.sin()?;
        let y = down.forward(&up.forward(&x)?.gelu()?)?;
        let loss = (y - target)?.sqr()?.mean_all()?;
        optimizer.backward_step(&loss)?;
        println!("step {step} batch {batch} loss {:.5}", loss.to_scalar::<f32>()?);
        std::thread::sleep(Duration::from_millis(o.pause_ms));
    }
    Ok(())
}

fn main() {
    let code = match options() {
        Err(e) => {
            eprintln!("candle-probe: {e}");
            2
        }
        Ok(o) => match train(&o) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("candle-probe: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}
