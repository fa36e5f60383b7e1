//! ExternalSecret + fetched values -> entries -> files. Pure: no I/O, no backend, no volume; the
//! caller fetches what [`plan`] asks for and hands the values back to [`entries`].
//! Semantics follow the External Secrets Operator: `dataFrom` sources apply in order (later ones
//! override), then `data` entries override them.

pub mod decode;
pub mod files;
pub mod property;
pub mod rewrite;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use regex::RegexBuilder;

use crate::api::external_secret::{ExternalSecretSpec, FindRef, GeneratorRef};
use crate::api::validate::generator_of;
use crate::api::{RemoteRef, StoreKind};
use crate::providers::{FindQuery, RemoteKey};
use crate::secret::SecretBytes;

pub use files::files;
use rewrite::rewrite;
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
            "namespace \"{}\", ExternalSecret \"{}\"",
            self.namespace, self.external_secret
        )?;
        // An ExternalSecret whose entries are all generated reads no store.
        if self.store_name.is_empty() {
            return Ok(());
        }
        write!(f, ", {} \"{}\"", self.store_kind, self.store_name)
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
    /// What each generator made for this volume (or mirrored Secret): one result per
    /// generator, shared by every entry that names it (a certificate and its key must match).
    generated: Vec<(GeneratorRef, Arc<BTreeMap<String, SecretBytes>>)>,
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

    /// Records what the generator `reference` made.
    pub fn insert_generated(
        &mut self,
        reference: GeneratorRef,
        values: Arc<BTreeMap<String, SecretBytes>>,
    ) {
        self.generated.retain(|(r, _)| *r != reference);
        self.generated.push((reference, values));
    }

    /// What the generator `reference` made, if it ran.
    fn generated(&self, reference: &GeneratorRef) -> Option<&BTreeMap<String, SecretBytes>> {
        self.generated
            .iter()
            .find(|(r, _)| r == reference)
            .map(|(_, v)| &**v)
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
            generated: Vec::new(),
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
    /// `remoteRef.key` of a generated entry names no key of the generator's result.
    #[error("{ctx}, {generator}: the generated result has no key \"{key}\" (it has: {keys})")]
    NotGenerated {
        /// Objects involved.
        ctx: Box<Context>,
        /// The generator (`Kind "name"`).
        generator: String,
        /// The key asked for.
        key: String,
        /// The keys the result has (names, never values).
        keys: String,
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
    keys.extend(
        spec.data
            .iter()
            .filter(|d| generator_of(d.source_ref.as_ref()).is_none())
            .map(|d| remote_key(&d.remote_ref)),
    );
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
        tags: f.tags.clone(),
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
        } else if let Some(g) = generator_of(d.source_ref.as_ref()) {
            let made = generated(ctx, fetched, g)?.clone();
            for (name, v) in rewrite(ctx, index, d, made, &mut rewrites)? {
                out.insert(name, v);
            }
        }
    }
    for d in &spec.data {
        in_time()?;
        if let Some(g) = generator_of(d.source_ref.as_ref()) {
            let made = generated(ctx, fetched, g)?;
            let wanted = &d.remote_ref.key;
            let raw = made.get(wanted).ok_or_else(|| ResolveError::NotGenerated {
                ctx: ctx.boxed(),
                generator: g.to_string(),
                key: wanted.clone(),
                keys: made
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
            let key = remote_key(&d.remote_ref);
            let raw = decode::apply(ctx, &key, d.remote_ref.decoding_strategy, raw)?;
            let v = match d.remote_ref.property.as_deref().filter(|p| !p.is_empty()) {
                Some(p) => property::select(ctx, &key, &raw, p)?,
                None => raw.into_owned(),
            };
            out.insert(d.secret_key.clone(), v);
            continue;
        }
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

/// What the generator `g` made, or the caller's bug of not running it.
fn generated<'a>(
    ctx: &Context,
    fetched: &'a Fetched,
    g: &GeneratorRef,
) -> Result<&'a BTreeMap<String, SecretBytes>, ResolveError> {
    fetched
        .generated(g)
        .ok_or_else(|| ResolveError::NotFetched {
            ctx: ctx.boxed(),
            key: RemoteKey {
                key: g.to_string(),
                version: None,
            },
        })
}

/// The generators an ExternalSecret's entries name, each once, in first-use order.
pub fn generator_refs(spec: &ExternalSecretSpec) -> Vec<GeneratorRef> {
    let mut refs: Vec<GeneratorRef> = Vec::new();
    let named = spec
        .data_from
        .iter()
        .filter_map(|d| generator_of(d.source_ref.as_ref()))
        .chain(
            spec.data
                .iter()
                .filter_map(|d| generator_of(d.source_ref.as_ref())),
        );
    for g in named {
        if !refs.contains(g) {
            refs.push(g.clone());
        }
    }
    refs
}

#[cfg(test)]
mod tests;
