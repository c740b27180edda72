//! A symbolized profile as pprof (gzipped `perftools.profiles.Profile` protobuf), which `pprof`,
//! speedscope and Grafana Pyroscope open: sample types `inuse_objects`/`inuse_space`, one location
//! per return address with its inlined frames as lines, functions and files already named.

use super::profile::Profile;
use super::symbolize::Frame;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;

/// Protobuf wire encoding: just what a Profile message needs.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }
    /// An int64/uint64/bool field (omitted when zero, as proto3 does).
    fn int(&mut self, field: u32, v: i64) {
        if v != 0 {
            self.key(field, 0);
            self.varint(v as u64);
        }
    }
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn msg(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }
    fn packed(&mut self, field: u32, vs: impl Iterator<Item = i64>) {
        let mut inner = Msg::default();
        for v in vs {
            inner.varint(v as u64);
        }
        self.bytes(field, &inner.0);
    }
}

#[derive(Default)]
struct Strings {
    index: HashMap<String, i64>,
    table: Vec<String>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.index.insert(String::new(), 0);
        }
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

fn value_type(strings: &mut Strings, ty: &str, unit: &str) -> Msg {
    let mut m = Msg::default();
    m.int(1, strings.id(ty));
    m.int(2, strings.id(unit));
    m
}

/// Encodes `profile` as a gzipped pprof protobuf.
pub fn encode(profile: &Profile, time_unix_ms: u64) -> Vec<u8> {
    let mut strings = Strings::default();
    strings.id("");
    let mut out = Msg::default();
    let objects = value_type(&mut strings, "inuse_objects", "count");
    out.msg(1, objects);
    let space = value_type(&mut strings, "inuse_space", "bytes");
    out.msg(1, space);

    let mut functions: HashMap<(String, Option<String>), u64> = HashMap::new();
    let mut function_msgs: Vec<Msg> = Vec::new();
    let mut locations: HashMap<u64, u64> = HashMap::new();
    let mut location_msgs: Vec<Msg> = Vec::new();
    let mut samples: Vec<Msg> = Vec::new();
    for stack in &profile.stacks {
        let mut ids = Vec::with_capacity(stack.locations.len());
        for loc in &stack.locations {
            let next = locations.len() as u64 + 1;
            let id = *locations.entry(loc.addr).or_insert_with(|| {
                let mut m = Msg::default();
                m.int(1, next as i64);
                m.int(3, loc.addr as i64);
                for f in &loc.frames {
                    let fid = function_id(f, &mut functions, &mut function_msgs, &mut strings);
                    let mut line = Msg::default();
                    line.int(1, fid as i64);
                    line.int(2, i64::from(f.line.unwrap_or(0)));
                    m.msg(4, line);
                }
                location_msgs.push(m);
                next
            });
            ids.push(id as i64);
        }
        let mut s = Msg::default();
        s.packed(1, ids.into_iter());
        s.packed(
            2,
            [stack.objects.round() as i64, stack.bytes.round() as i64].into_iter(),
        );
        samples.push(s);
    }
    for s in samples {
        out.msg(2, s);
    }
    for l in location_msgs {
        out.msg(4, l);
    }
    for f in function_msgs {
        out.msg(5, f);
    }
    let period_type = value_type(&mut strings, "space", "bytes");
    for s in &strings.table {
        out.bytes(6, s.as_bytes());
    }
    out.int(9, (time_unix_ms as i64).saturating_mul(1_000_000));
    out.msg(11, period_type);
    out.int(12, profile.sample_bytes as i64);
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = gz.write_all(&out.0);
    gz.finish().unwrap_or_default()
}

fn function_id(
    f: &Frame,
    ids: &mut HashMap<(String, Option<String>), u64>,
    msgs: &mut Vec<Msg>,
    strings: &mut Strings,
) -> u64 {
    let key = (f.function.clone(), f.file.clone());
    if let Some(&id) = ids.get(&key) {
        return id;
    }
    let id = ids.len() as u64 + 1;
    let mut m = Msg::default();
    m.int(1, id as i64);
    m.int(2, strings.id(&f.function));
    m.int(3, strings.id(&f.function));
    m.int(4, strings.id(f.file.as_deref().unwrap_or(&f.module)));
    msgs.push(m);
    ids.insert(key, id);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_protobuf_varints() {
        let mut m = Msg::default();
        m.varint(300);
        assert_eq!(m.0, vec![0xac, 0x02]);
        let mut m = Msg::default();
        m.int(1, 0);
        assert!(m.0.is_empty(), "proto3 omits zero scalars");
        m.int(12, 524_288);
        assert_eq!(m.0[0], 12 << 3);
    }
}
