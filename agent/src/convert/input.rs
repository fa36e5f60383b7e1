//! Splitting the inputs into objects: multi-document YAML, and `kind: List` (what
//! `kubectl get -o yaml` prints) expanded into its items.

use serde::Deserialize;
use serde_norway::Value;

use super::errors::ConvertError;
use crate::catalog::manifests::syntax_error;
use crate::catalog::yaml_limits::{self, Limits};

/// One input text and the name it is reported under (a file name or `<stdin>`).
#[derive(Debug, Clone)]
pub struct Input {
    /// The file name, or `<stdin>`.
    pub name: String,
    /// The whole text.
    pub text: String,
}

/// One object of the input, and where it came from.
#[derive(Debug, Clone)]
pub struct Object {
    /// `file: document N` (and `item M` inside a List).
    pub origin: String,
    /// The parsed document.
    pub value: Value,
}

/// Every object of every input, in order. Fails on the first YAML syntax error, naming the input
/// and document (but not the text around the error, which could be a secret value), and on an
/// input past [`Limits::CONVERT`] before it is parsed.
pub fn objects(inputs: &[Input]) -> Result<Vec<Object>, ConvertError> {
    let mut out = Vec::new();
    for input in inputs {
        yaml_limits::check(&input.text, &Limits::CONVERT).map_err(|refused| {
            ConvertError::Refused {
                source_name: input.name.clone(),
                refused,
            }
        })?;
        for (i, doc) in serde_norway::Deserializer::from_str(&input.text).enumerate() {
            let index = i + 1;
            let value = Value::deserialize(doc).map_err(|e| ConvertError::Parse {
                source_name: input.name.clone(),
                index,
                reason: syntax_error(&e),
            })?;
            if value.is_null() {
                continue;
            }
            let origin = format!("{}: document {index}", input.name);
            match list_items(value) {
                Ok(items) => {
                    for (j, item) in items.into_iter().enumerate() {
                        out.push(Object {
                            origin: format!("{origin}, item {}", j + 1),
                            value: item,
                        });
                    }
                }
                Err(value) => out.push(Object { origin, value }),
            }
        }
    }
    Ok(out)
}

/// The items of a `v1` `List` (or any `*List` kind kubectl prints), taken out of it (not
/// copied: a List's items are most of the input); `Err` gives back a value that is not a List.
fn list_items(value: Value) -> Result<Vec<Value>, Value> {
    let is_list = value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.ends_with("List"))
        && value.get("items").is_some_and(Value::is_sequence);
    if !is_list {
        return Err(value);
    }
    match value {
        Value::Mapping(mut map) => match map.remove("items") {
            Some(Value::Sequence(items)) => Ok(items),
            _ => Ok(Vec::new()),
        },
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(text: &str) -> Vec<Input> {
        vec![Input {
            name: "in.yaml".into(),
            text: text.into(),
        }]
    }

    #[test]
    fn documents_and_lists_become_objects() {
        let objs = objects(&input(
            "a: 1\n---\n---\nkind: List\napiVersion: v1\nitems: [{b: 2}, {c: 3}]\n",
        ))
        .unwrap();
        let origins: Vec<_> = objs.iter().map(|o| o.origin.as_str()).collect();
        assert_eq!(
            origins,
            [
                "in.yaml: document 1",
                "in.yaml: document 3, item 1",
                "in.yaml: document 3, item 2"
            ]
        );
    }

    #[test]
    fn syntax_errors_do_not_quote_the_text() {
        let err = objects(&input("a: 1\n---\nb: [hunter2\n")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("in.yaml: document 2: YAML syntax error"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
}
