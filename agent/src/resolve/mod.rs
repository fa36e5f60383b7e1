//! ExternalSecret + fetched values -> entries -> files. Pure: no I/O, no backend, no volume; the
//! caller fetches what [`plan`] asks for and hands the values back to [`entries`].
//! Semantics follow the External Secrets Operator: `dataFrom` sources apply in order (later ones
//! override), then `data` entries override them.

pub mod decode;
pub mod files;
pub mod property;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use regex::{Regex, RegexBuilder};

use crate::api::external_secret::{DataFrom, ExternalSecretSpec, FindRef};
use crate::api::{RemoteRef, StoreKind};
use crate::providers::{FindQuery, RemoteKey};
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

/// What the backend returned for a [`Plan`]: values by key, and the results of each
/// `dataFrom[i].find` by its index.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Sorted by key, then version, without duplicates: looked up by the references' own
    /// strings, without building a `RemoteKey` or hashing one (a warm publish looks each value up
    /// twice, and an ExternalSecret names a handful).
    values: Vec<(RemoteKey, SecretBytes)>,
    found: HashMap<usize, Arc<Vec<(String, SecretBytes)>>>,
}

impl Fetched {
    /// The fetched value `r` names, with its key.
    fn get(&self, r: &RemoteRef) -> Option<(&RemoteKey, &SecretBytes)> {
        let i = self.position(&r.key, r.version.as_deref()).ok()?;
        self.values.get(i).map(|(k, v)| (k, v))
    }

    /// Where `(key, version)` is in `values`, or where it would go.
    fn position(&self, key: &str, version: Option<&str>) -> Result<usize, usize> {
        self.values
            .binary_search_by(|(k, _)| (k.key.as_str(), k.version.as_deref()).cmp(&(key, version)))
    }

    /// Records what `dataFrom[index].find` matched.
    pub fn insert_found(&mut self, index: usize, results: Vec<(String, SecretBytes)>) {
        self.found.insert(index, Arc::new(results));
    }

    /// Records that `dataFrom[index].find` matched what `dataFrom[first]` did (the same search,
    /// run once; the results are shared, not copied).
    pub fn share_found(&mut self, first: usize, index: usize) {
        if let Some(results) = self.found.get(&first).cloned() {
            self.found.insert(index, results);
        }
    }
}

impl FromIterator<(RemoteKey, SecretBytes)> for Fetched {
    fn from_iter<I: IntoIterator<Item = (RemoteKey, SecretBytes)>>(iter: I) -> Self {
        let mut values: Vec<_> = iter.into_iter().collect();
        // Stable, so that of two values of one key the later stays, as a map's insert would.
        values.sort_by(|(a, _), (b, _)| a.cmp(b));
        values.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(&mut later.1, &mut kept.1);
            }
            same
        });
        Self {
            values,
            found: HashMap::new(),
        }
    }
}

/// What to ask the backend for: single keys, and name searches by `dataFrom` index.
#[derive(Debug)]
pub struct Plan {
    /// Remote keys, without duplicates, in first-use order.
    pub keys: Vec<RemoteKey>,
    /// `(dataFrom index, query)` for each `find`.
    pub finds: Vec<(usize, FindQuery)>,
}

/// Largest compiled `find.name.regexp`; a bigger pattern is refused rather than built.
const MAX_FIND_REGEX_BYTES: usize = 1 << 20;

/// Largest compiled `rewrite` regular expression.
const MAX_REWRITE_REGEX_BYTES: usize = 256 << 10;

/// Longest entry name a rewrite may produce, checked while the name is built (a step like
/// `{source: "^(.*)$", target: "$1$1"}` doubles it each time).
pub const MAX_REWRITTEN_NAME_BYTES: usize = 1024;

/// Most rewrite applications (entry names x steps) of one ExternalSecret.
pub const MAX_REWRITE_APPLICATIONS: usize = 50_000;

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
    /// A `find.name.regexp` does not compile (or is too large).
    #[error("{ctx}: spec.dataFrom[{index}].find.name: invalid regexp {regexp:?}")]
    BadFind {
        /// Objects involved.
        ctx: Box<Context>,
        /// dataFrom index.
        index: usize,
        /// The pattern.
        regexp: String,
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
    /// A bound that protects the agent was exceeded (sizes, counts).
    #[error("{ctx}: {reason}")]
    Bound {
        /// Objects involved.
        ctx: Box<Context>,
        /// Which bound, and its limit.
        reason: String,
    },
    /// The publish's computation ran past its wall-clock limit (see [`crate::compute`]).
    #[error("{ctx}: resolving the values ran past the time limit of this publish")]
    Deadline {
        /// Objects involved.
        ctx: Box<Context>,
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

/// What an ExternalSecret needs from the backend: its remote keys (deduplicated, in first-use
/// order) and its name searches.
pub fn plan(ctx: &Context, spec: &ExternalSecretSpec) -> Result<Plan, ResolveError> {
    let mut keys = Vec::new();
    let mut finds = Vec::new();
    for (index, d) in spec.data_from.iter().enumerate() {
        match (&d.extract, &d.find) {
            (Some(e), _) => keys.push(remote_key(e)),
            (None, Some(f)) => finds.push((index, find_query(ctx, index, f)?)),
            (None, None) => {}
        }
    }
    keys.extend(spec.data.iter().map(|d| remote_key(&d.remote_ref)));
    dedup_in_order(&mut keys);
    Ok(Plan { keys, finds })
}

/// Removes later repeats of a key, keeping first-use order.
fn dedup_in_order(keys: &mut Vec<RemoteKey>) {
    // An ExternalSecret names a handful of keys: comparing each with those before it is
    // cheaper than hashing them. Past that, a set of the keys already kept.
    const COMPARE_UP_TO: usize = 16;
    if keys.len() <= COMPARE_UP_TO {
        let mut kept = 0;
        for i in 0..keys.len() {
            if !keys[..kept].contains(&keys[i]) {
                keys.swap(kept, i);
                kept += 1;
            }
        }
        keys.truncate(kept);
    } else {
        let mut seen = std::collections::HashSet::new();
        keys.retain(|k| seen.insert(k.clone()));
    }
}

fn find_query(ctx: &Context, index: usize, f: &FindRef) -> Result<FindQuery, ResolveError> {
    let name = match f.name.as_ref().map(|n| n.regexp.as_str()) {
        Some(re) => Some(
            RegexBuilder::new(re)
                .size_limit(MAX_FIND_REGEX_BYTES)
                .build()
                .map_err(|_| ResolveError::BadFind {
                    ctx: ctx.boxed(),
                    index,
                    regexp: re.to_string(),
                })?,
        ),
        None => None,
    };
    Ok(FindQuery {
        path: f.path.clone().filter(|p| !p.is_empty()),
        name,
    })
}

/// Most bytes of values [`is_light`] lets the caller render on its own thread.
pub const LIGHT_WORK_BYTES: usize = 256 << 10;

/// True when rendering is cheap enough to run on the caller's thread: no templates, no
/// rewrite, no search results, and the values the entries read add up to at most
/// [`LIGHT_WORK_BYTES`]. Everything else goes to the [`crate::compute`] pool.
pub fn is_light(spec: &ExternalSecretSpec, fetched: &Fetched) -> bool {
    let templated = spec
        .target
        .as_ref()
        .and_then(|t| t.template.as_ref())
        .is_some_and(|t| !t.data.is_empty());
    if templated
        || spec
            .data_from
            .iter()
            .any(|d| d.find.is_some() || !d.rewrite.is_empty())
    {
        return false;
    }
    let refs = spec
        .data_from
        .iter()
        .filter_map(|d| d.extract.as_ref())
        .chain(spec.data.iter().map(|d| &d.remote_ref));
    let mut work = 0usize;
    for r in refs {
        work += fetched.get(r).map_or(0, |(_, v)| v.len());
        if work > LIGHT_WORK_BYTES {
            return false;
        }
    }
    true
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
        fetched.get(r).ok_or_else(|| ResolveError::NotFetched {
            ctx: ctx.boxed(),
            key: remote_key(r),
        })
    };
    let mut out = BTreeMap::new();
    let mut rewrites = 0usize;
    let in_time = || {
        if crate::compute::deadline_passed() {
            return Err(ResolveError::Deadline { ctx: ctx.boxed() });
        }
        Ok(())
    };
    for (index, d) in spec.data_from.iter().enumerate() {
        in_time()?;
        // A source repeated later yields the very same entries, which the later copy overwrites:
        // only the last of identical sources is rendered (50 copies of one `find` would
        // otherwise copy all its values 50 times).
        if spec.data_from[index + 1..].contains(d) {
            continue;
        }
        if let Some(e) = &d.extract {
            let (key, raw) = value(e)?;
            let raw = decode::apply(ctx, key, e.decoding_strategy, raw)?;
            let raw = match e.property.as_deref().filter(|p| !p.is_empty()) {
                Some(p) => std::borrow::Cow::Owned(property::select(ctx, key, &raw, p)?),
                None => raw,
            };
            let extracted = property::extract(ctx, key, &raw)?;
            for (name, v) in rewrite(ctx, index, d, extracted, &mut rewrites)? {
                out.insert(name, v);
            }
        } else if let Some(f) = &d.find {
            let results = fetched
                .found
                .get(&index)
                .ok_or_else(|| ResolveError::NotFetched {
                    ctx: ctx.boxed(),
                    key: RemoteKey {
                        key: format!("dataFrom[{index}].find"),
                        version: None,
                    },
                })?;
            let mut matched = BTreeMap::new();
            for (name, raw) in results.iter() {
                in_time()?;
                let key = RemoteKey {
                    key: name.clone(),
                    version: None,
                };
                matched.insert(
                    name.clone(),
                    decode::apply(ctx, &key, f.decoding_strategy, raw)?.into_owned(),
                );
            }
            for (name, v) in rewrite(ctx, index, d, matched, &mut rewrites)? {
                out.insert(name, v);
            }
        }
    }
    for d in &spec.data {
        in_time()?;
        let (key, raw) = value(&d.remote_ref)?;
        let raw = decode::apply(ctx, key, d.remote_ref.decoding_strategy, raw)?;
        let v = match d.remote_ref.property.as_deref().filter(|p| !p.is_empty()) {
            Some(p) => property::select(ctx, key, &raw, p)?,
            None => raw.into_owned(),
        };
        out.insert(d.secret_key.clone(), v);
    }
    match spec.target.as_ref().and_then(|t| t.template.as_ref()) {
        Some(t) if !t.data.is_empty() => template::apply(ctx, t, out, pod),
        _ => Ok(out),
    }
}

/// Applies a source's `rewrite` steps, in order, to each entry name it produced. `applied`
/// counts (name, step) applications across the ExternalSecret, against
/// [`MAX_REWRITE_APPLICATIONS`].
fn rewrite(
    ctx: &Context,
    index: usize,
    source: &DataFrom,
    entries: BTreeMap<String, SecretBytes>,
    applied: &mut usize,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    if source.rewrite.is_empty() {
        return Ok(entries);
    }
    let mut steps = Vec::new();
    for r in source.rewrite.iter().filter_map(|r| r.regexp.as_ref()) {
        let re = RegexBuilder::new(&r.source)
            .size_limit(MAX_REWRITE_REGEX_BYTES)
            .dfa_size_limit(MAX_REWRITE_REGEX_BYTES)
            .build()
            .map_err(|_| ResolveError::BadRewrite {
                ctx: ctx.boxed(),
                index,
                source_regexp: r.source.clone(),
            })?;
        steps.push((re, r.target.as_str()));
    }
    let bound = |reason: String| ResolveError::Bound {
        ctx: ctx.boxed(),
        reason: format!("spec.dataFrom[{index}].rewrite: {reason}"),
    };
    let mut out = BTreeMap::new();
    for (mut name, v) in entries {
        for (re, target) in &steps {
            *applied += 1;
            if *applied > MAX_REWRITE_APPLICATIONS {
                return Err(bound(format!(
                    "more than {MAX_REWRITE_APPLICATIONS} renames (entries x steps)"
                )));
            }
            if crate::compute::deadline_passed() {
                return Err(ResolveError::Deadline { ctx: ctx.boxed() });
            }
            name =
                replace_bounded(re, &name, target, MAX_REWRITTEN_NAME_BYTES).ok_or_else(|| {
                    bound(format!(
                        "a rewritten name grows beyond {MAX_REWRITTEN_NAME_BYTES} bytes"
                    ))
                })?;
        }
        out.insert(name, v);
    }
    Ok(out)
}

/// `re.replace_all(name, target)`, or `None` as soon as the result exceeds `max` bytes.
fn replace_bounded(re: &Regex, name: &str, target: &str, max: usize) -> Option<String> {
    let mut out = String::new();
    let mut last = 0;
    for caps in re.captures_iter(name) {
        // Group 0 (the whole match) is always present.
        let whole = caps.get(0)?;
        out.push_str(&name[last..whole.start()]);
        caps.expand(target, &mut out);
        if out.len() > max {
            return None;
        }
        last = whole.end();
    }
    out.push_str(&name[last..]);
    (out.len() <= max).then_some(out)
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
            refresh_policy: None,
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
        let keys: Vec<_> = plan(&ctx(), &s)
            .unwrap()
            .keys
            .into_iter()
            .map(|k| k.key)
            .collect();
        assert_eq!(keys, ["k3", "k1", "k2"]);
    }

    #[test]
    fn many_remote_keys_are_deduplicated_in_first_use_order_too() {
        // Past the few keys compared one by one, a set does it: same result.
        let names: Vec<String> = (0..40).map(|i| format!("k{}", i % 25)).collect();
        let data = names
            .iter()
            .map(|k| (k.as_str(), k.as_str(), None))
            .collect();
        let keys: Vec<_> = plan(&ctx(), &spec(data, vec![]))
            .unwrap()
            .keys
            .into_iter()
            .map(|k| k.key)
            .collect();
        let expected: Vec<String> = (0..25).map(|i| format!("k{i}")).collect();
        assert_eq!(keys, expected);
    }

    #[test]
    fn fetched_values_are_found_by_key_and_version_and_the_later_of_two_wins() {
        let key = |k: &str, v: Option<&str>| RemoteKey {
            key: k.into(),
            version: v.map(String::from),
        };
        let at = |k: &str, v: Option<&str>| RemoteRef {
            key: k.into(),
            version: v.map(String::from),
            ..Default::default()
        };
        let pairs = [
            (key("b", None), SecretBytes::from("b-first")),
            (key("a", Some("2")), SecretBytes::from("a2")),
            (key("b", None), SecretBytes::from("b-later")),
            (key("a", None), SecretBytes::from("a")),
        ];
        let f: Fetched = pairs.iter().cloned().collect();
        let value =
            |f: &Fetched, r: &RemoteRef| f.get(r).map(|(k, v)| (k.clone(), v.expose().to_vec()));
        assert_eq!(
            value(&f, &at("b", None)),
            Some((key("b", None), b"b-later".to_vec()))
        );
        assert_eq!(
            value(&f, &at("a", Some("2"))),
            Some((key("a", Some("2")), b"a2".to_vec()))
        );
        assert_eq!(
            value(&f, &at("a", None)),
            Some((key("a", None), b"a".to_vec()))
        );
        assert_eq!(value(&f, &at("a", Some("1"))), None);
        assert_eq!(value(&f, &at("c", None)), None);
        let more = [
            (key("c", None), SecretBytes::from("c")),
            (key("a", None), SecretBytes::from("a-again")),
        ];
        let f: Fetched = pairs.into_iter().chain(more).collect();
        assert_eq!(
            value(&f, &at("c", None)),
            Some((key("c", None), b"c".to_vec()))
        );
        assert_eq!(
            value(&f, &at("a", None)),
            Some((key("a", None), b"a-again".to_vec()))
        );
        assert_eq!(f.values.len(), 4);
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
    fn repeated_sources_render_as_one_and_order_still_decides() {
        let f = fetched(&[
            ("first", r#"{"host":"h1","port":5432}"#),
            ("second", r#"{"host":"h2"}"#),
        ]);
        let render = |sources: Vec<DataFrom>| {
            text(&entries(&ctx(), &spec(vec![], sources), &f, None).unwrap())
        };
        let once = render(vec![extract("second", vec![]), extract("first", vec![])]);
        let repeated = render(vec![
            extract("first", vec![]),
            extract("second", vec![]),
            extract("first", vec![]),
            extract("second", vec![]),
            extract("first", vec![]),
        ]);
        assert_eq!(repeated, once, "the last copy of each source decides");
        assert_eq!(once[0], ("host".to_string(), "h1".to_string()));
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

    fn find(regexp: &str, rewrite: Vec<(&str, &str)>) -> DataFrom {
        DataFrom {
            find: Some(FindRef {
                name: Some(FindName {
                    regexp: regexp.into(),
                }),
                ..Default::default()
            }),
            rewrite: extract("unused", rewrite).rewrite,
            ..Default::default()
        }
    }

    #[test]
    fn find_results_become_entries_after_rewrite_and_data_still_wins() {
        let s = spec(
            vec![("db", "single", None)],
            vec![find("^prod/shop/", vec![("^prod/shop/", "")])],
        );
        let plan = plan(&ctx(), &s).unwrap();
        assert_eq!(plan.finds.len(), 1);
        let query = &plan.finds[0].1;
        assert!(query.matches("prod/shop/db") && !query.matches("dev/shop/db"));
        let mut f = fetched(&[("single", "from-data")]);
        f.insert_found(
            0,
            vec![
                ("prod/shop/api".into(), SecretBytes::from("a")),
                ("prod/shop/db".into(), SecretBytes::from("from-find")),
            ],
        );
        assert_eq!(
            text(&entries(&ctx(), &s, &f, None).unwrap()),
            [
                ("api".to_string(), "a".to_string()),
                ("db".into(), "from-data".into())
            ]
        );
    }

    #[test]
    fn a_bad_find_regexp_names_the_entry() {
        let s = spec(vec![], vec![find("(unclosed", vec![])]);
        let err = plan(&ctx(), &s).unwrap_err().to_string();
        assert!(
            err.contains("spec.dataFrom[0].find.name: invalid regexp \"(unclosed\""),
            "{err}"
        );
    }

    #[test]
    fn rewrites_are_bounded_while_names_are_built() {
        let doubling = vec![("^(.*)$", "$1$1"); 16];
        let s = spec(vec![], vec![extract("a", doubling)]);
        let f = fetched(&[("a", r#"{"name":"v"}"#)]);
        let err = entries(&ctx(), &s, &f, None).unwrap_err();
        assert!(
            matches!(err, ResolveError::Bound { .. })
                && err.to_string().contains("grows beyond 1024 bytes"),
            "{err}"
        );
        assert_eq!(
            replace_bounded(&Regex::new("b").unwrap(), "abcb", "[$0]", 100).as_deref(),
            Some("a[b]c[b]")
        );
        assert_eq!(
            replace_bounded(&Regex::new("x*").unwrap(), "abc", "yyyy", 10),
            None
        );
    }
}
