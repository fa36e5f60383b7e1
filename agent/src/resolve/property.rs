//! `property` lookup and `extract` expansion over JSON values, with ESO's rules: a property is
//! first a literal top-level key, then a dotted path (array indexes allowed); strings come out
//! raw, anything else as JSON text.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Context, ResolveError};
use crate::providers::RemoteKey;
use crate::secret::SecretBytes;

/// Selects `property` from a JSON value.
pub fn select(
    ctx: &Context,
    key: &RemoteKey,
    raw: &SecretBytes,
    property: &str,
) -> Result<SecretBytes, ResolveError> {
    let doc: Value = match serde_json::from_slice(raw.expose()) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
        _ => {
            return Err(ResolveError::NotJson {
                ctx: ctx.boxed(),
                key: key.clone(),
                property: property.into(),
            });
        }
    };
    let found = doc.get(property).or_else(|| dotted(&doc, property));
    match found {
        Some(v) => Ok(to_bytes(v)),
        None => Err(ResolveError::PropertyNotFound {
            ctx: ctx.boxed(),
            key: key.clone(),
            property: property.into(),
        }),
    }
}

/// Expands a JSON object into one entry per top-level key.
pub fn extract(
    ctx: &Context,
    key: &RemoteKey,
    raw: &SecretBytes,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    match serde_json::from_slice::<Value>(raw.expose()) {
        Ok(Value::Object(map)) => Ok(map.iter().map(|(k, v)| (k.clone(), to_bytes(v))).collect()),
        _ => Err(ResolveError::NotAnObject {
            ctx: ctx.boxed(),
            key: key.clone(),
        }),
    }
}

fn dotted<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(doc, |v, seg| match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn to_bytes(v: &Value) -> SecretBytes {
    match v {
        Value::String(s) => SecretBytes::from(s.as_str()),
        other => SecretBytes::new(other.to_string().into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(doc: &str, property: &str) -> Result<String, String> {
        let key = RemoteKey {
            key: "k".into(),
            version: None,
        };
        select(
            &super::super::tests::ctx(),
            &key,
            &SecretBytes::from(doc),
            property,
        )
        .map(|v| String::from_utf8(v.expose().to_vec()).unwrap())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn table() {
        let doc =
            r#"{"a.b":"literal","a":{"b":"nested","n":5,"o":{"x":true}},"l":[{"v":"first"}]}"#;
        let cases = [
            ("a.b", Ok("literal")),
            ("a.n", Ok("5")),
            ("a.o", Ok(r#"{"x":true}"#)),
            ("l.0.v", Ok("first")),
            ("l.1.v", Err("not found")),
            ("missing", Err("not found")),
            ("a.b.c", Err("not found")),
        ];
        for (property, want) in cases {
            let got = sel(doc, property);
            match want {
                Ok(v) => assert_eq!(got.as_deref(), Ok(v), "{property}"),
                Err(e) => assert!(got.unwrap_err().contains(e), "{property}"),
            }
        }
        assert!(sel("plain text", "a").unwrap_err().contains("not JSON"));
        assert!(sel("\"a string\"", "a").unwrap_err().contains("not JSON"));
    }
}
