//! The converted Latchkey documents of one input object, checked with the agent's own validation
//! and rendered as YAML with `# latchkey convert:` comments.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::errors::ConvertError;
use super::notes::Notes;
use crate::api::cluster_external_secret::ClusterExternalSecret;
use crate::api::generator::{ClusterGenerator, Password, VaultDynamicSecret};
use crate::api::provider_kinds::{
    CLUSTER_PROVIDER_API_VERSION, PROVIDER_API_VERSION, ProviderKind,
};
use crate::api::push_secret::PushSecret;
use crate::api::store::StoreProvider;
use crate::api::validate::{self, Invalid};
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore, StoreKind};

/// The prefix of every comment the conversion writes.
pub const COMMENT: &str = "# latchkey convert: ";

/// One Latchkey document.
#[derive(Debug, Clone)]
pub enum Document {
    /// `latchkey.dev/v1alpha1` ExternalSecret.
    ExternalSecret(Box<ExternalSecret>),
    /// `latchkey.dev/v1alpha1` SecretStore.
    SecretStore(Box<SecretStore>),
    /// `latchkey.dev/v1alpha1` ClusterSecretStore.
    ClusterSecretStore(Box<ClusterSecretStore>),
    /// `generators.latchkey.dev/v1alpha1` Password.
    Password(Box<Password>),
    /// `generators.latchkey.dev/v1alpha1` VaultDynamicSecret.
    VaultDynamicSecret(Box<VaultDynamicSecret>),
    /// `generators.latchkey.dev/v1alpha1` ClusterGenerator.
    ClusterGenerator(Box<ClusterGenerator>),
    /// `latchkey.dev/v1alpha1` ClusterExternalSecret.
    ClusterExternalSecret(Box<ClusterExternalSecret>),
    /// `latchkey.dev/v1alpha1` PushSecret.
    PushSecret(Box<PushSecret>),
    /// A provider object (`convert --provider-refs`).
    Provider(Box<ProviderDoc>),
}

impl Document {
    /// Kind, namespace and name: two documents with the same identity cannot both be applied.
    pub fn identity(&self) -> (&'static str, String, String) {
        let (kind, meta) = match self {
            Document::ExternalSecret(o) => ("ExternalSecret", &o.metadata),
            Document::SecretStore(o) => ("SecretStore", &o.metadata),
            Document::ClusterSecretStore(o) => ("ClusterSecretStore", &o.metadata),
            Document::Password(o) => ("Password", &o.metadata),
            Document::VaultDynamicSecret(o) => ("VaultDynamicSecret", &o.metadata),
            Document::ClusterGenerator(o) => ("ClusterGenerator", &o.metadata),
            Document::ClusterExternalSecret(o) => ("ClusterExternalSecret", &o.metadata),
            Document::PushSecret(o) => ("PushSecret", &o.metadata),
            Document::Provider(o) => (o.kind.name(), &o.metadata),
        };
        let ns = match self {
            Document::ClusterSecretStore(_)
            | Document::ClusterGenerator(_)
            | Document::ClusterExternalSecret(_) => String::new(),
            Document::Provider(o) if o.cluster => String::new(),
            _ => meta.namespace.clone().unwrap_or_default(),
        };
        (kind, ns, meta.name.clone().unwrap_or_default())
    }

    /// `Kind namespace/name`, for messages.
    pub fn describe(&self) -> String {
        let (kind, ns, name) = self.identity();
        if matches!(self, Document::Provider(o) if o.cluster) {
            format!("Latchkey cluster-scoped {kind} {name}")
        } else if ns.is_empty() {
            format!("Latchkey {kind} {name}")
        } else {
            format!("Latchkey {kind} {ns}/{name}")
        }
    }

    /// The agent's validation of the object, as it runs before every use.
    pub fn validate(&self) -> Result<(), Invalid> {
        let (_, _, name) = self.identity();
        validate::object_name("metadata.name", &name)?;
        match self {
            Document::ExternalSecret(o) => validate::external_secret(&o.spec),
            Document::SecretStore(o) => store(
                &o.spec.provider,
                o.spec.provider_ref.as_ref(),
                StoreKind::SecretStore,
            ),
            Document::ClusterSecretStore(o) => store(
                &o.spec.provider,
                o.spec.provider_ref.as_ref(),
                StoreKind::ClusterSecretStore,
            ),
            Document::Password(o) => validate::generator::password("spec", &o.spec),
            Document::VaultDynamicSecret(o) => {
                validate::generator::vault_dynamic_secret("spec", &o.spec)
            }
            Document::ClusterGenerator(o) => validate::generator::cluster_generator(&o.spec),
            Document::ClusterExternalSecret(o) => validate::cluster_external_secret(&o.spec),
            Document::PushSecret(o) => validate::push_secret(&o.spec),
            Document::Provider(o) => validate::provider(&o.provider, o.store_kind()).map(|_| ()),
        }
    }

    /// The document as YAML (without the `---` separator).
    pub fn to_yaml(&self) -> Result<String, ConvertError> {
        let rendered = match self {
            Document::ExternalSecret(o) => serde_norway::to_string(o).map(|y| octal_modes(&y)),
            Document::SecretStore(o) => {
                serde_norway::to_value(o).and_then(|v| serde_norway::to_string(&with_audiences(v)))
            }
            Document::ClusterSecretStore(o) => serde_norway::to_string(o),
            Document::Password(o) => serde_norway::to_string(o),
            Document::VaultDynamicSecret(o) => serde_norway::to_string(o),
            Document::ClusterGenerator(o) => serde_norway::to_string(o),
            Document::ClusterExternalSecret(o) => serde_norway::to_string(o),
            Document::PushSecret(o) => serde_norway::to_string(o),
            Document::Provider(o) => o.to_value().and_then(|mut v| {
                if o.kind == ProviderKind::SecretsStoreCsiProvider
                    && let Some(csi) = v
                        .get_mut("spec")
                        .and_then(serde_norway::Value::as_mapping_mut)
                {
                    audiences_placeholder(csi);
                }
                serde_norway::to_string(&v)
            }),
        };
        rendered.map_err(|source| ConvertError::Render {
            what: self.describe(),
            source,
        })
    }
}

/// A provider object written by the conversion.
#[derive(Debug, Clone)]
pub struct ProviderDoc {
    /// Its kind.
    pub kind: ProviderKind,
    /// In `cluster.providers.latchkey.dev` (for a ClusterSecretStore).
    pub cluster: bool,
    /// Name and namespace, labels and annotations of the store it came from.
    pub metadata: ObjectMeta,
    /// The block, as the store had it inline.
    pub provider: StoreProvider,
}

impl ProviderDoc {
    /// `apiVersion` of the object.
    pub fn api_version(&self) -> &'static str {
        if self.cluster {
            CLUSTER_PROVIDER_API_VERSION
        } else {
            PROVIDER_API_VERSION
        }
    }

    /// The store kind whose rules the block is checked with.
    pub fn store_kind(&self) -> StoreKind {
        if self.cluster {
            StoreKind::ClusterSecretStore
        } else {
            StoreKind::SecretStore
        }
    }

    /// The object, fields in the order users write them: its `spec` is the block's content.
    pub fn to_value(&self) -> Result<serde_norway::Value, serde_norway::Error> {
        use serde_norway::{Mapping, Value};
        let block = match serde_norway::to_value(&self.provider)? {
            Value::Mapping(m) => m.into_iter().next().map(|(_, v)| v),
            _ => None,
        };
        let mut object = Mapping::new();
        object.insert("apiVersion".into(), self.api_version().into());
        object.insert("kind".into(), self.kind.name().into());
        object.insert("metadata".into(), serde_norway::to_value(&self.metadata)?);
        object.insert("spec".into(), block.unwrap_or(Value::Null));
        Ok(Value::Mapping(object))
    }
}

/// A store's validation: its inline block, or its `providerRef` (the object it names is a
/// document of its own, checked as one).
fn store(
    provider: &crate::api::store::StoreProvider,
    provider_ref: Option<&crate::api::store::ProviderRef>,
    kind: StoreKind,
) -> Result<(), Invalid> {
    match validate::provider_or_ref(provider, provider_ref, kind)? {
        Some(_) => Ok(()),
        None => validate::provider(provider, kind).map(|_| ()),
    }
}

/// An ExternalSecret's YAML with its file modes written in octal (`mode: 0440`) as users write
/// them, rather than in decimal (288). kubectl reads YAML 1.1, where `0440` is the integer 288,
/// and the agent's standalone loader reads it as octal text (`api::mode`): both get the same mode.
/// The only integers an ExternalSecret holds are `defaultMode` and `items[].mode`, and strings
/// that look like numbers are quoted by the emitter, so a line `mode: <digits>` is always one.
fn octal_modes(yaml: &str) -> String {
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        let indent = body.len() - body.trim_start_matches([' ', '-']).len();
        let (head, rest) = body.split_at(indent);
        let octal = ["mode: ", "defaultMode: "].iter().find_map(|key| {
            let digits = rest.strip_prefix(key)?;
            let mode: u32 = digits
                .parse()
                .ok()
                .filter(|_| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))?;
            Some(format!("{head}{key}{mode:#05o}").replace("0o", "0"))
        });
        match octal {
            Some(l) => {
                out.push_str(&l);
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => out.push_str(line),
        }
    }
    out
}

/// A `secretsStoreCSI` store with `audiences: []` written out (serialization leaves an empty list
/// out): the user must fill it in, as a note says, and an empty list shows where.
fn with_audiences(mut store: serde_norway::Value) -> serde_norway::Value {
    use serde_norway::Value;
    let csi = store
        .get_mut("spec")
        .and_then(|s| s.get_mut("provider"))
        .and_then(|p| p.get_mut("secretsStoreCSI"))
        .and_then(Value::as_mapping_mut);
    if let Some(csi) = csi {
        audiences_placeholder(csi);
    }
    store
}

/// `audiences: []` in a `secretsStoreCSI` block that has none, right after `provider`, before
/// the (often long) parameters.
fn audiences_placeholder(csi: &mut serde_norway::Mapping) {
    use serde_norway::Value;
    if csi.contains_key("audiences") {
        return;
    }
    let rest = std::mem::take(csi);
    for (key, value) in rest {
        let after = key.as_str() == Some("provider");
        csi.insert(key, value);
        if after {
            csi.insert("audiences".into(), Value::Sequence(Vec::new()));
        }
    }
}

/// Name, namespace, labels and annotations carried from the input object.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, if the input had one.
    pub namespace: Option<String>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations` (without kubectl's last-applied record).
    pub annotations: BTreeMap<String, String>,
}

impl Meta {
    /// `namespace/name`, or `name` without a namespace.
    pub fn qualified(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// Object metadata named `name`, with this object's namespace, labels and annotations.
    pub fn object_meta(&self, name: &str, namespaced: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: if namespaced {
                self.namespace.clone()
            } else {
                None
            },
            labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
            annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
            ..Default::default()
        }
    }
}

/// What became of one input object.
#[derive(Debug)]
pub struct Outcome {
    /// The notes (and the object's `Kind namespace/name` as their subject).
    pub notes: Notes,
    /// The converted documents, in output order.
    pub documents: Vec<Document>,
    /// Commented lines printed after the documents (the pod volume to use instead).
    pub trailer: Vec<String>,
    /// Why nothing was converted, when nothing was.
    pub failure: Option<String>,
}

impl Outcome {
    /// The outcome of an object that could not be converted at all.
    pub fn failed(notes: Notes, why: impl Into<String>) -> Self {
        Self {
            notes,
            documents: Vec::new(),
            trailer: Vec::new(),
            failure: Some(why.into()),
        }
    }

    /// Appends this outcome to the output: its comments, then its documents, then the trailer.
    pub fn render(&self, out: &mut String) -> Result<(), ConvertError> {
        let mut comments = vec![format!("{COMMENT}from {}", self.notes.subject)];
        comments.extend(self.notes.lines().map(|l| format!("{COMMENT}{l}")));
        if let Some(why) = &self.failure {
            comments.push(format!(
                "{COMMENT}{}: not converted: {why}",
                self.notes.subject
            ));
        }
        for (i, doc) in self.documents.iter().enumerate() {
            out.push_str("---\n");
            if i == 0 {
                push_lines(out, &comments);
            }
            out.push_str(&doc.to_yaml()?);
        }
        if self.documents.is_empty() {
            push_lines(out, &comments);
        }
        push_lines(out, &self.trailer);
        Ok(())
    }
}

/// Appends `lines` as they are safe to write: each stays one comment line.
fn push_lines(out: &mut String, lines: &[String]) {
    for line in lines {
        out.push_str(&super::notes::one_line(line));
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_written_in_octal() {
        let yaml = "spec:\n  target:\n    files:\n      defaultMode: 288\n      items:\n      - key: a\n        path: a\n        mode: 256\n      - mode: 4\n    template:\n      data:\n        mode: '288'\n";
        let out = octal_modes(yaml);
        assert!(out.contains("      defaultMode: 0440\n"), "{out}");
        assert!(out.contains("        mode: 0400\n"), "{out}");
        assert!(out.contains("      - mode: 0004\n"), "{out}");
        assert!(out.contains("        mode: '288'\n"), "{out}");
        let files: crate::api::external_secret::Files =
            serde_norway::from_str("defaultMode: 0440\nitems: [{key: a, path: a, mode: 0004}]")
                .unwrap();
        assert_eq!(files.default_mode, Some(0o440));
        assert_eq!(files.items[0].mode, Some(0o4));
    }
}
