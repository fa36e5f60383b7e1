//! Standalone catalog: stores, ExternalSecrets, generators, `v1` Secrets, ConfigMaps and Namespaces read from
//! the YAML files of one directory (several documents per file, `*.yaml` / `*.yml`), loaded once
//! at start.
//!
//! As in cluster mode, nothing is all-or-nothing. A document of another kind (the Deployment next
//! to its ExternalSecret) is skipped with one log line. A document that cannot be read, a file
//! past the size limits, or an object defined twice is reported with one error line, and the
//! other objects are served; when the bad object's kind and name are known it is kept as "not
//! loaded", so a pod that names it gets the reason instead of a bare "not found". Only a
//! directory that cannot be listed fails the start.

mod read;

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use tracing::{error, info};

use super::strict::Kind;
use super::yaml_limits::{self, Limits};
use super::{Catalog, CatalogError};
use crate::api::generator::GeneratorObject;
use crate::api::provider_kinds::{ProviderKind, ProviderObject};
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore};
pub(crate) use read::syntax_error;
use read::{Class, NAMESPACE_NAME_LABEL, Object};

/// Where a document is: its file and 1-based number in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// File.
    pub path: PathBuf,
    /// 1-based document number in the file.
    pub index: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} document {}", self.path.display(), self.index)
    }
}

/// A manifest that could not be loaded. Messages never quote document contents, since stores and
/// Secrets can hold values.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The directory or a file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A document is not valid YAML, does not match its kind's schema, or has fields it does not know.
    #[error("{origin}{what}: {reason}")]
    Invalid {
        /// Where.
        origin: Origin,
        /// ` (Kind namespace/name)` when known.
        what: String,
        /// Why, without document contents.
        reason: String,
    },
    /// A file is larger, deeper or expands further than the agent reads.
    #[error("{path}: {refused}")]
    Refused {
        /// File.
        path: PathBuf,
        /// The bound passed.
        refused: yaml_limits::Refused,
    },
    /// Two documents define the same object; neither is served.
    #[error("{kind} {name} is defined twice, in {first} and in {second}; neither is served")]
    Duplicate {
        /// Kind.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
        /// The first definition.
        first: Origin,
        /// The later one.
        second: Origin,
    },
}

/// A document of a kind the agent does not read, skipped.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// Where.
    pub origin: Origin,
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
    /// `metadata.name`, possibly empty.
    pub name: String,
    /// Extra guidance, possibly empty.
    pub hint: &'static str,
}

/// (kind, namespace, name); the namespace is empty for cluster-scoped kinds.
type Key = (&'static str, String, String);

/// One object defined in the directory.
struct Defined {
    /// Where it is (the first definition, for an object defined twice).
    origin: Origin,
    /// The object, or why it is not served.
    entry: Result<Object, String>,
    /// Defined more than once (`entry` says where else).
    twice: bool,
}

/// Objects loaded from a manifest directory.
#[derive(Default)]
pub struct ManifestCatalog {
    objects: HashMap<Key, Defined>,
    problems: Vec<ManifestError>,
    skipped: Vec<Skipped>,
}

const DEFAULT_NAMESPACE: &str = "default";

impl ManifestCatalog {
    /// Loads every `*.yaml` / `*.yml` file of `dir` (not recursive), in name order, and logs what
    /// was skipped and every problem, one line each. Fails only when `dir` cannot be listed.
    pub fn load_dir(dir: &Path) -> Result<Self, ManifestError> {
        let read_err = |source| ManifestError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(read_err)? {
            let path = entry.map_err(read_err)?.path();
            let is_yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            );
            if is_yaml && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut catalog = Self::default();
        for path in files {
            match std::fs::File::open(&path)
                .and_then(|file| yaml_limits::read_bounded(file, &Limits::MANIFESTS))
            {
                Ok(text) => catalog.load_text(&path, &text),
                Err(source) => catalog.problems.push(ManifestError::Read { path, source }),
            }
        }
        catalog.log(dir);
        Ok(catalog)
    }

    /// One line per skipped document (info) and per problem (error), then a summary.
    fn log(&self, dir: &Path) {
        for s in &self.skipped {
            info!(file = %s.origin.path.display(), document = s.origin.index,
                kind = %s.kind, api_version = %s.api_version, name = %s.name,
                "skipping a manifest of a kind this agent does not read{}", s.hint);
        }
        for problem in &self.problems {
            let consequence = match problem {
                ManifestError::Invalid { .. } => "; not loaded, the other objects are served",
                ManifestError::Read { .. } | ManifestError::Refused { .. } => {
                    "; the file is skipped, the other files are served"
                }
                ManifestError::Duplicate { .. } => "",
            };
            error!("{problem}{consequence}");
        }
        let served = self.objects.values().filter(|d| d.entry.is_ok()).count();
        info!(dir = %dir.display(), served, skipped = self.skipped.len(),
            problems = self.problems.len(), "manifests loaded");
    }

    /// What could not be loaded, in load order.
    pub fn problems(&self) -> &[ManifestError] {
        &self.problems
    }

    /// Documents of kinds the agent does not read, in load order.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Adds every document of one YAML text, as [`Self::load_dir`] does for each file, and fails
    /// with the first problem found: for callers that want all or nothing (the demo's built-in
    /// manifests, tests). The documents that could be read stay loaded.
    pub fn add_documents(&mut self, path: &Path, text: &str) -> Result<(), ManifestError> {
        let before = self.problems.len();
        self.load_text(path, text);
        if self.problems.len() > before {
            Err(self.problems.remove(before))
        } else {
            Ok(())
        }
    }

    /// Adds every document of one YAML text; `path` is only used in messages. A text past
    /// [`Limits::MANIFESTS`] (size, nesting, aliases expanded) is refused whole before it is
    /// parsed. Problems are recorded, not returned.
    pub fn load_text(&mut self, path: &Path, text: &str) {
        if let Err(refused) = yaml_limits::check(text, &Limits::MANIFESTS) {
            self.problems.push(ManifestError::Refused {
                path: path.to_path_buf(),
                refused,
            });
            return;
        }
        for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
            let origin = Origin {
                path: path.to_path_buf(),
                index: i + 1,
            };
            match <serde_norway::Value as serde::Deserialize>::deserialize(doc) {
                Ok(value) => self.load_document(origin, value),
                Err(e) => {
                    // The parser does not find its footing again after a syntax error.
                    self.problems.push(ManifestError::Invalid {
                        origin,
                        what: String::new(),
                        reason: format!("{}; the rest of the file is not read", syntax_error(&e)),
                    });
                    break;
                }
            }
        }
    }

    fn load_document(&mut self, origin: Origin, value: serde_norway::Value) {
        if value.is_null() {
            return;
        }
        let header = match read::header(&value) {
            Ok(header) => header,
            Err(reason) => {
                let what = String::new();
                self.problems.push(ManifestError::Invalid {
                    origin,
                    what,
                    reason,
                });
                return;
            }
        };
        let (kind, refused) = match read::classify(&header.api_version, &header.kind) {
            Class::Read(kind) => (kind, None),
            Class::Refuse(Some(kind), reason) => (kind, Some(reason)),
            Class::Refuse(None, reason) => {
                let what = [header.kind.as_str(), header.metadata.name.as_str()]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(" ");
                let what = if what.is_empty() {
                    what
                } else {
                    format!(" ({what})")
                };
                self.problems.push(ManifestError::Invalid {
                    origin,
                    what,
                    reason,
                });
                return;
            }
            Class::Skip(hint) => {
                self.skipped.push(Skipped {
                    origin,
                    api_version: header.api_version,
                    kind: header.kind,
                    name: header.metadata.name,
                    hint,
                });
                return;
            }
        };
        let name = header.metadata.name;
        if name.is_empty() {
            self.problems.push(ManifestError::Invalid {
                origin,
                what: format!(" ({})", kind.name()),
                reason: "metadata.name is missing".into(),
            });
            return;
        }
        let ns = if kind.cluster_scoped() {
            String::new()
        } else {
            header
                .metadata
                .namespace
                .unwrap_or_else(|| DEFAULT_NAMESPACE.into())
        };
        let shown = shown_name(&ns, &name);
        let entry = match refused {
            Some(reason) => Err(reason),
            None => read::object(kind, &ns, &name, value),
        };
        if let Err(reason) = &entry {
            self.problems.push(ManifestError::Invalid {
                origin: origin.clone(),
                what: format!(" ({} {shown})", kind.name()),
                reason: reason.clone(),
            });
        }
        match self.objects.entry((kind.name(), ns, name)) {
            MapEntry::Vacant(slot) => {
                slot.insert(Defined {
                    origin,
                    entry,
                    twice: false,
                });
            }
            MapEntry::Occupied(mut slot) => {
                // Serving either would be a guess at which one the author meant.
                let first = slot.get().origin.clone();
                let defined = slot.get_mut();
                if !defined.twice {
                    defined.twice = true;
                    defined.entry = Err(format!("defined twice, also in {origin}"));
                }
                self.problems.push(ManifestError::Duplicate {
                    kind: kind.name(),
                    name: shown,
                    first,
                    second: origin,
                });
            }
        }
    }

    /// The object of `kind` named `namespace/name` (`namespace` is ignored for cluster-scoped
    /// kinds); one that is defined but not loaded is an error saying why.
    fn get(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<&Object>, CatalogError> {
        let ns = if kind.cluster_scoped() { "" } else { namespace };
        match self
            .objects
            .get(&(kind.name(), ns.to_string(), name.to_string()))
        {
            None => Ok(None),
            Some(Defined {
                entry: Ok(object), ..
            }) => Ok(Some(object)),
            Some(Defined {
                origin,
                entry: Err(reason),
                ..
            }) => Err(CatalogError::NotLoaded {
                kind: kind.name(),
                name: shown_name(ns, name),
                detail: format!("{origin}: {reason}"),
            }),
        }
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
fn shown_name(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

#[async_trait]
impl Catalog for ManifestCatalog {
    async fn external_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ExternalSecret>>, CatalogError> {
        Ok(match self.get(Kind::ExternalSecret, namespace, name)? {
            Some(Object::ExternalSecret(o)) => Some(Arc::clone(o)),
            _ => None,
        })
    }

    async fn secret_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<SecretStore>>, CatalogError> {
        Ok(match self.get(Kind::SecretStore, namespace, name)? {
            Some(Object::SecretStore(o)) => Some(Arc::clone(o)),
            _ => None,
        })
    }

    async fn cluster_secret_store(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ClusterSecretStore>>, CatalogError> {
        Ok(match self.get(Kind::ClusterSecretStore, "", name)? {
            Some(Object::ClusterSecretStore(o)) => Some(Arc::clone(o)),
            _ => None,
        })
    }

    async fn generator(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<GeneratorObject>, CatalogError> {
        let kind = match Kind::named(kind) {
            Some(
                k @ (Kind::Password
                | Kind::VaultDynamicSecret
                | Kind::PluginGenerator
                | Kind::ClusterGenerator),
            ) => k,
            _ => return Ok(None),
        };
        Ok(match self.get(kind, namespace, name)? {
            Some(Object::Generator(g)) => Some(g.clone()),
            _ => None,
        })
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, CatalogError> {
        Ok(match self.get(Kind::Secret, namespace, name)? {
            Some(Object::Secret(o)) => Some(Arc::clone(o)),
            _ => None,
        })
    }

    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, CatalogError> {
        Ok(match self.get(Kind::ConfigMap, namespace, name)? {
            Some(Object::ConfigMap(o)) => Some(Arc::clone(o)),
            _ => None,
        })
    }

    async fn provider(
        &self,
        kind: ProviderKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError> {
        let kind = Kind::Provider(kind, namespace.is_none());
        Ok(match self.get(kind, namespace.unwrap_or_default(), name)? {
            Some(Object::Provider(o)) => Some(Arc::clone(o)),
            _ => None,
        })
    }

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, CatalogError> {
        Ok(match self.get(Kind::Namespace, "", namespace)? {
            Some(Object::Namespace(labels)) => labels.clone(),
            _ => BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), namespace.to_string())]),
        })
    }

    fn is_synced(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod loading_tests;
#[cfg(test)]
mod tests;
