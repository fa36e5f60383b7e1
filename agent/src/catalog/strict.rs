//! Strict reading of manifest documents: a field its kind does not know (a typo such as
//! `remoteRef.propery`, or a field of the External Secrets Operator that Latchkey lacks) is refused,
//! naming its path and the closest known field, instead of being silently ignored.
//!
//! Only for manifests. The API types stay lenient (no `deny_unknown_fields`) because they also
//! read objects from the API server, where a newer CRD may carry fields an older agent does not
//! know. Here the document is deserialized through `serde_ignored`, which reports every field the
//! types skip; the known fields at that place come from the kinds' generated CRD schema (Latchkey
//! kinds) or from short fixed lists (`metadata`, and the `v1` Secret and Namespace).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;
use serde::de::DeserializeOwned;

use crate::api::generator::{ClusterGenerator, Password, PluginGenerator, VaultDynamicSecret};
use crate::api::provider_kinds::{
    self, CLUSTER_PROVIDER_API_VERSION, PROVIDER_API_VERSION, ProviderKind,
};
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore};

/// The kinds a manifest directory may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `latchkey.dev/v1alpha1` ExternalSecret.
    ExternalSecret,
    /// `latchkey.dev/v1alpha1` SecretStore.
    SecretStore,
    /// `latchkey.dev/v1alpha1` ClusterSecretStore.
    ClusterSecretStore,
    /// `generators.latchkey.dev/v1alpha1` Password.
    Password,
    /// `generators.latchkey.dev/v1alpha1` VaultDynamicSecret.
    VaultDynamicSecret,
    /// `generators.latchkey.dev/v1alpha1` PluginGenerator.
    PluginGenerator,
    /// `generators.latchkey.dev/v1alpha1` ClusterGenerator.
    ClusterGenerator,
    /// `v1` Secret.
    Secret,
    /// `v1` Namespace.
    Namespace,
    /// `v1` ConfigMap.
    ConfigMap,
    /// A provider object: `providers.latchkey.dev/v1alpha1`, or with `true`
    /// `cluster.providers.latchkey.dev/v1alpha1`.
    Provider(ProviderKind, bool),
}

impl Kind {
    /// Every kind, for lookups by name.
    const ALL: [Kind; 22] = [
        Kind::ExternalSecret,
        Kind::SecretStore,
        Kind::ClusterSecretStore,
        Kind::Password,
        Kind::VaultDynamicSecret,
        Kind::PluginGenerator,
        Kind::ClusterGenerator,
        Kind::Secret,
        Kind::Namespace,
        Kind::ConfigMap,
        Kind::Provider(ProviderKind::Aws, false),
        Kind::Provider(ProviderKind::Vault, false),
        Kind::Provider(ProviderKind::Kubernetes, false),
        Kind::Provider(ProviderKind::Fake, false),
        Kind::Provider(ProviderKind::Plugin, false),
        Kind::Provider(ProviderKind::SecretsStoreCsiProvider, false),
        Kind::Provider(ProviderKind::Aws, true),
        Kind::Provider(ProviderKind::Vault, true),
        Kind::Provider(ProviderKind::Kubernetes, true),
        Kind::Provider(ProviderKind::Fake, true),
        Kind::Provider(ProviderKind::Plugin, true),
        Kind::Provider(ProviderKind::SecretsStoreCsiProvider, true),
    ];

    /// The `kind` field.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::ExternalSecret => "ExternalSecret",
            Kind::SecretStore => "SecretStore",
            Kind::ClusterSecretStore => "ClusterSecretStore",
            Kind::Password => "Password",
            Kind::VaultDynamicSecret => "VaultDynamicSecret",
            Kind::PluginGenerator => "PluginGenerator",
            Kind::ClusterGenerator => "ClusterGenerator",
            Kind::Secret => "Secret",
            Kind::Namespace => "Namespace",
            Kind::ConfigMap => "ConfigMap",
            Kind::Provider(kind, _) => kind.name(),
        }
    }

    /// The `apiVersion` this agent reads the kind at.
    pub(super) fn api_version(self) -> &'static str {
        match self {
            Kind::ExternalSecret | Kind::SecretStore | Kind::ClusterSecretStore => {
                LATCHKEY_API_VERSION
            }
            Kind::Password
            | Kind::VaultDynamicSecret
            | Kind::PluginGenerator
            | Kind::ClusterGenerator => crate::api::GENERATOR_API_VERSION,
            Kind::Secret | Kind::Namespace | Kind::ConfigMap => "v1",
            Kind::Provider(_, false) => PROVIDER_API_VERSION,
            Kind::Provider(_, true) => CLUSTER_PROVIDER_API_VERSION,
        }
    }

    /// True for kinds without a namespace.
    pub(super) fn cluster_scoped(self) -> bool {
        matches!(
            self,
            Kind::ClusterSecretStore
                | Kind::ClusterGenerator
                | Kind::Namespace
                | Kind::Provider(_, true)
        )
    }

    /// The kind called `name`, whatever its `apiVersion` (the namespaced one of a provider
    /// kind, which both provider groups serve).
    pub(super) fn named(name: &str) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind called `name` at `api_version`.
    pub(super) fn of(api_version: &str, name: &str) -> Option<Kind> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name && k.api_version() == api_version)
    }
}

/// `apiVersion` of the ExternalSecret and store kinds.
const LATCHKEY_API_VERSION: &str = "latchkey.dev/v1alpha1";

/// Why a document could not be read strictly.
#[derive(Debug)]
pub(super) enum StrictError {
    /// The document does not match its type at `path` (`spec.refreshInterval`, empty at the
    /// root); the serde message may quote a value.
    Schema {
        /// Where, as `serde_path_to_error` renders it.
        path: String,
        /// The serde error.
        error: serde_norway::Error,
    },
    /// The document matches but has fields its kind does not know: the description, naming only
    /// field names and paths.
    Unknown(String),
}

/// Deserializes a document of `kind` as `T`, refusing fields that `T` would ignore.
pub(super) fn from_value<T: DeserializeOwned>(
    kind: Kind,
    value: serde_norway::Value,
) -> Result<T, StrictError> {
    let mut ignored = Vec::new();
    // Two wrappers: `serde_ignored` reports skipped fields, `serde_path_to_error` says where a
    // type error happened (a `Value` carries no line numbers, so the path is all there is).
    let mut record = |path: serde_ignored::Path<'_>| ignored.push(steps(&path));
    let deserializer = serde_ignored::Deserializer::new(value, &mut record);
    let obj = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        StrictError::Schema {
            path: if path == "." { String::new() } else { path },
            error: e.into_inner(),
        }
    })?;
    ignored.retain(|path| !tolerated(path));
    match describe(kind, &ignored) {
        Some(reason) => Err(StrictError::Unknown(reason)),
        None => Ok(obj),
    }
}

/// One step of a path into a document.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// A field of an object.
    Field(String),
    /// An element of a list.
    Index(usize),
}

fn steps(path: &serde_ignored::Path<'_>) -> Vec<Step> {
    fn collect(path: &serde_ignored::Path<'_>, out: &mut Vec<Step>) {
        use serde_ignored::Path;
        match path {
            Path::Root => {}
            Path::Seq { parent, index } => {
                collect(parent, out);
                out.push(Step::Index(*index));
            }
            Path::Map { parent, key } => {
                collect(parent, out);
                out.push(Step::Field(key.clone()));
            }
            // Wrappers that do not show in the document.
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => collect(parent, out),
        }
    }
    let mut out = Vec::new();
    collect(path, &mut out);
    out
}

/// Ignored fields that are fine: the type header (the derived root structs of the Latchkey kinds
/// skip it; the loader has already read it), and anything under `status`, which is observed state
/// (what `kubectl get -o yaml` prints) that the agent never reads.
fn tolerated(path: &[Step]) -> bool {
    match path.first() {
        Some(Step::Field(f)) if f == "status" => true,
        Some(Step::Field(f)) if path.len() == 1 => f == "apiVersion" || f == "kind",
        _ => false,
    }
}

/// At most this many unknown fields are described; the rest are counted.
const MAX_DESCRIBED: usize = 5;

/// The reason for refusing a document with these unknown fields, or `None` if there are none.
fn describe(kind: Kind, unknown: &[Vec<Step>]) -> Option<String> {
    if unknown.is_empty() {
        return None;
    }
    // Generated only for a document with a mistake: building the schema costs far more than
    // reading the document.
    let schema = crd_schema(kind);
    let mut parts: Vec<String> = unknown
        .iter()
        .take(MAX_DESCRIBED)
        .map(|path| describe_one(kind, schema.as_ref(), path))
        .collect();
    if parts.is_empty() {
        return None;
    }
    if unknown.len() > MAX_DESCRIBED {
        parts.push(format!("and {} more", unknown.len() - MAX_DESCRIBED));
    }
    Some(parts.join("; "))
}

fn describe_one(kind: Kind, schema: Option<&JSONSchemaProps>, path: &[Step]) -> String {
    let mut out = format!("unknown field {}", render(path));
    let Some((Step::Field(name), parent)) = path.split_last() else {
        return out;
    };
    let known = known_fields(kind, schema, parent);
    if let Some(close) = closest(name, &known) {
        out.push_str(&format!(": did you mean \"{close}\"?"));
    } else if !known.is_empty() {
        out.push_str(&format!(" (expected one of: {})", known.join(", ")));
    }
    if is_template(kind, parent) {
        out.push_str(TEMPLATE_HINT);
    }
    out
}

/// Appended to unknown fields under `spec.target.template`, where ESO's Go template options
/// (`engineVersion`, `templateFrom`, ...) land.
const TEMPLATE_HINT: &str = " - templates in Latchkey are CEL expressions under `data`, not Go \
     templates: see the templates part of README.md#using-it-from-a-pod";

fn is_template(kind: Kind, parent: &[Step]) -> bool {
    let template = ["spec", "target", "template"];
    kind == Kind::ExternalSecret
        && parent.len() >= template.len()
        && parent
            .iter()
            .zip(template)
            .all(|(step, name)| matches!(step, Step::Field(f) if f == name))
}

/// `spec.data[0].remoteRef.property`; a field that is not a plain name is quoted.
fn render(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Field(f) if !f.is_empty() && f.chars().all(is_name_char) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(f);
            }
            Step::Field(f) => out.push_str(&format!("[{f:?}]")),
        }
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The known field names (sorted) of the object at `parent`; empty where they are not known.
fn known_fields(kind: Kind, schema: Option<&JSONSchemaProps>, parent: &[Step]) -> Vec<String> {
    let fixed = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    match (kind, parent) {
        (_, [Step::Field(f)]) if f == "metadata" => fixed(OBJECT_META_FIELDS),
        (Kind::Secret, []) => fixed(SECRET_FIELDS),
        (Kind::Namespace, []) => fixed(NAMESPACE_FIELDS),
        (Kind::Namespace, [Step::Field(f)]) if f == "spec" => fixed(&["finalizers"]),
        (Kind::ConfigMap, []) => fixed(CONFIG_MAP_FIELDS),
        (Kind::Secret | Kind::Namespace | Kind::ConfigMap, _) => Vec::new(),
        (_, _) => {
            let mut node = schema;
            for step in parent {
                node = node.and_then(|s| child(s, step));
            }
            let mut names: Vec<String> = node
                .and_then(|s| s.properties.as_ref())
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            if parent.is_empty() {
                // The schema leaves out the header, which the API server checks itself.
                names.extend(fixed(&["apiVersion", "kind", "metadata"]));
                names.sort();
            }
            names
        }
    }
}

fn child<'a>(schema: &'a JSONSchemaProps, step: &Step) -> Option<&'a JSONSchemaProps> {
    match step {
        Step::Field(f) => schema.properties.as_ref().and_then(|p| p.get(f)).or(
            match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(s)) => Some(s),
                _ => None,
            },
        ),
        Step::Index(_) => match &schema.items {
            Some(JSONSchemaPropsOrArray::Schema(s)) => Some(s),
            _ => None,
        },
    }
}

/// The generated `openAPIV3Schema` of a Latchkey kind: the same one the API server validates
/// against, so the names suggested here are the ones a cluster accepts.
fn crd_schema(kind: Kind) -> Option<JSONSchemaProps> {
    let crd = match kind {
        Kind::ExternalSecret => ExternalSecret::crd(),
        Kind::SecretStore => SecretStore::crd(),
        Kind::ClusterSecretStore => ClusterSecretStore::crd(),
        Kind::Password => Password::crd(),
        Kind::VaultDynamicSecret => VaultDynamicSecret::crd(),
        Kind::PluginGenerator => PluginGenerator::crd(),
        Kind::ClusterGenerator => ClusterGenerator::crd(),
        Kind::Secret | Kind::Namespace | Kind::ConfigMap => return None,
        Kind::Provider(kind, cluster) => provider_kinds::crd(kind, cluster)?,
    };
    crd.spec
        .versions
        .into_iter()
        .next()?
        .schema?
        .open_api_v3_schema
}

/// `metadata` (ObjectMeta) fields, which every kind shares.
const OBJECT_META_FIELDS: &[&str] = &[
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "managedFields",
    "name",
    "namespace",
    "ownerReferences",
    "resourceVersion",
    "selfLink",
    "uid",
];

/// Top-level fields of a `v1` Secret.
const SECRET_FIELDS: &[&str] = &[
    "apiVersion",
    "data",
    "immutable",
    "kind",
    "metadata",
    "stringData",
    "type",
];

/// Top-level fields of a `v1` ConfigMap.
const CONFIG_MAP_FIELDS: &[&str] = &[
    "apiVersion",
    "binaryData",
    "data",
    "immutable",
    "kind",
    "metadata",
];

/// Top-level fields of a `v1` Namespace.
const NAMESPACE_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// The known name closest to `unknown` by edit distance (ignoring case, counting a swap of two
/// neighbours as one edit), if it is close enough to be the intended one.
fn closest<'a>(unknown: &str, known: &'a [String]) -> Option<&'a str> {
    let unknown_lower = unknown.to_ascii_lowercase();
    // A third of the name, at least one edit: `propery` -> `property`, `lables` -> `labels`, but
    // not `foo` -> `key`.
    let max = (unknown.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| {
            (
                strsim::osa_distance(&unknown_lower, &k.to_ascii_lowercase()),
                k,
            )
        })
        .filter(|(d, _)| *d <= max)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn closest_finds_typos_case_and_swaps_but_not_strangers() {
        let known = names(&["key", "property", "version", "decodingStrategy"]);
        assert_eq!(closest("propery", &known), Some("property"));
        assert_eq!(closest("Property", &known), Some("property"));
        assert_eq!(closest("verison", &known), Some("version"));
        assert_eq!(
            closest("decoding_strategy", &known),
            Some("decodingStrategy")
        );
        assert_eq!(closest("conversionStrategy", &known), None);
        assert_eq!(closest("foo", &known), None);
    }

    #[test]
    fn paths_render_with_list_indices_and_quoted_odd_names() {
        let path = [
            Step::Field("spec".into()),
            Step::Field("data".into()),
            Step::Index(0),
            Step::Field("remoteRef".into()),
            Step::Field("propery".into()),
        ];
        assert_eq!(render(&path), "spec.data[0].remoteRef.propery");
        let odd = [Step::Field("spec".into()), Step::Field("a.b".into())];
        assert_eq!(render(&odd), "spec[\"a.b\"]");
    }

    #[test]
    fn known_fields_follow_the_crd_schema() {
        let kind = Kind::ExternalSecret;
        let schema = crd_schema(kind);
        let at = |path: &[Step]| known_fields(kind, schema.as_ref(), path);
        let remote_ref = [
            Step::Field("spec".into()),
            Step::Field("data".into()),
            Step::Index(3),
            Step::Field("remoteRef".into()),
        ];
        assert_eq!(
            at(&remote_ref),
            names(&["decodingStrategy", "key", "property", "version"])
        );
        assert!(at(&[]).contains(&"spec".to_string()));
        assert!(at(&[]).contains(&"metadata".to_string()));
        assert!(at(&[Step::Field("metadata".into())]).contains(&"labels".to_string()));
    }
}
