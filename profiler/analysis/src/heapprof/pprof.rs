//! A symbolized profile as pprof (gzipped `perftools.profiles.Profile` protobuf), which `pprof`,
//! speedscope and Grafana Pyroscope open: sample types `inuse_objects`/`inuse_space`, one location
//! per return address with its inlined frames as lines, functions and files already named.

use super::profile::Profile;
use super::symbolize::Frame;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;

/// The messages of pprof's `profile.proto` (package `perftools.profiles`) that a heap profile
/// uses, declared for prost, which encodes them (field numbers and types as in the .proto).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
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

fn value_type(strings: &mut Strings, ty: &str, unit: &str) -> proto::ValueType {
    proto::ValueType {
        r#type: strings.id(ty),
        unit: strings.id(unit),
    }
}

/// Encodes `profile` as a gzipped pprof protobuf.
pub fn encode(profile: &Profile, time_unix_ms: u64) -> Vec<u8> {
    let mut strings = Strings::default();
    strings.id("");
    let sample_type = vec![
        value_type(&mut strings, "inuse_objects", "count"),
        value_type(&mut strings, "inuse_space", "bytes"),
    ];
    let mut functions: HashMap<(String, Option<String>), u64> = HashMap::new();
    let mut function_msgs: Vec<proto::Function> = Vec::new();
    let mut locations: HashMap<u64, u64> = HashMap::new();
    let mut location_msgs: Vec<proto::Location> = Vec::new();
    let mut samples: Vec<proto::Sample> = Vec::new();
    for stack in &profile.stacks {
        let mut ids = Vec::with_capacity(stack.locations.len());
        for loc in &stack.locations {
            let next = locations.len() as u64 + 1;
            let id = *locations.entry(loc.addr).or_insert_with(|| {
                let line = loc
                    .frames
                    .iter()
                    .map(|f| proto::Line {
                        function_id: function_id(
                            f,
                            &mut functions,
                            &mut function_msgs,
                            &mut strings,
                        ),
                        line: i64::from(f.line.unwrap_or(0)),
                    })
                    .collect();
                location_msgs.push(proto::Location {
                    id: next,
                    address: loc.addr,
                    line,
                });
                next
            });
            ids.push(id);
        }
        samples.push(proto::Sample {
            location_id: ids,
            value: vec![stack.objects.round() as i64, stack.bytes.round() as i64],
        });
    }
    let period_type = Some(value_type(&mut strings, "space", "bytes"));
    let message = proto::Profile {
        sample_type,
        sample: samples,
        location: location_msgs,
        function: function_msgs,
        string_table: strings.table,
        time_nanos: (time_unix_ms as i64).saturating_mul(1_000_000),
        period_type,
        period: profile.sample_bytes as i64,
    };
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = gz.write_all(&prost::Message::encode_to_vec(&message));
    gz.finish().unwrap_or_default()
}

fn function_id(
    f: &Frame,
    ids: &mut HashMap<(String, Option<String>), u64>,
    msgs: &mut Vec<proto::Function>,
    strings: &mut Strings,
) -> u64 {
    let key = (f.function.clone(), f.file.clone());
    if let Some(&id) = ids.get(&key) {
        return id;
    }
    let id = ids.len() as u64 + 1;
    let name = strings.id(&f.function);
    msgs.push(proto::Function {
        id,
        name,
        system_name: name,
        filename: strings.id(f.file.as_deref().unwrap_or(&f.module)),
    });
    ids.insert(key, id);
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heapprof::profile::{Location, Stack};
    use std::io::Read;

    #[test]
    fn a_profile_round_trips_through_the_protobuf() {
        let frame = |name: &str| Frame {
            function: name.into(),
            file: Some("/src/app/main.rs".into()),
            line: Some(7),
            rust: true,
            module: "app".into(),
            python: false,
        };
        let p = Profile {
            sample_bytes: 524_288,
            stacks: vec![Stack {
                locations: vec![Location {
                    addr: 0x1234,
                    frames: vec![frame("app::inner"), frame("app::outer")].into(),
                }],
                bytes: 2048.0,
                objects: 2.0,
            }],
        };
        let gz = encode(&p, 1_000);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz.as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let back = <proto::Profile as prost::Message>::decode(raw.as_slice()).unwrap();
        assert_eq!(back.period, 524_288);
        assert_eq!(back.string_table[0], "");
        assert_eq!(back.sample[0].value, vec![2, 2048]);
        let loc = &back.location[0];
        assert_eq!((loc.address, loc.line.len()), (0x1234, 2));
        let f = &back.function[(loc.line[0].function_id - 1) as usize];
        assert_eq!(back.string_table[f.name as usize], "app::inner");
        assert_eq!(back.time_nanos, 1_000_000_000);
    }
}
