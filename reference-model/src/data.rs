//! Byte-level tokenizer, the shipped corpus, and a data loader whose worker threads prepare random
//! (input, target) windows ahead of the training loop. Worker `w` makes batches w, w+W, w+2W, …
//! from its own seeded generator and the loop takes them round-robin, so the batch sequence is the
//! same for any worker count and prefetch depth (only memory and speed change).

use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The corpus shipped in the repository (see reference-model/data/SOURCE.md).
pub const CORPUS: &str = include_str!("../data/rust-book.txt");

/// Byte-level tokens of `text` (vocabulary 256).
pub fn encode(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

/// Text of byte tokens (invalid UTF-8 replaced).
pub fn decode(tokens: &[u8]) -> String {
    String::from_utf8_lossy(tokens).into_owned()
}

/// Tokens shared with the loader's workers.
pub type Tokens = Arc<Vec<u8>>;

/// The corpus split 90/10 into train and validation tokens; `path` replaces the shipped corpus.
pub fn load(path: Option<&Path>) -> Result<(Tokens, Tokens), String> {
    let tokens = match path {
        Some(p) => std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => encode(CORPUS),
    };
    if tokens.len() < 1024 {
        return Err(format!(
            "corpus too small: {} bytes (need at least 1024)",
            tokens.len()
        ));
    }
    let cut = tokens.len() * 9 / 10;
    Ok((
        Arc::new(tokens[..cut].to_vec()),
        Arc::new(tokens[cut..].to_vec()),
    ))
}

/// One batch as host vectors: inputs and next-token targets, row-major (batch × seq).
pub struct HostBatch {
    /// Inputs.
    pub x: Vec<i64>,
    /// Targets (inputs shifted by one).
    pub y: Vec<i64>,
    /// Rows.
    pub batch: i64,
    /// Columns.
    pub seq: i64,
}

impl HostBatch {
    /// As (B, S) int64 tensors on `device`.
    pub fn tensors(&self, device: tch::Device) -> (tch::Tensor, tch::Tensor) {
        let f = |v: &[i64]| {
            tch::Tensor::from_slice(v)
                .view([self.batch, self.seq])
                .to_device(device)
        };
        (f(&self.x), f(&self.y))
    }
}

/// SplitMix64: small, seedable, good enough to pick windows.
fn split_mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Batch number `n` of the stream seeded with `seed`: random windows of `seq + 1` tokens.
pub fn make_batch(tokens: &[u8], seed: u64, n: u64, batch: i64, seq: i64) -> HostBatch {
    let mut st = seed ^ n.wrapping_mul(0xA24B_AED4_963E_E407);
    let span = (tokens.len() as u64).saturating_sub(seq as u64 + 1).max(1);
    let mut x = Vec::with_capacity((batch * seq) as usize);
    let mut y = Vec::with_capacity((batch * seq) as usize);
    for _ in 0..batch {
        let i = (split_mix(&mut st) % span) as usize;
        let w = &tokens[i..i + seq as usize + 1];
        x.extend(w[..seq as usize].iter().map(|&t| t as i64));
        y.extend(w[1..].iter().map(|&t| t as i64));
    }
    HostBatch { x, y, batch, seq }
}

/// Worker threads preparing batches ahead of the loop.
pub struct Loader {
    queues: Vec<Receiver<HostBatch>>,
    workers: Vec<JoinHandle<()>>,
    next: usize,
}

impl Loader {
    /// Starts `workers` threads, each keeping up to `prefetch` batches ready.
    pub fn new(
        tokens: Arc<Vec<u8>>,
        seed: u64,
        batch: i64,
        seq: i64,
        workers: usize,
        prefetch: usize,
    ) -> Loader {
        Loader::starting_at(0, tokens, seed, batch, seq, workers, prefetch)
    }

    /// A loader whose first batch is batch `first` of the sequence (a resumed run goes on with
    /// the batches it would have had).
    pub fn starting_at(
        first: u64,
        tokens: Arc<Vec<u8>>,
        seed: u64,
        batch: i64,
        seq: i64,
        workers: usize,
        prefetch: usize,
    ) -> Loader {
        let mut queues = Vec::new();
        let mut handles = Vec::new();
        for w in 0..workers.max(1) {
            let (tx, rx) = sync_channel(prefetch.max(1));
            let tokens = Arc::clone(&tokens);
            let stride = workers.max(1) as u64;
            let spawned = std::thread::Builder::new()
                .name(format!("loader-{w}"))
                .spawn(move || {
                    let mut n = first + w as u64;
                    while tx.send(make_batch(&tokens, seed, n, batch, seq)).is_ok() {
                        n += stride;
                    }
                });
            if let Ok(h) = spawned {
                queues.push(rx);
                handles.push(h);
            }
        }
        Loader {
            queues,
            workers: handles,
            next: 0,
        }
    }

    /// The next batch (round-robin over workers); `None` if every worker is gone.
    pub fn next_batch(&mut self) -> Option<HostBatch> {
        if self.queues.is_empty() {
            return None;
        }
        let q = &self.queues[self.next % self.queues.len()];
        self.next += 1;
        q.recv().ok()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the receivers ends each worker at its next send.
        self.queues.clear();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}
