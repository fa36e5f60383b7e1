//! External Secrets Operator `ClusterExternalSecret` (v1, v1beta1) -> Latchkey
//! ClusterExternalSecret. The fields are ESO's; `externalSecretSpec` is converted exactly as an
//! ExternalSecret's spec (same notes, at `spec.externalSecretSpec`), and the deprecated
//! `namespaceSelector` becomes one more entry of `namespaceSelectors` (ESO ORs them too).

use serde_norway::{Mapping, Value};

use super::eso;
use super::fields::Fields;
use super::notes::Notes;
use super::output::{Document, Meta};
use crate::api::cluster_external_secret::{
    ClusterExternalSecret, ClusterExternalSecretSpec, ExternalSecretMetadata,
};
use crate::api::store::{LabelSelector, LabelSelectorRequirement};

/// Where the embedded ExternalSecret spec sits in the input.
const SPEC: &str = "spec.externalSecretSpec";

/// Converts the ClusterExternalSecret whose top-level fields are `top`.
pub fn cluster_external_secret(
    top: &mut Fields<'_>,
    meta: &Meta,
    notes: &mut Notes,
) -> Result<Vec<Document>, String> {
    let mut spec = top
        .object("spec", notes)
        .ok_or("spec is missing or not an object")?;
    let external_secret_name = spec.string("externalSecretName", notes);
    let external_secret_metadata = spec.object("externalSecretMetadata", notes).map(|mut m| {
        let labels = m.strings("labels", notes);
        let annotations = m.strings("annotations", notes);
        m.finish(notes);
        ExternalSecretMetadata {
            labels,
            annotations,
        }
    });
    let mut namespace_selectors = Vec::new();
    if let Some(mut f) = spec.object("namespaceSelector", notes) {
        namespace_selectors.extend(label_selector(&mut f, notes));
    }
    for (path, item) in spec.list("namespaceSelectors", notes) {
        if let Some(mut f) = Fields::of(item, &path, notes) {
            namespace_selectors.extend(label_selector(&mut f, notes));
        }
    }
    let namespaces = spec.string_list("namespaces", notes);
    let refresh_time = spec.duration("refreshTime", notes, "Latchkey's default is 1m, as ESO's");
    let inner = spec
        .value("externalSecretSpec")
        .ok_or("spec.externalSecretSpec is missing")?;
    spec.finish(notes);
    if namespaces.is_empty() && namespace_selectors.is_empty() {
        notes.warn(
            "spec",
            "neither namespaces nor namespaceSelectors is set: no namespace gets the \
             ExternalSecret (as in ESO)",
        );
    }
    let external_secret_spec = embedded_spec(inner, meta, external_secret_name.as_deref(), notes)?;
    let mut ces = ClusterExternalSecret::new(
        &meta.name,
        ClusterExternalSecretSpec {
            external_secret_spec,
            external_secret_name,
            external_secret_metadata,
            namespace_selectors,
            namespaces,
            refresh_time,
        },
    );
    ces.metadata = meta.object_meta(&meta.name, false);
    Ok(vec![Document::ClusterExternalSecret(Box::new(ces))])
}

/// `spec.externalSecretSpec`, converted as an ExternalSecret's `spec`; its notes and unknown
/// fields are reported at their path under `spec.externalSecretSpec`.
fn embedded_spec(
    inner: &Value,
    meta: &Meta,
    name: Option<&str>,
    notes: &mut Notes,
) -> Result<crate::api::ExternalSecretSpec, String> {
    let mut wrapper = Mapping::new();
    wrapper.insert("spec".into(), inner.clone());
    let mut top = Fields::new(&wrapper, "");
    let es_meta = Meta {
        name: name.unwrap_or(&meta.name).to_string(),
        ..Meta::default()
    };
    let mut own = Notes::new(notes.subject.clone());
    let converted = eso::external_secret(&mut top, &es_meta, &mut own);
    for mut note in own.list {
        note.path = deeper(&note.path);
        notes.list.push(note);
    }
    notes.unknown.extend(own.unknown.iter().map(|p| deeper(p)));
    let why = |e: String| deeper(&e);
    match converted.map_err(why)?.pop() {
        Some(Document::ExternalSecret(es)) => Ok(es.spec),
        _ => Err(format!("{SPEC}: no ExternalSecret spec could be converted")),
    }
}

/// A path (or a message starting with one) of the embedded ExternalSecret, moved under
/// `spec.externalSecretSpec`.
fn deeper(path: &str) -> String {
    match path.strip_prefix("spec") {
        Some(rest) if rest.is_empty() || rest.starts_with(['.', ' ', ':']) => {
            format!("{SPEC}{rest}")
        }
        _ => path.to_string(),
    }
}

/// A Kubernetes label selector (`matchLabels`, `matchExpressions`); `None`, with a note, when a
/// requirement cannot be read: without it the selector would match more namespaces.
fn label_selector(s: &mut Fields<'_>, notes: &mut Notes) -> Option<LabelSelector> {
    let match_labels = s.strings("matchLabels", notes);
    let mut match_expressions = Vec::new();
    let mut complete = true;
    for (path, item) in s.list("matchExpressions", notes) {
        let Some(mut e) = Fields::of(item, &path, notes) else {
            complete = false;
            continue;
        };
        let key = e.string("key", notes);
        let operator = e.string("operator", notes);
        let values = e.string_list("values", notes);
        e.finish(notes);
        match (key, operator) {
            (Some(key), Some(operator)) => match_expressions.push(LabelSelectorRequirement {
                key,
                operator,
                values,
            }),
            _ => {
                notes.warn(path, "needs key and operator");
                complete = false;
            }
        }
    }
    s.finish(notes);
    if !complete {
        notes.warn(
            s.path(),
            "selector not carried over: without its unreadable requirement it would select \
             more namespaces",
        );
        return None;
    }
    Some(LabelSelector {
        match_labels,
        match_expressions,
    })
}

#[cfg(test)]
mod tests {
    use crate::convert::{Input, convert};

    fn run(text: &str) -> crate::convert::Conversion {
        convert(&[Input {
            name: "in.yaml".into(),
            text: text.into(),
        }])
        .unwrap()
    }

    #[test]
    fn an_unknown_field_of_the_embedded_spec_is_named_at_its_path() {
        let c = run(r#"
apiVersion: external-secrets.io/v1
kind: ClusterExternalSecret
metadata: {name: shared}
spec:
  namespaces: [shop]
  externalSecretSpec:
    secretStoreRef: {name: vault, kind: ClusterSecretStore}
    data: [{secretKey: k, remoteRef: {key: k, bogus: 1}}]
"#);
        assert_eq!(c.failed, 1, "{:?}", c.messages);
        let all = c.messages.join("\n");
        assert!(
            all.contains("spec.externalSecretSpec.data[0].remoteRef.bogus"),
            "{all}"
        );
        assert_eq!(c.documents, 0);
    }

    #[test]
    fn without_an_external_secret_spec_nothing_is_converted() {
        let c = run(r#"
apiVersion: external-secrets.io/v1beta1
kind: ClusterExternalSecret
metadata: {name: shared}
spec:
  namespaces: [shop]
"#);
        assert_eq!(c.failed, 1);
        assert!(
            c.messages
                .join("\n")
                .contains("spec.externalSecretSpec is missing"),
            "{:?}",
            c.messages
        );
    }

    #[test]
    fn an_embedded_spec_error_is_reported_at_its_path() {
        let c = run(r#"
apiVersion: external-secrets.io/v1
kind: ClusterExternalSecret
metadata: {name: shared}
spec:
  namespaces: [shop]
  externalSecretSpec:
    data: [{secretKey: k, remoteRef: {key: k}}]
"#);
        assert_eq!(c.failed, 1);
        let all = c.messages.join("\n");
        assert!(
            all.contains("spec.externalSecretSpec.secretStoreRef"),
            "{all}"
        );
    }
}
