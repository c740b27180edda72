//! A heap dump in jemalloc's `heap_v2` text (memsight's sampler writes it; so does jemalloc's
//! `prof.dump`): sampled stacks with their
//! live objects and bytes, and the process's memory map at dump time (for symbolizing later,
//! also in another process).
//!
//! A profile is untrusted input: what reading and symbolizing it may cost in memory is bounded by
//! its size ([`memory_budget`]), stacks are at most [`MAX_STACK_DEPTH`] deep and mapped paths at
//! most [`MAX_PATH_BYTES`] long; a profile over a limit is refused with a clear error.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The deepest stack a profile may hold (jemalloc records at most 128 frames, memsight 64).
pub const MAX_STACK_DEPTH: usize = 1024;
/// The longest mapped file path (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// Memory that reading and symbolizing a profile of `len` bytes may take: 8 times its size plus
/// 16 MiB. Profiles that memsight or jemalloc write need a fraction of it.
pub fn memory_budget(len: usize) -> usize {
    len.saturating_mul(8).saturating_add(16 << 20)
}

/// Estimated memory per return address in a stack: the parsed address and its symbolized location.
const COST_PER_ADDRESS: usize = 32;
/// Estimated memory per stack: its parsed and symbolized records.
const COST_PER_STACK: usize = 160;
/// Estimated memory per distinct return address: its cached frame, plus twice its module's file
/// name (in the frame's module and function names).
const COST_PER_DISTINCT_ADDRESS: usize = 200;
/// Estimated memory per executable mapping, plus its path.
const COST_PER_MAPPING: usize = 256;

/// What a profile being parsed will cost, against its budget.
struct Cost {
    stacks: usize,
    addresses: usize,
    distinct: HashSet<u64>,
    bytes: usize,
    budget: usize,
    len: usize,
}

impl Cost {
    fn add(&mut self, bytes: usize) -> Result<(), String> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes <= self.budget {
            return Ok(());
        }
        Err(format!(
            "too large to read: its {} stacks of {} return addresses ({} distinct) would take more \
             than the {} MiB memsight allows for a {}-byte profile (8 times its size + 16 MiB; \
             profiles that memsight or jemalloc write take a fraction of that)",
            self.stacks,
            self.addresses,
            self.distinct.len(),
            self.budget >> 20,
            self.len
        ))
    }

    fn stack(&mut self, addrs: &[u64]) -> Result<(), String> {
        self.stacks += 1;
        self.addresses += addrs.len();
        let fresh = addrs.iter().filter(|&&a| self.distinct.insert(a)).count();
        self.add(
            COST_PER_STACK
                .saturating_add(addrs.len().saturating_mul(COST_PER_ADDRESS))
                .saturating_add(fresh.saturating_mul(COST_PER_DISTINCT_ADDRESS)),
        )
    }
}

/// A stack line's addresses (after its `@`), at most [`MAX_STACK_DEPTH`] of them.
fn parse_addrs(rest: &str, line: usize) -> Result<Vec<u64>, String> {
    let mut addrs = Vec::new();
    for w in rest.split_ascii_whitespace() {
        if addrs.len() == MAX_STACK_DEPTH {
            return Err(format!(
                "a stack deeper than {MAX_STACK_DEPTH} frames on line {line} (jemalloc records at \
                 most 128)"
            ));
        }
        let a = u64::from_str_radix(w.trim_start_matches("0x"), 16)
            .map_err(|_| format!("bad address on line {line}"))?;
        addrs.push(a);
    }
    addrs.shrink_to_fit();
    Ok(addrs)
}

/// One sampled call stack and what it holds now.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledStack {
    /// Return addresses, innermost (the allocator) first.
    pub addrs: Vec<u64>,
    /// Estimated live objects (the sampled count, unbiased).
    pub objects: f64,
    /// Estimated live bytes (the sampled bytes, unbiased as jeprof does).
    pub bytes: f64,
}

/// One file-backed executable mapping of the dumped process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// The mapped file.
    pub path: PathBuf,
    /// Its inode then (a rebuilt binary has a new one: its symbols would be wrong).
    pub inode: u64,
}

/// A Python frame of the dumped process's stacks (the `PYTHON_FRAMES:` section): a tagged word of
/// a stack stands for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonFrame {
    /// The function's qualified name.
    pub function: String,
    /// Its file (`co_filename`).
    pub file: String,
    /// The line running (0: unknown).
    pub line: u32,
}

/// A parsed heap dump.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeapDump {
    /// Mean bytes between samples.
    pub sample_bytes: u64,
    /// Every stack with live sampled allocations.
    pub stacks: Vec<SampledStack>,
    /// Executable file mappings, sorted by start address.
    pub mappings: Vec<Mapping>,
    /// The Python frames the stacks name, by their word.
    pub python: HashMap<u64, PythonFrame>,
}

impl HeapDump {
    /// Reads and parses a dump file: a regular file of at most
    /// [`memsight_format::input::MAX_HEAP_PROFILE_BYTES`].
    pub fn read(path: &Path) -> Result<HeapDump, String> {
        use memsight_format::input;
        let text = input::read_to_string(path, input::MAX_HEAP_PROFILE_BYTES)
            .map_err(|e| format!("cannot read heap profile {}: {e}", path.display()))?;
        HeapDump::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses `heap_v2` text.
    pub fn parse(text: &str) -> Result<HeapDump, String> {
        let mut lines = text.lines().enumerate();
        let first = lines.next().map(|(_, l)| l.trim()).unwrap_or("");
        let rate = first.strip_prefix("heap_v2/").ok_or_else(|| {
            format!("not a jemalloc heap profile (first line {first:?}, expected heap_v2/RATE)")
        })?;
        let sample_bytes: u64 = rate
            .parse()
            .map_err(|_| format!("bad sampling rate {rate:?} on line 1"))?;
        if sample_bytes == 0 {
            return Err("sampling rate 0 on line 1".into());
        }
        let mut dump = HeapDump {
            sample_bytes,
            ..HeapDump::default()
        };
        let mut cost = Cost {
            stacks: 0,
            addresses: 0,
            distinct: HashSet::new(),
            bytes: 0,
            budget: memory_budget(text.len()),
            len: text.len(),
        };
        let mut pending: Option<Vec<u64>> = None;
        let mut in_maps = false;
        let mut in_python = false;
        for (i, raw) in lines {
            // A Python frame's line keeps its tabs (file names may hold blanks).
            let line = if in_python && !in_maps {
                raw.trim_end_matches(['\r', '\n'])
            } else {
                raw.trim()
            };
            if in_maps {
                if let Some(m) = parse_mapping(line) {
                    let path = m.path.as_os_str().len();
                    if path > MAX_PATH_BYTES {
                        return Err(format!(
                            "a mapped path of {path} bytes on line {} (over Linux's {MAX_PATH_BYTES})",
                            i + 1
                        ));
                    }
                    cost.add(COST_PER_MAPPING + path)?;
                    dump.mappings.push(m);
                }
                continue;
            }
            if in_python && !line.is_empty() && line.trim() != "MAPPED_LIBRARIES:" {
                let (word, frame) = parse_python_frame(line)
                    .ok_or_else(|| format!("bad Python frame on line {}", i + 1))?;
                cost.add(COST_PER_MAPPING + frame.function.len() + frame.file.len())?;
                dump.python.insert(word, frame);
                continue;
            }
            if line == "MAPPED_LIBRARIES:" {
                in_maps = true;
            } else if line == "PYTHON_FRAMES:" {
                in_python = true;
            } else if let Some(rest) = line.strip_prefix('@') {
                let addrs = parse_addrs(rest, i + 1)?;
                cost.stack(&addrs)?;
                pending = Some(addrs);
            } else if let Some(rest) = line.strip_prefix("t*:") {
                // "t*: OBJS: BYTES [ACCUM_OBJS: ACCUM_BYTES]": the all-threads total.
                let Some(addrs) = pending.take() else {
                    continue; // the header's process-wide total
                };
                let (objs, bytes) =
                    parse_counts(rest).ok_or_else(|| format!("bad counts on line {}", i + 1))?;
                if objs > 0.0 && bytes > 0.0 {
                    let scale = unbias(bytes / objs, sample_bytes as f64);
                    dump.stacks.push(SampledStack {
                        addrs,
                        objects: objs * scale,
                        bytes: bytes * scale,
                    });
                }
            }
        }
        if pending.is_some() {
            return Err("the file ends inside a stack (truncated dump?)".into());
        }
        // Sorted, for `mapping_of`'s binary search; then each distinct address's module name.
        dump.mappings.sort_by_key(|m| m.start);
        for &a in &cost.distinct {
            let name = dump
                .mapping_of(a)
                .and_then(|m| m.path.file_name())
                .map_or(0, |n| n.len());
            cost.bytes = cost.bytes.saturating_add(name * 2);
        }
        cost.add(0)?;
        Ok(dump)
    }

    /// The estimated live bytes over all stacks.
    pub fn total_bytes(&self) -> f64 {
        self.stacks.iter().map(|s| s.bytes).sum()
    }

    /// The mapping holding `addr` (found by binary search: [`HeapDump::parse`] leaves the mappings
    /// sorted by start address).
    pub fn mapping_of(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        self.mappings[..i]
            .last()
            .filter(|m| m.start <= addr && addr < m.end)
    }
}

/// jeprof's correction: an allocation of `mean` bytes is sampled with probability
/// `1 - exp(-mean / rate)`.
fn unbias(mean: f64, rate: f64) -> f64 {
    let p = 1.0 - (-mean / rate).exp();
    if p > 0.0 {
        1.0 / p
    } else {
        1.0
    }
}

/// A `PYTHON_FRAMES:` line: `word<TAB>line<TAB>function<TAB>file`.
fn parse_python_frame(line: &str) -> Option<(u64, PythonFrame)> {
    let mut parts = line.splitn(4, '\t');
    let word = parts.next()?.trim();
    let word = u64::from_str_radix(word.strip_prefix("0x")?, 16).ok()?;
    let line_no = parts.next()?.trim().parse().ok()?;
    let function = parts.next()?.to_string();
    let file = parts.next()?.to_string();
    (function.len() <= MAX_PATH_BYTES && file.len() <= MAX_PATH_BYTES).then_some((
        word,
        PythonFrame {
            function,
            file,
            line: line_no,
        },
    ))
}

fn parse_counts(rest: &str) -> Option<(f64, f64)> {
    let mut words = rest.split_ascii_whitespace();
    let objs = words.next()?.trim_end_matches(':').parse().ok()?;
    let bytes = words.next()?.parse().ok()?;
    Some((objs, bytes))
}

/// A `/proc/PID/maps` line of an executable file mapping.
fn parse_mapping(line: &str) -> Option<Mapping> {
    let mut words = line.split_ascii_whitespace();
    let range = words.next()?;
    let perms = words.next()?;
    let offset = words.next()?;
    let _dev = words.next()?;
    let inode = words.next()?.parse().ok()?;
    let path: Vec<&str> = words.collect();
    if !perms.contains('x') || path.is_empty() || !path[0].starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path: PathBuf::from(path.join(" ")),
        inode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "heap_v2/524288
  t*: 3: 3145728 [0: 0]
  t0: 3: 3145728 [0: 0]
@ 0x55d0000010a0 0x55d000001200 0x7f0000002100
  t*: 2: 2097152 [0: 0]
  t0: 2: 2097152 [0: 0]
@ 0x55d0000010a0 0x55d000001300
  t*: 1: 16 [0: 0]

MAPPED_LIBRARIES:
55d000000000-55d000001000 r--p 00000000 fe:00 1 /opt/job/train
55d000001000-55d000002000 r-xp 00001000 fe:00 1 /opt/job/train
7f0000002000-7f0000003000 r-xp 00002000 fe:00 2 /lib/libc.so.6
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
";

    #[test]
    fn reads_the_python_frames_of_a_dump() {
        let text = "heap_v2/524288\n  t*: 1: 100 [0: 0]\n@ 0x10 0x800000000100000c\n  t*: 1: 100 [0: 0]\n\n\
PYTHON_FRAMES:\n0x800000000100000c\t12\tModel.forward\t/a dir/model.py\n\n\
MAPPED_LIBRARIES:\n1000-2000 r-xp 00000000 fe:00 1 /bin/x\n";
        let d = HeapDump::parse(text).unwrap();
        let f = &d.python[&0x8000_0000_0100_000c];
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("Model.forward", "/a dir/model.py", 12)
        );
        assert_eq!(d.mappings.len(), 1);
        assert!(HeapDump::parse("heap_v2/8\nPYTHON_FRAMES:\nnot a frame\n").is_err());
    }

    #[test]
    fn parses_stacks_and_executable_mappings() {
        let d = HeapDump::parse(SAMPLE).unwrap();
        assert_eq!(d.sample_bytes, 524_288);
        assert_eq!(d.stacks.len(), 2);
        assert_eq!(
            d.stacks[0].addrs,
            vec![0x55d0000010a0, 0x55d000001200, 0x7f0000002100]
        );
        // 1 MiB allocations are sampled with probability 1 - e^-2: the estimate is scaled up.
        let expect = 2_097_152.0 / (1.0 - (-2.0f64).exp());
        assert!((d.stacks[0].bytes - expect).abs() < 1.0);
        // A 16-byte allocation stands for about rate / 16 objects' bytes.
        assert!((d.stacks[1].bytes - 524_288.0).abs() < 16.0);
        assert_eq!(d.mappings.len(), 2);
        assert_eq!(
            d.mapping_of(0x55d000001200).unwrap().path,
            Path::new("/opt/job/train")
        );
        assert!(d.mapping_of(0x55d000000100).is_none());
    }

    #[test]
    fn refuses_what_is_not_a_heap_profile() {
        assert!(HeapDump::parse("hello")
            .unwrap_err()
            .contains("not a jemalloc heap profile"));
        assert!(HeapDump::parse("heap_v2/x")
            .unwrap_err()
            .contains("bad sampling rate"));
        assert!(HeapDump::parse("heap_v2/8\n@ 0x10 zz\n")
            .unwrap_err()
            .contains("line 2"));
        assert!(HeapDump::parse("heap_v2/8\n@ 0x10\n")
            .unwrap_err()
            .contains("truncated"));
    }

    #[test]
    fn limits_hold_whatever_the_file_claims() {
        let deep = format!("heap_v2/8\n@{}\n  t*: 1: 8 [0: 0]\n", " 0".repeat(1025));
        let e = HeapDump::parse(&deep).unwrap_err();
        assert!(e.contains("deeper than 1024 frames on line 2"), "{e}");
        let path = format!(
            "heap_v2/8\nMAPPED_LIBRARIES:\n1000-2000 r-xp 00000000 fe:00 1 /{}\n",
            "a".repeat(5000)
        );
        let e = HeapDump::parse(&path).unwrap_err();
        assert!(e.contains("mapped path of 5001 bytes"), "{e}");
        // Stacks of distinct short addresses: far more memory than the text's size allows.
        let mut wide = String::from("heap_v2/8\n");
        for i in 0..200_000u32 {
            wide.push_str(&format!("@ {i:x}\n t*: 1: 8\n"));
        }
        let e = HeapDump::parse(&wide).unwrap_err();
        assert!(e.contains("too large to read"), "{e}");
        // The sample (and what memsight writes) is far within its budget.
        assert!(HeapDump::parse(SAMPLE).is_ok());
    }

    #[test]
    fn mappings_are_found_in_any_order() {
        let text = "heap_v2/8\nMAPPED_LIBRARIES:\n\
            3000-4000 r-xp 00000000 fe:00 1 /b\n\
            1000-2000 r-xp 00000000 fe:00 1 /a\n";
        let d = HeapDump::parse(text).unwrap();
        assert_eq!(d.mapping_of(0x1800).unwrap().path, Path::new("/a"));
        assert_eq!(d.mapping_of(0x3000).unwrap().path, Path::new("/b"));
        assert!(d.mapping_of(0x2800).is_none());
        assert!(d.mapping_of(0x800).is_none());
    }
}
