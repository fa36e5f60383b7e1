//! `latchkey convert`: reads Secrets Store CSI Driver `SecretProviderClass`es and External Secrets
//! Operator objects and produces the equivalent Latchkey manifests. Every field that cannot be
//! carried over becomes a note (a `# latchkey convert:` comment and a stderr line); every document
//! produced passes the agent's own validation.
//!
//! Pure: inputs are texts, the output is text. Reading files and writing stdout is
//! `crate::cmd::convert`'s job.

pub mod errors;
mod eso;
mod eso_cluster;
mod eso_generator;
mod eso_push;
mod eso_push_metadata;
mod eso_refs;
mod eso_store;
mod eso_vault;
mod fields;
pub mod input;
mod mirrored;
mod notes;
mod output;
mod provider_refs;
mod spc;
mod spc_aws;
mod spc_csi;
mod spc_entries;
mod spc_objects;
mod spc_vault;
mod template;

use std::collections::BTreeSet;

pub use errors::ConvertError;
pub use input::Input;

use fields::Fields;
use input::Object;
use notes::Notes;
use output::{Meta, Outcome};

use crate::api::{LAST_APPLIED_ANNOTATION, StoreKind};

/// What a conversion produced.
#[derive(Debug)]
pub struct Conversion {
    /// The Latchkey YAML, comments included (stdout).
    pub yaml: String,
    /// One line per warning, unconverted object and skipped object, then a summary (stderr).
    pub messages: Vec<String>,
    /// How many Latchkey documents `yaml` holds; none means nothing could be converted.
    pub documents: usize,
    /// How many objects the inputs held.
    pub objects: usize,
    /// How many of them are of a converted kind but could not be converted (errors).
    pub failed: usize,
}

/// How the output is written.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Stores name a provider object of their own by `spec.providerRef` instead of holding the
    /// provider block inline (`--provider-refs`).
    pub provider_refs: bool,
}

/// Converts every object of `inputs` with the default [`Options`].
pub fn convert(inputs: &[Input]) -> Result<Conversion, ConvertError> {
    convert_with(inputs, Options::default())
}

/// Converts every object of `inputs`. Fails only when an input is not YAML (or past the YAML
/// bounds): objects and fields that cannot be converted are reported in the result (which may
/// hold no document at all), objects counted in `failed`.
pub fn convert_with(inputs: &[Input], options: Options) -> Result<Conversion, ConvertError> {
    let objects = input::objects(inputs)?;
    let mut yaml = String::new();
    let mut messages = Vec::new();
    let mut seen = BTreeSet::new();
    let (mut documents, mut warnings, mut converted, mut failed) = (0, 0, 0, 0);
    for obj in &objects {
        let mut outcome = match convert_object(obj) {
            Ok(outcome) => outcome,
            Err(skip) => {
                messages.push(format!("note: {}: skipped: {skip}", obj.origin));
                continue;
            }
        };
        if options.provider_refs {
            let documents = std::mem::take(&mut outcome.documents);
            outcome.documents = provider_refs::split(documents, &mut outcome.notes);
        }
        let outcome = checked(outcome, &mut seen);
        for line in outcome.notes.lines() {
            messages.push(format!("warning: {line}"));
        }
        warnings += outcome.notes.list.len();
        if let Some(why) = &outcome.failure {
            failed += 1;
            messages.push(format!(
                "error: {}: not converted: {why}",
                outcome.notes.subject
            ));
        } else {
            converted += 1;
        }
        documents += outcome.documents.len();
        outcome.render(&mut yaml)?;
    }
    messages.push(format!(
        "latchkey convert: {documents} Latchkey document(s) from {converted} of {} object(s), \
         {warnings} warning(s)",
        objects.len()
    ));
    Ok(Conversion {
        yaml,
        messages: messages.iter().map(|m| notes::one_line(m)).collect(),
        documents,
        objects: objects.len(),
        failed,
    })
}

/// What an input object is, by its `apiVersion` and `kind`.
enum Source {
    SecretProviderClass,
    ExternalSecret,
    ClusterExternalSecret,
    PushSecret,
    Store(StoreKind),
    /// An ESO generator of a kind Latchkey has.
    Generator(&'static str),
    /// A kind of the converted families that has no Latchkey equivalent: the reason.
    Unsupported(String),
}

/// Classifies an object; `Err` is why it is skipped (not a kind this command converts).
fn source(api_version: &str, kind: &str) -> Result<Source, String> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    match group {
        "secrets-store.csi.x-k8s.io" => match (kind, version) {
            ("SecretProviderClass", "v1" | "v1alpha1") => Ok(Source::SecretProviderClass),
            ("SecretProviderClass", _) => Ok(Source::Unsupported(format!(
                "apiVersion {api_version} is not supported (v1 and v1alpha1 are)"
            ))),
            _ => Err("the CSI driver's observed state, not configuration".into()),
        },
        "external-secrets.io" => match (kind, version) {
            ("ExternalSecret", "v1" | "v1beta1") => Ok(Source::ExternalSecret),
            ("ClusterExternalSecret", "v1" | "v1beta1") => Ok(Source::ClusterExternalSecret),
            ("PushSecret", "v1alpha1") => Ok(Source::PushSecret),
            ("PushSecret", _) => Ok(Source::Unsupported(format!(
                "apiVersion {api_version} is not supported (v1alpha1 is)"
            ))),
            ("SecretStore", "v1" | "v1beta1") => Ok(Source::Store(StoreKind::SecretStore)),
            ("ClusterSecretStore", "v1" | "v1beta1") => {
                Ok(Source::Store(StoreKind::ClusterSecretStore))
            }
            (
                "ExternalSecret" | "ClusterExternalSecret" | "SecretStore" | "ClusterSecretStore",
                _,
            ) => Ok(Source::Unsupported(format!(
                "apiVersion {api_version} is not supported (v1 and v1beta1 are): have ESO \
                     convert it to v1beta1 first"
            ))),
            _ => Ok(Source::Unsupported(format!(
                "{kind} has no Latchkey equivalent"
            ))),
        },
        "generators.external-secrets.io" => {
            match eso_generator::KINDS.iter().find(|k| **k == kind) {
                Some(k) if version == "v1alpha1" => Ok(Source::Generator(k)),
                Some(_) => Ok(Source::Unsupported(format!(
                    "apiVersion {api_version} is not supported (v1alpha1 is)"
                ))),
                None => Ok(Source::Unsupported(format!(
                    "the {kind} generator has no Latchkey equivalent (Latchkey has Password, \
                     VaultDynamicSecret, PluginGenerator and ClusterGenerator: \
                     docs/generators.md)"
                ))),
            }
        }
        "latchkey.dev" => Err("already a Latchkey object".into()),
        _ => Err("not a SecretProviderClass or an External Secrets Operator object".into()),
    }
}

/// Converts one object; `Err` is why it was skipped.
fn convert_object(obj: &Object) -> Result<Outcome, String> {
    let mut scratch = Notes::default();
    let mut top = Fields::of(&obj.value, "", &mut scratch)
        .ok_or("a document that is not a Kubernetes object")?;
    let api_version = top.string("apiVersion", &mut scratch).unwrap_or_default();
    let kind = top.string("kind", &mut scratch).unwrap_or_default();
    let source = source(&api_version, &kind).map_err(|why| {
        let name = obj.value["metadata"]["name"]
            .as_str()
            .unwrap_or("(unnamed)");
        match obj.value["metadata"]["namespace"].as_str() {
            Some(ns) => format!("{api_version} {kind} {ns}/{name}: {why}"),
            None => format!("{api_version} {kind} {name}: {why}"),
        }
    })?;
    let (meta, subject) = match meta(&mut top) {
        Ok((meta, notes)) => {
            let subject = format!("{kind} {}", meta.qualified());
            let mut n = Notes::new(&subject);
            n.list = notes.list;
            n.unknown = notes.unknown;
            (Some(meta), n)
        }
        Err(why) => (None, {
            let mut n = Notes::new(format!("{kind} ({})", obj.origin));
            n.warn("metadata", why);
            n
        }),
    };
    let mut notes = subject;
    let Some(meta) = meta else {
        return Ok(Outcome::failed(notes, "metadata.name is missing"));
    };
    top.drop_field("status", &mut notes, "observed state; not carried over");
    let result = match source {
        Source::Unsupported(why) => Err(why),
        Source::SecretProviderClass => {
            spc::convert(&mut top, &meta, &mut notes).map(|c| (c.documents, c.trailer))
        }
        Source::ExternalSecret => {
            eso::external_secret(&mut top, &meta, &mut notes).map(|d| (d, Vec::new()))
        }
        Source::ClusterExternalSecret => {
            eso_cluster::cluster_external_secret(&mut top, &meta, &mut notes)
                .map(|d| (d, Vec::new()))
        }
        Source::PushSecret => {
            eso_push::push_secret(&mut top, &meta, &mut notes).map(|d| (d, Vec::new()))
        }
        Source::Store(kind) => {
            eso_store::store(&mut top, &meta, kind, &mut notes).map(|d| (d, Vec::new()))
        }
        Source::Generator(kind) => {
            eso_generator::generator(&mut top, &meta, kind, &mut notes).map(|d| (d, Vec::new()))
        }
    };
    if result.is_ok() {
        top.finish(&mut notes);
    }
    // A field the conversion does not know could change what the object means: none of it is
    // converted rather than a guess written.
    if let Some(why) = notes.unknown_fields() {
        return Ok(Outcome::failed(notes, why));
    }
    Ok(match result {
        Ok((documents, trailer)) => Outcome {
            notes,
            documents,
            trailer,
            failure: None,
        },
        Err(why) => Outcome::failed(notes, why),
    })
}

/// Server-set metadata: observed state, never carried over.
const SERVER_SET: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Metadata fields an object may have that are not carried over, and why.
const NOT_CARRIED: &[(&str, &str)] = &[
    (
        "ownerReferences",
        "the object belongs to another (a ClusterExternalSecret, a GitOps tool's); not carried \
         over",
    ),
    (
        "finalizers",
        "set by the controllers of the old object; not carried over",
    ),
    (
        "generateName",
        "the converted objects are named after metadata.name; not carried over",
    ),
];

/// `metadata`: name (required), namespace, labels, annotations; notes for the rest.
fn meta(top: &mut Fields<'_>) -> Result<(Meta, Notes), String> {
    let mut notes = Notes::default();
    let mut m = top
        .object("metadata", &mut notes)
        .ok_or("metadata is missing")?;
    let name = m
        .string("name", &mut notes)
        .ok_or("metadata.name is missing")?;
    let namespace = m.string("namespace", &mut notes);
    let labels = m.strings("labels", &mut notes);
    let mut annotations = m.strings("annotations", &mut notes);
    if annotations.remove(LAST_APPLIED_ANNOTATION).is_some() {
        notes.warn(
            format!("metadata.annotations.{LAST_APPLIED_ANNOTATION}"),
            "kubectl's record of the old object; not carried over",
        );
    }
    let server_set: Vec<&str> = SERVER_SET
        .iter()
        .copied()
        .filter(|k| m.value(k).is_some())
        .collect();
    if !server_set.is_empty() {
        notes.warn(
            "metadata",
            format!(
                "{}: set by the API server; not carried over",
                server_set.join(", ")
            ),
        );
    }
    for (field, why) in NOT_CARRIED {
        m.drop_field(field, &mut notes, why);
    }
    m.finish(&mut notes);
    Ok((
        Meta {
            name,
            namespace,
            labels,
            annotations,
        },
        notes,
    ))
}

/// Keeps only documents that pass the agent's validation and are not already in the output.
fn checked(mut outcome: Outcome, seen: &mut BTreeSet<(&'static str, String, String)>) -> Outcome {
    let mut kept = Vec::new();
    for doc in std::mem::take(&mut outcome.documents) {
        if let Err(invalid) = doc.validate() {
            outcome.notes.warn(
                "",
                format!(
                    "the converted {} fails Latchkey's validation ({invalid}); not written",
                    doc.describe()
                ),
            );
            continue;
        }
        if !seen.insert(doc.identity()) {
            outcome.notes.warn(
                "",
                format!(
                    "the converted {} has the name of an earlier document; not written (rename \
                     one of them)",
                    doc.describe()
                ),
            );
            continue;
        }
        kept.push(doc);
    }
    if kept.is_empty() && outcome.failure.is_none() {
        outcome.failure = Some("no converted document is valid".into());
    }
    outcome.documents = kept;
    outcome
}

#[cfg(test)]
mod tests;
