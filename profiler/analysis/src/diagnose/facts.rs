//! The facts of one OOM message: an ordered map from the corpus's field names to values.
//! Sizes are integers wide enough for the corpus's 2^64-byte trap.

use serde::ser::{SerializeMap, SerializeStruct, Serializer};
use serde::Serialize;

/// One GPU process from a `Process P has M memory in use` clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u64,
    /// Device memory it holds.
    pub bytes: u128,
}

impl Serialize for GpuProcess {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("GpuProcess", 2)?;
        st.serialize_field("pid", &self.pid)?;
        st.serialize_field("bytes", &self.bytes)?;
        st.end()
    }
}

/// A fact's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Fact {
    /// An integer: bytes, ids, counts (signed: `oom_score_adj` can be negative).
    Int(i128),
    /// A decimal such as a percentage.
    Float(f64),
    /// Text such as a process name or error string.
    Text(String),
    /// A flag such as `global_oom`.
    Bool(bool),
    /// A list of integers (a tensor shape).
    Ints(Vec<i128>),
    /// GPU processes in text order.
    Processes(Vec<GpuProcess>),
}

impl Serialize for Fact {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Fact::Int(v) => s.serialize_i128(*v),
            Fact::Float(v) => s.serialize_f64(*v),
            Fact::Text(v) => s.serialize_str(v),
            Fact::Bool(v) => s.serialize_bool(*v),
            Fact::Ints(v) => v.serialize(s),
            Fact::Processes(v) => v.serialize(s),
        }
    }
}

/// Field name → value, in the order the text states them; each name at most once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts(Vec<(&'static str, Fact)>);

impl Facts {
    /// Sets `name` (replacing an earlier value).
    pub fn set(&mut self, name: &'static str, value: Fact) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }

    /// Sets an integer fact.
    pub fn int(&mut self, name: &'static str, v: impl Into<i128>) {
        self.set(name, Fact::Int(v.into()));
    }

    /// Sets an integer fact when it is known.
    pub fn opt_int(&mut self, name: &'static str, v: Option<i128>) {
        if let Some(v) = v {
            self.int(name, v);
        }
    }

    /// Sets a text fact when it is known.
    pub fn opt_text(&mut self, name: &'static str, v: Option<&str>) {
        if let Some(v) = v {
            self.text(name, v);
        }
    }

    /// Sets a text fact.
    pub fn text(&mut self, name: &'static str, v: impl Into<String>) {
        self.set(name, Fact::Text(v.into()));
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&Fact> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// An integer fact as bytes (`None` when absent, negative or not an integer).
    pub fn bytes(&self, name: &str) -> Option<u128> {
        match self.get(name)? {
            Fact::Int(v) => u128::try_from(*v).ok(),
            _ => None,
        }
    }

    /// A text fact.
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            Fact::Text(v) => Some(v),
            _ => None,
        }
    }

    /// The GPU processes, or an empty list.
    pub fn processes(&self) -> &[GpuProcess] {
        match self.get("processes") {
            Some(Fact::Processes(p)) => p,
            _ => &[],
        }
    }

    /// Every (name, value), in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Fact)> {
        self.0.iter().map(|(n, v)| (*n, v))
    }

    /// Number of facts.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no fact is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `other` can join these facts: no name with a different value.
    pub(crate) fn agrees_with(&self, other: &Facts) -> bool {
        other
            .iter()
            .all(|(n, v)| self.get(n).is_none_or(|mine| mine == v))
    }

    /// Adds `other`'s facts that are not here yet.
    pub(crate) fn absorb(&mut self, other: Facts) {
        for (n, v) in other.0 {
            if self.get(n).is_none() {
                self.0.push((n, v));
            }
        }
    }
}

impl Serialize for Facts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (n, v) in &self.0 {
            m.serialize_entry(n, v)?;
        }
        m.end()
    }
}
