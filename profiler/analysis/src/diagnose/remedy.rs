//! The remedies memsight can recommend (from the seeds' manual OOM work), each a concrete action
//! with the reason it applies and, where the numbers allow, the bytes it would save.

use memsight_format::units::fmt_bytes;
use serde::Serialize;

/// One recommended action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Remedy {
    /// A short stable name (`expandable_segments`, `checkpointing`, …).
    pub id: &'static str,
    /// What to do.
    pub action: String,
    /// Why it helps here, with the numbers.
    pub why: String,
    /// Bytes it is expected to free, when computable from the facts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saving_bytes: Option<u64>,
}

fn b(v: u128) -> String {
    fmt_bytes(u64::try_from(v).unwrap_or(u64::MAX))
}

fn saving(v: u128) -> Option<u64> {
    (v > 0).then(|| u64::try_from(v).unwrap_or(u64::MAX))
}

/// `expandable_segments:True`, or — when the allocator config already has it — the next setting.
pub fn expandable_segments(unallocated: u128, alloc_conf: Option<&str>) -> Remedy {
    let already =
        alloc_conf.is_some_and(|c| c.replace(' ', "").contains("expandable_segments:True"));
    if already {
        Remedy {
            id: "max_split_size_mb",
            action: "expandable_segments is already set (PYTORCH_CUDA_ALLOC_CONF); add \
                     garbage_collection_threshold:0.8 or max_split_size_mb:128, and free cached \
                     blocks between phases with torch.cuda.empty_cache()"
                .into(),
            why: format!(
                "{} is reserved but unallocated even with expandable segments",
                b(unallocated)
            ),
            saving_bytes: saving(unallocated),
        }
    } else {
        Remedy {
            id: "expandable_segments",
            action: "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:128 \
                     on PyTorch < 2.1)"
                .into(),
            why: format!(
                "segments grow in place instead of splitting, so the {} cached but unusable can serve the request",
                b(unallocated)
            ),
            saving_bytes: saving(unallocated),
        }
    }
}

/// Run fewer jobs on the device.
pub fn concurrency_plan(others: u128, device: Option<i128>) -> Remedy {
    let dev = device.map_or_else(|| "the device".to_string(), |d| format!("GPU {d}"));
    Remedy {
        id: "concurrency_plan",
        action: format!(
            "run fewer jobs on {dev}: make a per-GPU plan from measured peaks with `memsight plan \
             --gpus N --gpu-memory SIZE REPORT…`, or move this job to an idle GPU (CUDA_VISIBLE_DEVICES)"
        ),
        why: format!("other processes hold {} on {dev}", b(others)),
        saving_bytes: saving(others),
    }
}

/// "; the job needs X more" when the shortfall is known.
fn needs(shortfall: Option<u128>) -> String {
    shortfall
        .filter(|&s| s > 0)
        .map_or(String::new(), |s| format!("; the job needs {} more", b(s)))
}

/// Activation checkpointing.
pub fn checkpointing(shortfall: Option<u128>) -> Remedy {
    Remedy {
        id: "checkpointing",
        action: "enable activation checkpointing (recompute each block's activations in backward)"
            .into(),
        why: format!(
            "keeps one block's activations alive instead of all layers'{}",
            needs(shortfall)
        ),
        saving_bytes: None,
    }
}

/// Smaller micro-batch with gradient accumulation.
pub fn micro_batch(shortfall: Option<u128>) -> Remedy {
    Remedy {
        id: "micro_batch",
        action:
            "halve the micro-batch and double gradient-accumulation steps (same effective batch)"
                .into(),
        why: format!(
            "activation memory scales with the micro-batch{}",
            needs(shortfall)
        ),
        saving_bytes: None,
    }
}

/// bf16 activations.
pub fn bf16_activations() -> Remedy {
    Remedy {
        id: "bf16_activations",
        action: "run forward/backward under bf16 autocast".into(),
        why: "halves the bytes of every saved activation".into(),
        saving_bytes: None,
    }
}

/// Memory-efficient attention.
pub fn efficient_attention() -> Remedy {
    Remedy {
        id: "efficient_attention",
        action: "use memory-efficient attention (scaled_dot_product_attention / flash)".into(),
        why: "naive attention materialises B·H·S²·4 bytes of scores per layer; efficient kernels never do".into(),
        saving_bytes: None,
    }
}

/// Compute logits only where needed.
pub fn logits_to_keep() -> Remedy {
    Remedy {
        id: "logits_to_keep",
        action: "compute logits only for the positions the loss uses (logits_to_keep / last token for generation)".into(),
        why: "full logits are B·S·vocab values, often the largest single tensor of a language model".into(),
        saving_bytes: None,
    }
}

/// 8-bit or 4-bit weights.
pub fn quantized_weights() -> Remedy {
    Remedy {
        id: "quantized_weights",
        action: "load frozen weights in 8-bit or 4-bit (LoRA / QLoRA for fine-tuning)".into(),
        why: "weights shrink to 1/2 (8-bit) or 1/4 (4-bit) of bf16".into(),
        saving_bytes: None,
    }
}

/// First-layer-only loading for analysis jobs.
pub fn first_layers() -> Remedy {
    Remedy {
        id: "first_layers",
        action: "for analysis jobs, load only the embeddings, the layers you study and the final norm".into(),
        why: "an analysis of layer 0 needs none of the other layers' weights (≈97% less memory on a 32-layer model)".into(),
        saving_bytes: None,
    }
}

/// Fewer data-loader workers and less prefetch.
pub fn data_loader() -> Remedy {
    Remedy {
        id: "data_loader",
        action: "use fewer data-loader workers and a smaller prefetch factor".into(),
        why: "each worker holds its own copy of the dataset state plus prefetch_factor batches in host memory".into(),
        saving_bytes: None,
    }
}

/// Raise or respect the memory limit.
pub fn memory_limit(limit: Option<u128>, usage: Option<u128>) -> Remedy {
    let why = match (limit, usage) {
        (Some(l), Some(u)) => format!("the cgroup limit is {} and usage reached {}", b(l), b(u)),
        (Some(l), None) => format!("the cgroup limit is {}", b(l)),
        _ => "the kernel killed the largest process to free memory".into(),
    };
    Remedy {
        id: "memory_limit",
        action: "raise the container/cgroup memory limit, or lower host memory per process (pin_memory off, smaller shuffle buffers)".into(),
        why,
        saving_bytes: None,
    }
}

/// Measure where host memory goes.
pub fn profile_host() -> Remedy {
    Remedy {
        id: "profile",
        action: "run the job under memsight (`memsight run -- python train.py`, your command after `--`) to see which phase and step peak and whether live memory grows per step".into(),
        why: "the message alone does not say which allocations filled memory".into(),
        saving_bytes: None,
    }
}

/// A request too large for any setting.
pub fn shrink_request(requested: u128, capacity: Option<u128>, implausible: bool) -> Remedy {
    if implausible {
        return Remedy {
            id: "fix_size",
            action: "fix the size computation: the requested size is not a real tensor (an overflowed, negative or uninitialised length)".into(),
            why: format!("{requested} bytes is more memory than any machine has"),
            saving_bytes: None,
        };
    }
    Remedy {
        id: "chunk",
        action: "split the operation: process the batch, heads or sequence in chunks, or shard the tensor across devices (ZeRO-3/FSDP)".into(),
        why: match capacity {
            Some(c) => format!("one {} request cannot fit in {} no matter what else is freed", b(requested), b(c)),
            None => format!("one {} request cannot fit", b(requested)),
        },
        saving_bytes: None,
    }
}

/// An allocator cap below the device's free memory.
pub fn memory_fraction() -> Remedy {
    Remedy {
        id: "memory_fraction",
        action: "check torch.cuda.set_per_process_memory_fraction, MIG/vGPU slices and other caps on this process".into(),
        why: "the device reported enough free memory for the request".into(),
        saving_bytes: None,
    }
}

/// A leak to find.
pub fn find_leak(slope: f64) -> Remedy {
    Remedy {
        id: "leak",
        action: "find what keeps growing: tensors kept across steps (loss history without .item(), cached graphs), growing lists or caches".into(),
        why: format!("live memory grows by {} per step", fmt_bytes(slope.max(0.0) as u64)),
        saving_bytes: None,
    }
}

/// Runtime-specific settings for other frameworks.
pub fn framework(id: &'static str, action: &str, why: &str) -> Remedy {
    Remedy {
        id,
        action: action.into(),
        why: why.into(),
        saving_bytes: None,
    }
}

/// A request larger than all the memory the job could have: its size is the thing to check.
pub fn check_size(requested: u128, capacity: u128) -> Remedy {
    Remedy {
        id: "check_size",
        action: "check how the size was computed (a shape taken from data, a wrong dimension or \
                 dtype, a length read from a file)"
            .into(),
        why: format!(
            "one {} request is more than the {} this job can ever have",
            b(requested),
            b(capacity)
        ),
        saving_bytes: None,
    }
}

/// PyTorch: build a tensor too large for host memory in pieces.
pub fn torch_chunk() -> Remedy {
    Remedy {
        id: "torch_chunk",
        action: "build or process the tensor in pieces (torch.split / torch.chunk over the batch, \
                 a loop over slices written into a memory-mapped file with torch.from_file or \
                 numpy.memmap), or keep it on disk"
            .into(),
        why: "PyTorch's CPU allocator needs the whole tensor in one block of host memory".into(),
        saving_bytes: None,
    }
}

/// PyTorch: keep fewer CPU tensors alive.
pub fn torch_host_memory() -> Remedy {
    Remedy {
        id: "torch_host_memory",
        action: "keep fewer CPU tensors alive: drop references you no longer need (lists of \
                 outputs or losses kept across steps; call .item() on logged values), evaluate \
                 under torch.inference_mode(), and load checkpoints with torch.load(mmap=True) \
                 (from_pretrained(low_cpu_mem_usage=True))"
            .into(),
        why: "every live CPU tensor is host memory the failed request competed with; a loaded \
              checkpoint is held twice until the model takes its weights"
            .into(),
        saving_bytes: None,
    }
}

/// Raise or remove the process's address-space limit (`RLIMIT_AS`) that refused a request.
pub fn address_space_limit(limit: u128) -> Remedy {
    Remedy {
        id: "address_space_limit",
        action: "raise or remove the address-space limit (`ulimit -v unlimited` in the script \
                 that starts the job, `prlimit --as=unlimited`, the launcher's or scheduler's \
                 virtual-memory setting, a `resource.setrlimit(RLIMIT_AS, …)` in the code); to \
                 cap memory, use a memory cgroup (`systemd-run -p MemoryMax=…`, the container's \
                 memory limit) instead"
            .into(),
        why: format!(
            "the process's address-space limit is {}: it counts every mapping the process \
             reserves (thread stacks, allocator arenas, libraries), not the memory it uses, so it \
             refuses allocations while the machine has memory free",
            b(limit)
        ),
        saving_bytes: None,
    }
}

/// Reserve less address space: fewer allocator arenas and fewer threads.
pub fn virtual_size() -> Remedy {
    Remedy {
        id: "virtual_size",
        action: "reserve less address space: `MALLOC_ARENA_MAX=2` (glibc), fewer threads \
                 (`OMP_NUM_THREADS`, `torch.set_num_threads`)"
            .into(),
        why: "glibc reserves 64 MiB of address space per malloc arena (up to 8 per core) and \
              every thread an 8 MiB stack, reserved whether used or not"
            .into(),
        saving_bytes: None,
    }
}
