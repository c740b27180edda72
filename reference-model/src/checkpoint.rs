//! Reading a safetensors checkpoint tensor by tensor. The file starts with an 8-byte little-endian
//! header length and a JSON header (name → dtype, shape, byte range), so a model that needs a few
//! of the tensors (first-layer-only loading) seeks to those and reads only their bytes — never the
//! whole file, as `VarStore::load` does (it reads the file into memory, then copies every tensor).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use tch::{nn, Kind, Tensor};

/// Largest header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100_000_000;

/// Where one tensor is in the file.
#[derive(Debug)]
struct Entry {
    dtype: String,
    shape: Vec<i64>,
    /// Byte range within the data section.
    start: u64,
    end: u64,
}

/// An open checkpoint: its header parsed, no tensor data read yet.
pub struct Checkpoint {
    path: PathBuf,
    file: File,
    data_start: u64,
    entries: HashMap<String, Entry>,
}

fn parse_entry(name: &str, v: &serde_json::Value) -> Result<Entry, String> {
    let bad = || format!("tensor `{name}`: malformed header entry");
    let dtype = v["dtype"].as_str().ok_or_else(bad)?.to_string();
    let shape = v["shape"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|d| d.as_i64().ok_or_else(bad))
        .collect::<Result<Vec<i64>, String>>()?;
    let offsets = v["data_offsets"].as_array().ok_or_else(bad)?;
    let (start, end) = match offsets.as_slice() {
        [a, b] => (a.as_u64().ok_or_else(bad)?, b.as_u64().ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if end < start {
        return Err(bad());
    }
    Ok(Entry {
        dtype,
        shape,
        start,
        end,
    })
}

impl Checkpoint {
    /// Opens `path` and reads its header only.
    pub fn open(path: &Path) -> Result<Checkpoint, String> {
        let at = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = File::open(path).map_err(at)?;
        let len = file.metadata().map_err(at)?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|_| format!("{}: not a safetensors file (too short)", path.display()))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER || 8 + n > len {
            return Err(format!(
                "{}: not a safetensors file (header length {n})",
                path.display()
            ));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(at)?;
        let json: serde_json::Value = serde_json::from_slice(&header)
            .map_err(|e| format!("{}: safetensors header: {e}", path.display()))?;
        let map = json
            .as_object()
            .ok_or_else(|| format!("{}: safetensors header is not an object", path.display()))?;
        let entries = map
            .iter()
            .filter(|(k, _)| k.as_str() != "__metadata__")
            .map(|(k, v)| Ok((k.clone(), parse_entry(k, v)?)))
            .collect::<Result<HashMap<_, _>, String>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            file,
            data_start: 8 + n,
            entries,
        })
    }

    /// Reads tensor `name` (fp32) into `dst`, which must have its shape; returns the bytes read.
    pub fn read_into(&mut self, name: &str, dst: &mut Tensor) -> Result<u64, String> {
        let p = self.path.display();
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| format!("{p}: no tensor `{name}`"))?;
        if e.dtype != "F32" {
            return Err(format!(
                "{p}: tensor `{name}` is {}; only F32 checkpoints are read",
                e.dtype
            ));
        }
        if e.shape != dst.size() {
            return Err(format!(
                "{p}: tensor `{name}` has shape {:?}, the model expects {:?}",
                e.shape,
                dst.size()
            ));
        }
        let bytes = e.end - e.start;
        if bytes != dst.numel() as u64 * 4 {
            return Err(format!("{p}: tensor `{name}`: {bytes} bytes for its shape"));
        }
        self.file
            .seek(SeekFrom::Start(self.data_start + e.start))
            .map_err(|err| format!("{p}: {err}"))?;
        let mut buf = vec![0u8; bytes as usize];
        self.file
            .read_exact(&mut buf)
            .map_err(|err| format!("{p}: tensor `{name}`: {err}"))?;
        let t = Tensor::from_data_size(&buf, &e.shape, Kind::Float);
        drop(buf);
        tch::no_grad(|| dst.copy_(&t));
        Ok(bytes)
    }
}

/// Fills every variable of `vs` from the checkpoint at `path`, reading only those tensors;
/// returns the bytes read.
pub fn load_vars(vs: &nn::VarStore, path: &Path) -> Result<u64, String> {
    let mut ck = Checkpoint::open(path)?;
    let mut total = 0;
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, mut t) in vars {
        total += ck.read_into(&name, &mut t)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("memsight-ckpt-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn file_with_header(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    }

    #[test]
    fn reads_one_tensor_and_says_what_is_wrong_with_bad_files() {
        let h = r#"{"__metadata__":{},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}}"#;
        let mut bytes = file_with_header(h, 0);
        bytes.extend_from_slice(&1.5f32.to_le_bytes());
        bytes.extend_from_slice(&(-2.0f32).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 4]);
        let p = tmp("ok", &bytes);
        let mut ck = Checkpoint::open(&p).unwrap();
        let mut a = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        assert_eq!(ck.read_into("a", &mut a).unwrap(), 8);
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), vec![1.5, -2.0]);
        let err = |r: Result<u64, String>| r.unwrap_err();
        let mut wrong = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        assert!(err(ck.read_into("a", &mut wrong)).contains("has shape [2], the model expects [3]"));
        assert!(err(ck.read_into("b", &mut a)).contains("is BF16; only F32"));
        assert!(err(ck.read_into("c", &mut a)).contains("no tensor `c`"));
        std::fs::remove_file(&p).unwrap();

        for (name, bytes, want) in [
            (
                "short",
                b"abc".to_vec(),
                "not a safetensors file (too short)",
            ),
            (
                "huge",
                u64::MAX.to_le_bytes().to_vec(),
                "not a safetensors file (header length",
            ),
            ("json", file_with_header("{nope", 0), "safetensors header:"),
            (
                "entry",
                file_with_header(r#"{"a":{"dtype":"F32"}}"#, 0),
                "tensor `a`: malformed header entry",
            ),
        ] {
            let p = tmp(name, &bytes);
            let e = Checkpoint::open(&p).err().unwrap();
            assert!(e.contains(want), "{name}: {e}");
            std::fs::remove_file(&p).unwrap();
        }
    }
}
