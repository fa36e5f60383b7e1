//! Reading one manifest document: its header, whether the agent reads its kind, and the object.
//! Every reason returned here names fields and paths, never a value from the document.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use serde::Deserialize;

use super::super::lenient::without_values;
use super::super::strict::{self, Kind, StrictError};
use crate::api::generator::{
    ClusterGenerator, GeneratorObject, Password, PluginGenerator, VaultDynamicSecret,
};
use crate::api::provider_kinds::{
    self, CLUSTER_PROVIDER_GROUP, KindVisitor, PROVIDER_GROUP, ProviderKind, ProviderObject,
    ProviderResource,
};
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore};
use crate::telemetry::escape::printable;

/// The label the API server sets on every Namespace; set here too so selectors behave the same.
pub(super) const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A loaded object.
#[derive(Clone)]
pub(super) enum Object {
    ExternalSecret(Arc<ExternalSecret>),
    SecretStore(Arc<SecretStore>),
    ClusterSecretStore(Arc<ClusterSecretStore>),
    Generator(GeneratorObject),
    Secret(Arc<Secret>),
    ConfigMap(Arc<ConfigMap>),
    /// A Namespace's labels (with [`NAMESPACE_NAME_LABEL`]).
    Namespace(BTreeMap<String, String>),
    /// A provider object, as the store block it stands for.
    Provider(Arc<ProviderObject>),
}

/// The header every Kubernetes document has.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Header {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: Meta,
}

/// The part of `metadata` the loader needs.
#[derive(Deserialize, Default)]
pub(super) struct Meta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// Longest header field or reason kept; far past any valid name, so only hostile text is cut.
const MAX_SHOWN_CHARS: usize = 1000;

/// Reads the header of a document; the reason names the field, not its value. Its fields reach
/// log lines and messages, so control characters are escaped (no valid name has any).
pub(super) fn header(value: &serde_norway::Value) -> Result<Header, String> {
    let mut header = serde_path_to_error::deserialize::<_, Header>(value.clone()).map_err(|e| {
        let path = e.path().to_string();
        at(&path, &without_values(&e.into_inner().to_string()))
    })?;
    for field in [
        &mut header.api_version,
        &mut header.kind,
        &mut header.metadata.name,
    ] {
        *field = printable(field, MAX_SHOWN_CHARS);
    }
    if let Some(ns) = &mut header.metadata.namespace {
        *ns = printable(ns, MAX_SHOWN_CHARS);
    }
    Ok(header)
}

/// What the loader does with a document, by its `apiVersion` and `kind`.
pub(super) enum Class {
    /// A kind the agent reads.
    Read(Kind),
    /// Not for this agent (a Deployment next to its ExternalSecret): skipped, with a hint for
    /// the kinds `latchkey convert` reads.
    Skip(&'static str),
    /// Meant for this agent but unreadable: under `Some(kind)` a pod naming it gets the reason.
    Refuse(Option<Kind>, String),
}

/// The API groups whose kinds `latchkey convert` translates.
const CONVERTIBLE_GROUPS: &[&str] = &[
    "external-secrets.io",
    "generators.external-secrets.io",
    "secrets-store.csi.x-k8s.io",
];

pub(super) fn classify(api_version: &str, kind: &str) -> Class {
    if api_version.is_empty() || kind.is_empty() {
        return Class::Refuse(None, "apiVersion and kind are required".into());
    }
    if let Some(known) = Kind::of(api_version, kind) {
        return Class::Read(known);
    }
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    if group == PROVIDER_GROUP || group == CLUSTER_PROVIDER_GROUP {
        let known: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.name()).collect();
        let cluster = group == CLUSTER_PROVIDER_GROUP;
        return match ProviderKind::named(kind) {
            Some(provider) => Class::Refuse(
                Some(Kind::Provider(provider, cluster)),
                format!(
                    "apiVersion {api_version} is not one this agent reads; {kind} is {}",
                    Kind::Provider(provider, cluster).api_version()
                ),
            ),
            None => Class::Refuse(
                None,
                format!(
                    "unsupported provider kind {kind} ({api_version}); expected one of {}",
                    known.join(", ")
                ),
            ),
        };
    }
    if group == crate::api::GROUP || group == crate::api::GENERATOR_GROUP {
        return match Kind::named(kind)
            .filter(|k| !matches!(k, Kind::Secret | Kind::Namespace | Kind::ConfigMap))
        {
            Some(known) => Class::Refuse(
                Some(known),
                format!(
                    "apiVersion {api_version} is not one this agent reads; {kind} is {}",
                    known.api_version()
                ),
            ),
            None => Class::Refuse(
                None,
                format!(
                    "unsupported kind {kind} ({api_version}); expected latchkey.dev/v1alpha1 \
                     SecretStore, ClusterSecretStore or ExternalSecret, or {} Password, \
                     VaultDynamicSecret, PluginGenerator or ClusterGenerator",
                    crate::api::GENERATOR_API_VERSION
                ),
            ),
        };
    }
    if kind == "List" {
        // `kubectl get -o yaml` of several objects: skipping it would drop them unseen.
        return Class::Refuse(
            None,
            "a List: write its items as separate documents (`---`)".into(),
        );
    }
    if CONVERTIBLE_GROUPS.contains(&group) {
        Class::Skip(" (`latchkey convert` writes the Latchkey objects from it)")
    } else {
        Class::Skip("")
    }
}

/// Reads a document of `kind` strictly, in namespace `ns` (empty for cluster-scoped kinds).
pub(super) fn object(
    kind: Kind,
    ns: &str,
    name: &str,
    value: serde_norway::Value,
) -> Result<Object, String> {
    let with_ns = |meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.namespace = Some(ns.to_string());
    };
    Ok(match kind {
        Kind::ExternalSecret => {
            // ExternalSecrets hold no values, so the full serde message is safe to show.
            let mut obj: ExternalSecret = strict::from_value(kind, value).map_err(full_reason)?;
            with_ns(&mut obj.metadata);
            Object::ExternalSecret(Arc::new(obj))
        }
        Kind::SecretStore => {
            let mut obj: SecretStore = strict::from_value(kind, value).map_err(valueless_reason)?;
            with_ns(&mut obj.metadata);
            Object::SecretStore(Arc::new(obj))
        }
        Kind::ClusterSecretStore => {
            let obj: ClusterSecretStore =
                strict::from_value(kind, value).map_err(valueless_reason)?;
            Object::ClusterSecretStore(Arc::new(obj))
        }
        Kind::Password => {
            let mut obj: Password = strict::from_value(kind, value).map_err(valueless_reason)?;
            with_ns(&mut obj.metadata);
            Object::Generator(GeneratorObject::Password(Arc::new(obj)))
        }
        Kind::VaultDynamicSecret => {
            let mut obj: VaultDynamicSecret =
                strict::from_value(kind, value).map_err(valueless_reason)?;
            with_ns(&mut obj.metadata);
            Object::Generator(GeneratorObject::VaultDynamicSecret(Arc::new(obj)))
        }
        Kind::PluginGenerator => {
            let mut obj: PluginGenerator =
                strict::from_value(kind, value).map_err(valueless_reason)?;
            with_ns(&mut obj.metadata);
            Object::Generator(GeneratorObject::Plugin(Arc::new(obj)))
        }
        Kind::ClusterGenerator => {
            let obj: ClusterGenerator =
                strict::from_value(kind, value).map_err(valueless_reason)?;
            Object::Generator(GeneratorObject::Cluster(Arc::new(obj)))
        }
        Kind::Secret => {
            let mut obj: Secret = strict::from_value(kind, value).map_err(valueless_reason)?;
            with_ns(&mut obj.metadata);
            merge_string_data(&mut obj);
            Object::Secret(Arc::new(obj))
        }
        Kind::ConfigMap => {
            let mut obj: ConfigMap = strict::from_value(kind, value).map_err(valueless_reason)?;
            with_ns(&mut obj.metadata);
            Object::ConfigMap(Arc::new(obj))
        }
        Kind::Provider(provider, cluster) => {
            provider_kinds::visit(provider, cluster, ReadProvider { kind, ns, value })?
        }
        Kind::Namespace => {
            let obj: Namespace = strict::from_value(kind, value).map_err(valueless_reason)?;
            let mut labels = obj.metadata.labels.unwrap_or_default();
            labels.insert(NAMESPACE_NAME_LABEL.into(), name.to_string());
            Object::Namespace(labels)
        }
    })
}

/// Reads a provider object of the visited type strictly.
struct ReadProvider<'a> {
    kind: Kind,
    ns: &'a str,
    value: serde_norway::Value,
}

impl KindVisitor for ReadProvider<'_> {
    type Output = Result<Object, String>;

    fn namespaced<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        // A Fake provider's spec holds values: the reason must not quote them.
        let mut obj: T = strict::from_value(self.kind, self.value).map_err(valueless_reason)?;
        obj.meta_mut().namespace = Some(self.ns.to_string());
        Ok(Object::Provider(obj.provider_object()))
    }

    fn cluster<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::ClusterResourceScope>,
    {
        let obj: T = strict::from_value(self.kind, self.value).map_err(valueless_reason)?;
        Ok(Object::Provider(obj.provider_object()))
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

/// `spec.refreshInterval: invalid type, expected a string`; no path at the root.
/// Map keys in the path are the document's own text: escaped like the header.
fn at(path: &str, reason: &str) -> String {
    let full = if path.is_empty() || path == "." {
        reason.to_string()
    } else {
        format!("{path}: {reason}")
    };
    printable(&full, MAX_SHOWN_CHARS)
}

/// The reason for a document that holds no values (an ExternalSecret): where, and serde's full
/// message.
fn full_reason(e: StrictError) -> String {
    match e {
        StrictError::Schema { path, error } => at(&path, &error.to_string()),
        StrictError::Unknown(reason) => reason,
    }
}

/// The reason for a document that may hold values: unknown fields (which name only field names
/// and paths), or where a schema mismatch happened and what was expected there. A message of a
/// shape not known to be value-free (a custom error, such as a base64 decoder's, can quote
/// part of the value) is replaced by a generic one.
fn valueless_reason(e: StrictError) -> String {
    match e {
        StrictError::Schema { path, error } => {
            let message = error.to_string();
            let safe = [
                "invalid type",
                "invalid value",
                "invalid length",
                "unknown variant",
            ]
            .iter()
            .any(|p| message.starts_with(p))
                || message.starts_with("missing field `")
                || message.starts_with("duplicate field `");
            let reason = if safe {
                without_values(&message)
            } else {
                "does not match the schema".to_string()
            };
            at(&path, &reason)
        }
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
