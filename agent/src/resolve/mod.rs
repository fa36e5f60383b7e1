//! ExternalSecret + fetched values -> entries -> files. Pure: no I/O, no backend, no volume; the
//! caller fetches the keys [`remote_keys`] asks for and hands the values back to [`entries`].
//! Semantics follow the External Secrets Operator: `dataFrom` sources apply in order (later ones
//! override), then `data` entries override them.

pub mod decode;
pub mod files;
pub mod property;
pub mod template;

use std::collections::{BTreeMap, HashMap};

use regex::Regex;

use crate::api::external_secret::{DataFrom, ExternalSecretSpec};
use crate::api::{RemoteRef, StoreKind};
use crate::providers::RemoteKey;
use crate::secret::SecretBytes;

pub use files::files;
pub use template::TemplatePod;

/// Names the objects a resolution is about, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// Pod (and ExternalSecret) namespace.
    pub namespace: String,
    /// ExternalSecret name.
    pub external_secret: String,
    /// Store kind.
    pub store_kind: StoreKind,
    /// Store name.
    pub store_name: String,
}

impl Context {
    /// A boxed copy, for error values (which must stay small).
    pub fn boxed(&self) -> Box<Context> {
        Box::new(self.clone())
    }
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "namespace \"{}\", ExternalSecret \"{}\", {} \"{}\"",
            self.namespace, self.external_secret, self.store_kind, self.store_name
        )
    }
}

/// Values fetched for the keys [`remote_keys`] returned.
pub type Fetched = HashMap<RemoteKey, SecretBytes>;

/// Why the fetched values cannot be turned into entries or files. Never contains values.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// `property` names nothing in the value.
    #[error("{ctx}, {key}: property \"{property}\" not found")]
    PropertyNotFound {
        /// Objects involved.
        ctx: Box<Context>,
        /// Remote key.
        key: RemoteKey,
        /// The property asked for.
        property: String,
    },
    /// `property` was given but the value is not a JSON object or array.
    #[error("{ctx}, {key}: property \"{property}\" was requested but the value is not JSON")]
    NotJson {
        /// Objects involved.
        ctx: Box<Context>,
        /// Remote key.
        key: RemoteKey,
        /// The property asked for.
        property: String,
    },
    /// `dataFrom.extract` needs a JSON object.
    #[error("{ctx}, {key}: dataFrom.extract needs a JSON object value")]
    NotAnObject {
        /// Objects involved.
        ctx: Box<Context>,
        /// Remote key.
        key: RemoteKey,
    },
    /// The decoding strategy does not apply to the value.
    #[error("{ctx}, {key}: value is not valid {strategy}")]
    Decode {
        /// Objects involved.
        ctx: Box<Context>,
        /// Remote key.
        key: RemoteKey,
        /// Strategy name.
        strategy: &'static str,
    },
    /// A `rewrite` regular expression does not compile.
    #[error("{ctx}: spec.dataFrom[{index}].rewrite: invalid regexp {source_regexp:?}")]
    BadRewrite {
        /// Objects involved.
        ctx: Box<Context>,
        /// dataFrom index.
        index: usize,
        /// The pattern.
        source_regexp: String,
    },
    /// A feature the ExternalSecret uses is not available yet.
    #[error("{ctx}: {what} is not supported by this version of Latchkey")]
    Unsupported {
        /// Objects involved.
        ctx: Box<Context>,
        /// The field.
        what: &'static str,
    },
    /// The file layout (`target.files`) does not fit the entries.
    #[error("{ctx}: {reason}")]
    Files {
        /// Objects involved.
        ctx: Box<Context>,
        /// What is wrong.
        reason: String,
    },
    /// A `target.template.data` expression is invalid, fails or exceeds a bound.
    #[error("{ctx}: target.template.data[{key:?}]: {reason}")]
    Template {
        /// Objects involved.
        ctx: Box<Context>,
        /// The output key.
        key: String,
        /// What is wrong (never a value).
        reason: String,
    },
    /// A value the caller should have fetched is missing (a bug in the caller).
    #[error("{ctx}, {key}: value was not fetched")]
    NotFetched {
        /// Objects involved.
        ctx: Box<Context>,
        /// Remote key.
        key: RemoteKey,
    },
}

fn remote_key(r: &RemoteRef) -> RemoteKey {
    RemoteKey {
        key: r.key.clone(),
        version: r.version.clone(),
    }
}

/// The remote values an ExternalSecret needs, without duplicates, in first-use order.
pub fn remote_keys(
    ctx: &Context,
    spec: &ExternalSecretSpec,
) -> Result<Vec<RemoteKey>, ResolveError> {
    let mut keys = Vec::new();
    for d in &spec.data_from {
        match (&d.extract, &d.find) {
            (Some(e), _) => keys.push(remote_key(e)),
            (None, Some(_)) => {
                return Err(ResolveError::Unsupported {
                    ctx: ctx.boxed(),
                    what: "dataFrom.find",
                });
            }
            (None, None) => {}
        }
    }
    keys.extend(spec.data.iter().map(|d| remote_key(&d.remote_ref)));
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    Ok(keys)
}

/// Builds the named entries (templates applied, before file layout) from fetched values. `pod` is
/// what templates see as `pod`; `None` where there is no pod (the mirror controller).
pub fn entries(
    ctx: &Context,
    spec: &ExternalSecretSpec,
    fetched: &Fetched,
    pod: Option<&TemplatePod>,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    let value = |r: &RemoteRef| {
        let key = remote_key(r);
        match fetched.get(&key) {
            Some(v) => Ok((key, v)),
            None => Err(ResolveError::NotFetched {
                ctx: ctx.boxed(),
                key,
            }),
        }
    };
    let mut out = BTreeMap::new();
    for (index, d) in spec.data_from.iter().enumerate() {
        if let Some(e) = &d.extract {
            let (key, raw) = value(e)?;
            let raw = decode::apply(ctx, &key, e.decoding_strategy, raw)?;
            let raw = match e.property.as_deref().filter(|p| !p.is_empty()) {
                Some(p) => property::select(ctx, &key, &raw, p)?,
                None => raw,
            };
            let extracted = property::extract(ctx, &key, &raw)?;
            for (name, v) in rewrite(ctx, index, d, extracted)? {
                out.insert(name, v);
            }
        }
    }
    for d in &spec.data {
        let (key, raw) = value(&d.remote_ref)?;
        let raw = decode::apply(ctx, &key, d.remote_ref.decoding_strategy, raw)?;
        let v = match d.remote_ref.property.as_deref().filter(|p| !p.is_empty()) {
            Some(p) => property::select(ctx, &key, &raw, p)?,
            None => raw,
        };
        out.insert(d.secret_key.clone(), v);
    }
    match spec.target.as_ref().and_then(|t| t.template.as_ref()) {
        Some(t) if !t.data.is_empty() => template::apply(ctx, t, out, pod),
        _ => Ok(out),
    }
}

/// Applies a source's `rewrite` steps, in order, to each entry name it produced.
fn rewrite(
    ctx: &Context,
    index: usize,
    source: &DataFrom,
    entries: BTreeMap<String, SecretBytes>,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    if source.rewrite.is_empty() {
        return Ok(entries);
    }
    let mut steps = Vec::new();
    for r in source.rewrite.iter().filter_map(|r| r.regexp.as_ref()) {
        let re = Regex::new(&r.source).map_err(|_| ResolveError::BadRewrite {
            ctx: ctx.boxed(),
            index,
            source_regexp: r.source.clone(),
        })?;
        steps.push((re, r.target.as_str()));
    }
    Ok(entries
        .into_iter()
        .map(|(mut name, v)| {
            for (re, target) in &steps {
                name = re.replace_all(&name, *target).into_owned();
            }
            (name, v)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::external_secret::*;

    pub(crate) fn ctx() -> Context {
        Context {
            namespace: "shop".into(),
            external_secret: "db".into(),
            store_kind: StoreKind::SecretStore,
            store_name: "fake".into(),
        }
    }

    fn spec(data: Vec<(&str, &str, Option<&str>)>, data_from: Vec<DataFrom>) -> ExternalSecretSpec {
        ExternalSecretSpec {
            secret_store_ref: SecretStoreRef {
                name: "fake".into(),
                kind: StoreKind::SecretStore,
            },
            refresh_interval: None,
            data: data
                .into_iter()
                .map(|(secret_key, key, property)| ExternalSecretData {
                    secret_key: secret_key.into(),
                    remote_ref: RemoteRef {
                        key: key.into(),
                        property: property.map(String::from),
                        ..Default::default()
                    },
                })
                .collect(),
            data_from,
            target: None,
            service_account_name: None,
        }
    }

    fn extract(key: &str, rewrite: Vec<(&str, &str)>) -> DataFrom {
        DataFrom {
            extract: Some(RemoteRef {
                key: key.into(),
                ..Default::default()
            }),
            find: None,
            rewrite: rewrite
                .into_iter()
                .map(|(s, t)| Rewrite {
                    regexp: Some(RewriteRegexp {
                        source: s.into(),
                        target: t.into(),
                    }),
                })
                .collect(),
        }
    }

    fn fetched(pairs: &[(&str, &str)]) -> Fetched {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    RemoteKey {
                        key: k.to_string(),
                        version: None,
                    },
                    SecretBytes::from(*v),
                )
            })
            .collect()
    }

    fn text(m: &BTreeMap<String, SecretBytes>) -> Vec<(String, String)> {
        m.iter()
            .map(|(k, v)| (k.clone(), String::from_utf8(v.expose().to_vec()).unwrap()))
            .collect()
    }

    #[test]
    fn remote_keys_are_deduplicated_in_first_use_order() {
        let s = spec(
            vec![
                ("a", "k1", Some("x")),
                ("b", "k2", None),
                ("c", "k1", Some("y")),
            ],
            vec![extract("k3", vec![])],
        );
        let keys: Vec<_> = remote_keys(&ctx(), &s)
            .unwrap()
            .into_iter()
            .map(|k| k.key)
            .collect();
        assert_eq!(keys, ["k3", "k1", "k2"]);
    }

    #[test]
    fn data_overrides_data_from_and_later_sources_override_earlier() {
        let s = spec(
            vec![("user", "single", None)],
            vec![extract("first", vec![]), extract("second", vec![])],
        );
        let f = fetched(&[
            ("first", r#"{"user":"one","host":"h1","port":5432}"#),
            ("second", r#"{"host":"h2","nested":{"a":1}}"#),
            ("single", "root"),
        ]);
        let out = text(&entries(&ctx(), &s, &f, None).unwrap());
        assert_eq!(
            out,
            [
                ("host".to_string(), "h2".to_string()),
                ("nested".into(), r#"{"a":1}"#.into()),
                ("port".into(), "5432".into()),
                ("user".into(), "root".into()),
            ]
        );
    }

    #[test]
    fn rewrite_steps_apply_in_order_to_that_source_only() {
        let s = spec(
            vec![],
            vec![
                extract("a", vec![("^db_", ""), ("(.*)", "DB_$1")]),
                extract("b", vec![]),
            ],
        );
        let f = fetched(&[("a", r#"{"db_user":"u"}"#), ("b", r#"{"db_pass":"p"}"#)]);
        let names: Vec<_> = entries(&ctx(), &s, &f, None).unwrap().into_keys().collect();
        assert_eq!(names, ["DB_user", "db_pass"]);
    }

    #[test]
    fn errors_name_namespace_external_secret_store_and_key_but_no_value() {
        let s = spec(vec![("p", "db", Some("password"))], vec![]);
        let f = fetched(&[("db", r#"{"user":"hunter2-value"}"#)]);
        let err = entries(&ctx(), &s, &f, None).unwrap_err().to_string();
        assert_eq!(
            err,
            "namespace \"shop\", ExternalSecret \"db\", SecretStore \"fake\", remote key \"db\": \
             property \"password\" not found"
        );
        let s = spec(vec![], vec![extract("plain", vec![])]);
        let f = fetched(&[("plain", "hunter2-value")]);
        let err = entries(&ctx(), &s, &f, None).unwrap_err().to_string();
        assert!(
            err.contains("needs a JSON object") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn find_is_refused_clearly() {
        let mut s = spec(vec![], vec![]);
        s.data_from.push(DataFrom {
            find: Some(FindRef::default()),
            ..Default::default()
        });
        assert!(
            remote_keys(&ctx(), &s)
                .unwrap_err()
                .to_string()
                .contains("dataFrom.find")
        );
    }
}
