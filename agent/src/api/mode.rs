//! File modes as Kubernetes users write them. kubectl reads YAML 1.1, where `0440` is octal (288);
//! the YAML 1.2 parser of standalone mode reads it as the string "0440". Accept both, so a
//! manifest means the same mode whichever way it reaches Latchkey.

use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Int(i32),
    Text(String),
}

/// Deserializes an optional mode from an integer or an octal string (`0440`, `0o440`).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Int(i)) => Ok(Some(i)),
        Some(Raw::Text(s)) => {
            let digits = s
                .strip_prefix("0o")
                .or_else(|| s.strip_prefix('0'))
                .unwrap_or(&s);
            i32::from_str_radix(digits, 8).map(Some).map_err(|_| {
                serde::de::Error::custom(format!(
                    "file mode {s:?} is not an octal number like 0440"
                ))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::api::external_secret::Files;

    #[test]
    fn octal_forms_mean_the_same_mode() {
        for doc in [
            "defaultMode: 0440",
            "defaultMode: 0o440",
            "defaultMode: 288",
        ] {
            let f: Files = serde_norway::from_str(doc).unwrap();
            assert_eq!(f.default_mode, Some(0o440), "{doc}");
        }
        let f: Files = serde_json::from_str(r#"{"defaultMode": 288}"#).unwrap();
        assert_eq!(f.default_mode, Some(0o440));
        assert!(serde_norway::from_str::<Files>("defaultMode: 0999").is_err());
        assert_eq!(
            serde_norway::from_str::<Files>("items: []")
                .unwrap()
                .default_mode,
            None
        );
    }
}
