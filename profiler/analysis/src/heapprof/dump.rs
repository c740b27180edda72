//! A heap dump in jemalloc's `heap_v2` text (memsight's sampler writes it; so does jemalloc's
//! `prof.dump`): sampled stacks with their
//! live objects and bytes, and the process's memory map at dump time (for symbolizing later,
//! also in another process).

use std::path::{Path, PathBuf};

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

/// A parsed heap dump.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeapDump {
    /// Mean bytes between samples.
    pub sample_bytes: u64,
    /// Every stack with live sampled allocations.
    pub stacks: Vec<SampledStack>,
    /// Executable file mappings.
    pub mappings: Vec<Mapping>,
}

impl HeapDump {
    /// Reads and parses a dump file.
    pub fn read(path: &Path) -> Result<HeapDump, String> {
        let err =
            |e: &dyn std::fmt::Display| format!("cannot read heap profile {}: {e}", path.display());
        let meta = std::fs::metadata(path).map_err(|e| err(&e))?;
        if !meta.is_file() {
            return Err(err(&"not a regular file"));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(&e))?;
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
        let mut pending: Option<Vec<u64>> = None;
        let mut in_maps = false;
        for (i, line) in lines {
            let line = line.trim();
            if in_maps {
                if let Some(m) = parse_mapping(line) {
                    dump.mappings.push(m);
                }
                continue;
            }
            if line == "MAPPED_LIBRARIES:" {
                in_maps = true;
            } else if let Some(rest) = line.strip_prefix('@') {
                let addrs = rest
                    .split_ascii_whitespace()
                    .map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| format!("bad address on line {}", i + 1))?;
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
        Ok(dump)
    }

    /// The estimated live bytes over all stacks.
    pub fn total_bytes(&self) -> f64 {
        self.stacks.iter().map(|s| s.bytes).sum()
    }

    /// The mapping holding `addr`.
    pub fn mapping_of(&self, addr: u64) -> Option<&Mapping> {
        self.mappings
            .iter()
            .find(|m| m.start <= addr && addr < m.end)
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
}
