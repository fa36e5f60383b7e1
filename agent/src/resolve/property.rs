//! `property` lookup and `extract` expansion over JSON values, with ESO's rules: a property is
//! first a literal top-level key, then a dotted path (array indexes allowed); strings come out
//! raw, anything else as JSON text. A value is parsed only once its keys are counted (see
//! [`crate::json`]): a tenant's backend may hand over a million tiny keys.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Context, ResolveError};
use crate::json;
use crate::providers::RemoteKey;
use crate::secret::SecretBytes;

/// Selects `property` from a JSON value.
pub fn select(
    ctx: &Context,
    key: &RemoteKey,
    raw: &SecretBytes,
    property: &str,
) -> Result<SecretBytes, ResolveError> {
    let (doc, _held) = match parse(ctx, key, raw)? {
        Some((v @ (Value::Object(_) | Value::Array(_)), held)) => (v, held),
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
    match parse(ctx, key, raw)? {
        Some((Value::Object(map), _held)) => {
            Ok(map.into_iter().map(|(k, v)| (k, to_bytes(&v))).collect())
        }
        _ => Err(ResolveError::NotAnObject {
            ctx: ctx.boxed(),
            key: key.clone(),
        }),
    }
}

/// `raw` as JSON, its keys counted before anything is built and the tree's memory held in the
/// node's parse budget (keep the hold until the tree is gone); `None` when it is not JSON.
fn parse(
    ctx: &Context,
    key: &RemoteKey,
    raw: &SecretBytes,
) -> Result<Option<(Value, json::Held<'static>)>, ResolveError> {
    match json::parse::<Value>(raw.expose()) {
        Ok(parsed) => Ok(Some(parsed)),
        Err(json::ParseError::Invalid) => Ok(None),
        Err(json::ParseError::Refused(why)) => Err(ResolveError::Bound {
            ctx: ctx.boxed(),
            reason: format!("{key}: the value {why}"),
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

    /// A value of a million tiny keys took ~180 MB as a tree; it is refused once counted, as
    /// a bound (RESOURCE_EXHAUSTED) naming the key, without a key or value in the message.
    #[test]
    fn values_with_too_many_keys_are_refused_before_they_are_built() {
        let members: Vec<String> = (0..json::MAX_ITEMS + 1)
            .map(|i| format!("\"k{i}\":\"secret-{i}\""))
            .collect();
        let doc = format!("{{{}}}", members.join(","));
        let key = RemoteKey {
            key: "app/config".into(),
            version: None,
        };
        let ctx = super::super::tests::ctx();
        let raw = SecretBytes::from(doc.as_str());
        let errors = [
            select(&ctx, &key, &raw, "k1").unwrap_err(),
            extract(&ctx, &key, &raw).unwrap_err(),
        ];
        for err in errors {
            let text = err.to_string();
            assert!(matches!(err, ResolveError::Bound { .. }), "{text}");
            assert!(
                text.contains("SecretStore \"fake\": remote key \"app/config\": the value")
                    && text.contains("more than 10000 JSON keys"),
                "{text}"
            );
            assert!(!text.contains("secret-1") && !text.contains("k1"), "{text}");
        }
        let deep = "[".repeat(json::MAX_DEPTH + 1) + &"]".repeat(json::MAX_DEPTH + 1);
        let err = select(&ctx, &key, &SecretBytes::from(deep.as_str()), "0").unwrap_err();
        assert!(err.to_string().contains("deeper than 32"), "{err}");
    }
}
