//! A cursor over one object of the input that records which fields were read, so that every field
//! the conversion did not use is reported instead of silently dropped.

use serde_norway::{Mapping, Value};

use super::notes::Notes;

/// The fields of one input mapping at `path`.
pub struct Fields<'a> {
    map: &'a Mapping,
    path: String,
    used: Vec<String>,
}

impl<'a> Fields<'a> {
    /// The fields of `map`, found at `path` (empty for the document root).
    pub fn new(map: &'a Mapping, path: impl Into<String>) -> Self {
        Self {
            map,
            path: path.into(),
            used: Vec::new(),
        }
    }

    /// The fields of `value` at `path`; `None`, with a note, when it is not a mapping.
    pub fn of(value: &'a Value, path: impl Into<String>, notes: &mut Notes) -> Option<Self> {
        let path = path.into();
        match value {
            Value::Mapping(map) => Some(Self::new(map, path)),
            Value::Null => None,
            _ => {
                notes.warn(path, "is not an object; not carried over");
                None
            }
        }
    }

    /// This mapping's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path of field `key` of this mapping.
    pub fn at(&self, key: &str) -> String {
        let key = super::notes::segment(key);
        if self.path.is_empty() {
            key
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Field `key`, marked as used; `None` when absent or null.
    pub fn value(&mut self, key: &str) -> Option<&'a Value> {
        let v = self.map.get(key)?;
        self.used.push(key.to_string());
        (!v.is_null()).then_some(v)
    }

    /// Field `key` as text: strings as they are, numbers and booleans written out (CSI parameters
    /// are strings, but hand-written YAML often has `region: 1` or `usePodIdentity: true`).
    pub fn string(&mut self, key: &str, notes: &mut Notes) -> Option<String> {
        let path = self.at(key);
        match self.value(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            _ => {
                notes.warn(path, "is not a string; not carried over");
                None
            }
        }
    }

    /// Field `key` as a boolean (`true`/`false`, also as strings as CSI parameters are).
    pub fn flag(&mut self, key: &str, notes: &mut Notes) -> Option<bool> {
        let path = self.at(key);
        let text = self.string(key, notes)?;
        match text.to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                notes.warn(
                    path,
                    format!(
                        "{} is not true or false; not carried over",
                        super::notes::quoted(&text)
                    ),
                );
                None
            }
        }
    }

    /// Field `key` as a duration (`1h`, `15m`, `0`); one that is not is noted and dropped, the
    /// note ending with `default` (what applies instead).
    pub fn duration(&mut self, key: &str, notes: &mut Notes, default: &str) -> Option<String> {
        let path = self.at(key);
        let text = self.string(key, notes)?;
        let rule = &crate::api::rules::DURATION;
        if rule.is_match(&text) {
            return Some(text);
        }
        notes.warn(
            path,
            format!(
                "{} {}; not carried over ({default})",
                super::notes::quoted(&text),
                rule.message
            ),
        );
        None
    }

    /// Field `key` as a nested mapping.
    pub fn object(&mut self, key: &str, notes: &mut Notes) -> Option<Fields<'a>> {
        let path = self.at(key);
        Fields::of(self.value(key)?, path, notes)
    }

    /// Field `key` as a list: each item with its path (`key[i]`).
    pub fn list(&mut self, key: &str, notes: &mut Notes) -> Vec<(String, &'a Value)> {
        let path = self.at(key);
        match self.value(key) {
            None => Vec::new(),
            Some(Value::Sequence(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("{path}[{i}]"), v))
                .collect(),
            Some(_) => {
                notes.warn(path, "is not a list; not carried over");
                Vec::new()
            }
        }
    }

    /// Field `key` as a map of strings (labels, annotations, CSI parameters).
    pub fn strings(
        &mut self,
        key: &str,
        notes: &mut Notes,
    ) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(mut map) = self.object(key, notes) {
            for k in map.keys() {
                if let Some(v) = map.string(&k, notes) {
                    out.insert(k, v);
                }
            }
            map.finish(notes);
        }
        out
    }

    /// Field `key` as a list of strings.
    pub fn string_list(&mut self, key: &str, notes: &mut Notes) -> Vec<String> {
        let mut out = Vec::new();
        for (path, v) in self.list(key, notes) {
            match v {
                Value::String(s) => out.push(s.clone()),
                _ => notes.warn(path, "is not a string; not carried over"),
            }
        }
        out
    }

    /// The names of this mapping's string keys, in document order.
    pub fn keys(&self) -> Vec<String> {
        self.map
            .keys()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect()
    }

    /// Whether field `key` is present (and not null); does not mark it used.
    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    /// Reports field `key`, when present, as not carried over because of `why`.
    pub fn drop_field(&mut self, key: &str, notes: &mut Notes, why: &str) {
        let path = self.at(key);
        if self.value(key).is_some() {
            notes.warn(path, why);
        }
    }

    /// Records every field that was not read as unknown: the conversion does not know it, so the
    /// object is not converted (a typo such as `proprety` must not silently widen what is read).
    /// Each is recorded once, however often this is called.
    pub fn finish(&mut self, notes: &mut Notes) {
        for k in self.map.keys() {
            let name = match k.as_str() {
                Some(name) => name.to_string(),
                None => "(a non-string key)".to_string(),
            };
            if !self.used.contains(&name) {
                let path = self.at(&name);
                self.used.push(name);
                notes.unknown.push(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_fields_are_unknown_with_their_path() {
        let v: Value = serde_norway::from_str("{a: 1, b: {c: x, d: y}, e: [1]}").unwrap();
        let mut notes = Notes::new("K ns/n");
        let mut f = Fields::of(&v, "spec", &mut notes).unwrap();
        assert_eq!(f.string("a", &mut notes).as_deref(), Some("1"));
        let mut b = f.object("b", &mut notes).unwrap();
        assert_eq!(b.string("c", &mut notes).as_deref(), Some("x"));
        b.finish(&mut notes);
        f.finish(&mut notes);
        f.finish(&mut notes);
        assert_eq!(notes.unknown, ["spec.b.d", "spec.e"]);
        assert!(notes.list.is_empty());
        let why = notes.unknown_fields().unwrap();
        assert!(
            why.starts_with("unknown fields spec.b.d, spec.e: "),
            "{why}"
        );
    }

    #[test]
    fn wrong_types_are_noted() {
        let v: Value = serde_norway::from_str("{a: [1], b: maybe}").unwrap();
        let mut notes = Notes::new("K n");
        let mut f = Fields::of(&v, "", &mut notes).unwrap();
        assert_eq!(f.string("a", &mut notes), None);
        assert_eq!(f.flag("b", &mut notes), None);
        assert_eq!(f.list("b", &mut notes).len(), 0);
        assert_eq!(notes.list.len(), 3);
        assert_eq!(notes.list[0].path, "a");
    }
}
