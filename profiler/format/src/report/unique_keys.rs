//! A report's JSON read for keys given twice in one object. A JSON parser keeps one of them
//! silently (serde_json the last), so a report edited or joined by hand — a second `peaks` pasted
//! in — would be read with figures nobody measured and gated on them. memsight writes each key
//! once; a report with a key twice is refused, the key named by its path.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The path of the first key found twice in one object (`peaks.heap_peak_bytes`,
/// `timeline[3].step`), or none; an error when the bytes are not JSON.
pub(crate) fn first_duplicate(bytes: &[u8]) -> Result<Option<String>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Walk { at: At::Root }.deserialize(&mut de)
}

/// Where a value is: built as the walk descends, written out only for a duplicate.
#[derive(Clone, Copy)]
enum At<'p> {
    Root,
    Key(&'p At<'p>, &'p str),
    Index(&'p At<'p>, usize),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Root => Ok(()),
            At::Key(At::Root, key) => write!(f, "{key}"),
            At::Key(parent, key) => write!(f, "{parent}.{key}"),
            At::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Walks one value; yields the first duplicate's path below it.
struct Walk<'p> {
    at: At<'p>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut i = 0;
        loop {
            if found.is_some() {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                continue;
            }
            let at = At::Index(&self.at, i);
            match seq.next_element_seed(Walk { at })? {
                Some(below) => found = below,
                None => break,
            }
            i += 1;
        }
        Ok(found)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut keys: HashSet<String> = HashSet::new();
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if found.is_some() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if keys.contains(&key) {
                found = Some(At::Key(&self.at, &key).to_string());
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            found = map.next_value_seed(Walk {
                at: At::Key(&self.at, &key),
            })?;
            keys.insert(key);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::first_duplicate;

    #[test]
    fn a_key_given_twice_is_found_by_its_path() {
        let twice = br#"{"a": 1, "b": {"c": [1, {"d": 1, "e": 2, "d": 3}]}}"#;
        assert_eq!(first_duplicate(twice).unwrap().as_deref(), Some("b.c[1].d"));
        let top = br#"{"peaks": {"x": 1}, "y": 2, "peaks": {"x": 5}}"#;
        assert_eq!(first_duplicate(top).unwrap().as_deref(), Some("peaks"));
        let once = br#"{"a": {"k": 1}, "b": {"k": 1}, "c": [{"k": 1}, {"k": 2}]}"#;
        assert_eq!(first_duplicate(once).unwrap(), None);
        assert!(first_duplicate(b"{\"a\": ").is_err());
    }
}
