//! Standalone catalog: stores, ExternalSecrets, generators, `v1` Secrets and Namespaces read from
//! the YAML files of one directory (several documents per file, `*.yaml` / `*.yml`), loaded once
//! at start.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use serde::Deserialize;

use super::strict::{self, Kind, StrictError};
use super::yaml_limits::{self, Limits};
use super::{Catalog, CatalogError};
use crate::api::generator::{
    ClusterGenerator, GeneratorObject, Password, PluginGenerator, VaultDynamicSecret,
};
use crate::api::{ClusterSecretStore, ExternalSecret, GENERATOR_API_VERSION, SecretStore};

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
    #[error("{path}: document {index}{what}: {reason}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// 1-based document number in the file.
        index: usize,
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
    /// Two documents define the same object.
    #[error("{path}: {kind} {name} is defined twice")]
    Duplicate {
        /// File of the second definition.
        path: PathBuf,
        /// Kind.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
    },
}

/// Objects loaded from a manifest directory.
#[derive(Default)]
pub struct ManifestCatalog {
    external_secrets: HashMap<(String, String), Arc<ExternalSecret>>,
    secret_stores: HashMap<(String, String), Arc<SecretStore>>,
    cluster_secret_stores: HashMap<String, Arc<ClusterSecretStore>>,
    /// By (kind, namespace, name); a ClusterGenerator's namespace is empty.
    generators: HashMap<(&'static str, String, String), GeneratorObject>,
    secrets: HashMap<(String, String), Arc<Secret>>,
    config_maps: HashMap<(String, String), Arc<ConfigMap>>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
}

/// The header every Kubernetes document has.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Meta,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

const DEFAULT_NAMESPACE: &str = "default";

impl ManifestCatalog {
    /// Loads every `*.yaml` / `*.yml` file of `dir` (not recursive), in name order.
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
            let text = std::fs::File::open(&path)
                .and_then(|file| yaml_limits::read_bounded(file, &Limits::MANIFESTS))
                .map_err(|source| ManifestError::Read {
                    path: path.clone(),
                    source,
                })?;
            catalog.add_documents(&path, &text)?;
        }
        Ok(catalog)
    }

    /// Adds every document of one YAML text; `path` is only used in error messages. A text past
    /// [`Limits::MANIFESTS`] (size, nesting, aliases expanded) is refused before it is parsed.
    pub fn add_documents(&mut self, path: &Path, text: &str) -> Result<(), ManifestError> {
        yaml_limits::check(text, &Limits::MANIFESTS).map_err(|refused| ManifestError::Refused {
            path: path.to_path_buf(),
            refused,
        })?;
        for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
            let index = i + 1;
            let invalid = |what: String, reason: String| ManifestError::Invalid {
                path: path.to_path_buf(),
                index,
                what,
                reason,
            };
            let value = serde_norway::Value::deserialize(doc)
                .map_err(|e| invalid(String::new(), syntax_error(&e)))?;
            if value.is_null() {
                continue;
            }
            let meta: TypeMeta = serde_norway::from_value(value.clone())
                .map_err(|e| invalid(String::new(), location_only(&e)))?;
            let ns = meta
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| DEFAULT_NAMESPACE.into());
            let name = meta.metadata.name.clone();
            let what = format!(" ({} {}/{})", meta.kind, ns, name);
            if name.is_empty() {
                return Err(invalid(what, "metadata.name is missing".into()));
            }
            let dup = |kind: &'static str, name: String| ManifestError::Duplicate {
                path: path.to_path_buf(),
                kind,
                name,
            };
            match (meta.api_version.as_str(), meta.kind.as_str()) {
                ("latchkey.dev/v1alpha1", "ExternalSecret") => {
                    // ExternalSecrets hold no values, so the full serde message is safe to show.
                    let mut obj: ExternalSecret =
                        strict::from_value(Kind::ExternalSecret, value)
                            .map_err(|e| invalid(what.clone(), full_reason(e)))?;
                    obj.metadata.namespace = Some(ns.clone());
                    if self
                        .external_secrets
                        .insert((ns.clone(), name.clone()), Arc::new(obj))
                        .is_some()
                    {
                        return Err(dup("ExternalSecret", format!("{ns}/{name}")));
                    }
                }
                ("latchkey.dev/v1alpha1", "SecretStore") => {
                    let mut obj: SecretStore = strict::from_value(Kind::SecretStore, value)
                        .map_err(|e| invalid(what.clone(), valueless_reason(e)))?;
                    obj.metadata.namespace = Some(ns.clone());
                    if self
                        .secret_stores
                        .insert((ns.clone(), name.clone()), Arc::new(obj))
                        .is_some()
                    {
                        return Err(dup("SecretStore", format!("{ns}/{name}")));
                    }
                }
                ("latchkey.dev/v1alpha1", "ClusterSecretStore") => {
                    let obj: ClusterSecretStore =
                        strict::from_value(Kind::ClusterSecretStore, value)
                            .map_err(|e| invalid(what.clone(), valueless_reason(e)))?;
                    if self
                        .cluster_secret_stores
                        .insert(name.clone(), Arc::new(obj))
                        .is_some()
                    {
                        return Err(dup("ClusterSecretStore", name));
                    }
                }
                (
                    GENERATOR_API_VERSION,
                    kind @ ("Password" | "VaultDynamicSecret" | "PluginGenerator"
                    | "ClusterGenerator"),
                ) => {
                    let (kind, namespace, obj) = generator(kind, &ns, value)
                        .map_err(|e| invalid(what.clone(), valueless_reason(e)))?;
                    let name_of = if namespace.is_empty() {
                        name.clone()
                    } else {
                        format!("{namespace}/{name}")
                    };
                    if self
                        .generators
                        .insert((kind, namespace, name), obj)
                        .is_some()
                    {
                        return Err(dup(kind, name_of));
                    }
                }
                ("v1", "Secret") => {
                    let mut obj: Secret = strict::from_value(Kind::Secret, value)
                        .map_err(|e| invalid(what.clone(), valueless_reason(e)))?;
                    obj.metadata.namespace = Some(ns.clone());
                    merge_string_data(&mut obj);
                    if self
                        .secrets
                        .insert((ns.clone(), name.clone()), Arc::new(obj))
                        .is_some()
                    {
                        return Err(dup("Secret", format!("{ns}/{name}")));
                    }
                }
                ("v1", "ConfigMap") => {
                    let mut obj: ConfigMap = strict::from_value(Kind::ConfigMap, value)
                        .map_err(|e| invalid(what.clone(), valueless_reason(e)))?;
                    obj.metadata.namespace = Some(ns.clone());
                    if self
                        .config_maps
                        .insert((ns.clone(), name.clone()), Arc::new(obj))
                        .is_some()
                    {
                        return Err(dup("ConfigMap", format!("{ns}/{name}")));
                    }
                }
                ("v1", "Namespace") => {
                    let obj: Namespace = strict::from_value(Kind::Namespace, value)
                        .map_err(|e| invalid(what.clone(), valueless_reason(e)))?;
                    let mut labels = obj.metadata.labels.unwrap_or_default();
                    labels.insert(NAMESPACE_NAME_LABEL.into(), name.clone());
                    if self.namespaces.insert(name.clone(), labels).is_some() {
                        return Err(dup("Namespace", name));
                    }
                }
                (api, kind) => {
                    return Err(invalid(
                        what,
                        format!(
                            "unsupported kind {kind} ({api}); expected latchkey.dev/v1alpha1 \
                             SecretStore, ClusterSecretStore or ExternalSecret, \
                             {GENERATOR_API_VERSION} Password, VaultDynamicSecret, \
                             PluginGenerator or ClusterGenerator, or v1 Secret, ConfigMap or Namespace"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Reads a generator document of `kind` strictly: its kind's static name, its namespace (`ns`
/// for the namespaced kinds, empty for a ClusterGenerator) and the object.
fn generator(
    kind: &str,
    ns: &str,
    value: serde_norway::Value,
) -> Result<(&'static str, String, GeneratorObject), StrictError> {
    Ok(match kind {
        "Password" => {
            let mut obj: Password = strict::from_value(Kind::Password, value)?;
            obj.metadata.namespace = Some(ns.to_string());
            (
                "Password",
                ns.to_string(),
                GeneratorObject::Password(Arc::new(obj)),
            )
        }
        "VaultDynamicSecret" => {
            let mut obj: VaultDynamicSecret = strict::from_value(Kind::VaultDynamicSecret, value)?;
            obj.metadata.namespace = Some(ns.to_string());
            let obj = GeneratorObject::VaultDynamicSecret(Arc::new(obj));
            ("VaultDynamicSecret", ns.to_string(), obj)
        }
        "PluginGenerator" => {
            let mut obj: PluginGenerator = strict::from_value(Kind::PluginGenerator, value)?;
            obj.metadata.namespace = Some(ns.to_string());
            (
                "PluginGenerator",
                ns.to_string(),
                GeneratorObject::Plugin(Arc::new(obj)),
            )
        }
        _ => {
            let obj: ClusterGenerator = strict::from_value(Kind::ClusterGenerator, value)?;
            (
                "ClusterGenerator",
                String::new(),
                GeneratorObject::Cluster(Arc::new(obj)),
            )
        }
    })
}

/// The label the API server sets on every Namespace; set here too so selectors behave the same.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A serde message can quote the offending value; keep only where it happened.
fn location_only(e: &serde_norway::Error) -> String {
    match e.location() {
        Some(l) => format!(
            "does not match the schema near line {} column {}",
            l.line(),
            l.column()
        ),
        None => "does not match the schema".to_string(),
    }
}

/// A YAML syntax error: only where, since the parser's message can quote the text around it.
pub(crate) fn syntax_error(e: &serde_norway::Error) -> String {
    match e.location() {
        Some(l) => format!(
            "YAML syntax error at line {}, column {}",
            l.line(),
            l.column()
        ),
        None => "YAML syntax error".to_string(),
    }
}

/// The reason for a document that holds no values (an ExternalSecret): serde's full message.
fn full_reason(e: StrictError) -> String {
    match e {
        StrictError::Schema(e) => e.to_string(),
        StrictError::Unknown(reason) => reason,
    }
}

/// The reason for a document that may hold values: unknown fields (which name only field names
/// and paths), or where a schema mismatch happened.
fn valueless_reason(e: StrictError) -> String {
    match e {
        StrictError::Schema(e) => location_only(&e),
        StrictError::Unknown(reason) => reason,
    }
}

/// The API server folds `stringData` into `data` on write; do the same for manifests.
fn merge_string_data(secret: &mut Secret) {
    if let Some(string_data) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for (k, v) in string_data {
            data.insert(k, ByteString(v.into_bytes()));
        }
    }
}

#[async_trait]
impl Catalog for ManifestCatalog {
    async fn external_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ExternalSecret>>, CatalogError> {
        Ok(self
            .external_secrets
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn secret_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<SecretStore>>, CatalogError> {
        Ok(self
            .secret_stores
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn cluster_secret_store(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ClusterSecretStore>>, CatalogError> {
        Ok(self.cluster_secret_stores.get(name).cloned())
    }

    async fn generator(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<GeneratorObject>, CatalogError> {
        let key = match kind {
            "Password" => ("Password", namespace),
            "VaultDynamicSecret" => ("VaultDynamicSecret", namespace),
            "PluginGenerator" => ("PluginGenerator", namespace),
            "ClusterGenerator" => ("ClusterGenerator", ""),
            _ => return Ok(None),
        };
        Ok(self
            .generators
            .get(&(key.0, key.1.to_string(), name.to_string()))
            .cloned())
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, CatalogError> {
        Ok(self.secrets.get(&(namespace.into(), name.into())).cloned())
    }

    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, CatalogError> {
        Ok(self
            .config_maps
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, CatalogError> {
        Ok(self.namespaces.get(namespace).cloned().unwrap_or_else(|| {
            BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), namespace.to_string())])
        }))
    }

    fn is_synced(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
