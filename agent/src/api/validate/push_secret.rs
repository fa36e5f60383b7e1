//! A PushSecret: its stores (named or selected by label), its source (a Secret or a generator),
//! its template, its entries, and the fields not supported (refused, never ignored).

use std::collections::BTreeMap;

use super::Invalid;
use super::fields::{max_items, name, not_empty};
use crate::api::push_secret::{PushSecretSpec, PushSecretTemplate};
use crate::api::rules;
use crate::api::store::LabelSelector;

/// Checks a PushSecret spec for the rules the CRD schema also enforces, and that no two
/// entries write the same remote place (which only the agent checks: a rule comparing every
/// pair of entries would cost the API server too much).
pub fn push_secret(spec: &PushSecretSpec) -> Result<(), Invalid> {
    if spec.secret_store_refs.is_empty() || spec.data.is_empty() {
        return Err(Invalid::rule("spec", &rules::PUSH_STORES_AND_DATA));
    }
    max_items(
        "spec.secretStoreRefs",
        spec.secret_store_refs.len(),
        rules::MAX_PUSH_STORES,
    )?;
    let mut stores = BTreeMap::new();
    for (i, store) in spec.secret_store_refs.iter().enumerate() {
        let path = format!("spec.secretStoreRefs[{i}]");
        match (&store.name, &store.label_selector) {
            (Some(store_name), None) => {
                not_empty(format_args!("{path}.name"), store_name)?;
                name(format_args!("{path}.name"), store_name)?;
                // Selectors may overlap each other or a named store: the controller writes
                // each store once; only the same name twice is a mistake worth refusing.
                let key = store.describe();
                if let Some(first) = stores.insert(key.clone(), i) {
                    return Err(Invalid::schema(&path, rules::duplicate_key(&key, first)));
                }
            }
            (None, Some(selector)) => label_selector(&path, selector)?,
            _ => return Err(Invalid::rule(&path, &rules::PUSH_STORE_BY_NAME)),
        }
    }
    match (&spec.selector.secret, &spec.selector.generator_ref) {
        (Some(source), None) => name("spec.selector.secret.name", &source.name)?,
        (None, Some(generator)) => super::generator_ref("spec.selector.generatorRef", generator)?,
        _ => return Err(Invalid::rule("spec.selector", &rules::PUSH_ONE_SOURCE)),
    }
    if let Some(t) = &spec.template {
        template(t)?;
    }
    max_items("spec.data", spec.data.len(), rules::MAX_PUSH_DATA)?;
    let mut places = BTreeMap::new();
    let mut settings = BTreeMap::new();
    for (i, data) in spec.data.iter().enumerate() {
        let path = format!("spec.data[{i}].match");
        let m = &data.match_;
        not_empty(format_args!("{path}.secretKey"), &m.secret_key)?;
        if m.secret_key.chars().count() > rules::MAX_SECRET_KEY_LEN {
            return Err(Invalid::schema(
                format_args!("{path}.secretKey"),
                rules::too_long(rules::MAX_SECRET_KEY_LEN),
            ));
        }
        let remote = &m.remote_ref;
        bounded(
            format_args!("{path}.remoteRef.remoteKey"),
            &remote.remote_key,
        )?;
        if let Some(property) = &remote.property {
            bounded(format_args!("{path}.remoteRef.property"), property)?;
        }
        // A whole remote secret and a property of it, or one property twice, would be written
        // by two entries with different values: the last one would win on every push.
        let here = remote.property.as_deref();
        let written: &mut Vec<(Option<&str>, usize)> =
            places.entry(remote.remote_key.as_str()).or_default();
        if let Some((_, first)) = written
            .iter()
            .find(|(there, _)| here.is_none() || there.is_none() || *there == here)
        {
            return Err(Invalid(format!(
                "{path}.remoteRef: writes the same remote key (and property) as spec.data[{first}]"
            )));
        }
        written.push((here, i));
        if let Some(meta) = &data.metadata {
            let at = format!("spec.data[{i}]");
            super::push_metadata::metadata(&at, meta)?;
            // One remote secret is one write: its entries cannot ask for two different settings.
            let first = *settings.entry(remote.remote_key.as_str()).or_insert(i);
            if spec.data[first]
                .metadata
                .as_ref()
                .is_some_and(|m| m != meta)
            {
                return Err(Invalid(format!(
                    "{at}.metadata: differs from spec.data[{first}].metadata, which writes the \
                     same remote key; give them the same metadata, or set it on one of them"
                )));
            }
        }
    }
    if let Some(text) = &spec.refresh_interval {
        super::refresh_interval(text)?;
    }
    if let Some(sa) = &spec.service_account_name {
        name("spec.serviceAccountName", sa)?;
    }
    Ok(())
}

/// A store `labelSelector`: bounded (agent-only: the type is shared with stores'
/// `namespaceSelector`), and every requirement one Kubernetes accepts, so that a broken one is
/// refused rather than matching nothing in silence.
fn label_selector(path: &str, selector: &LabelSelector) -> Result<(), Invalid> {
    let path = format!("{path}.labelSelector");
    let terms = selector.match_labels.len() + selector.match_expressions.len();
    if terms > rules::MAX_PUSH_SELECTOR_TERMS {
        return Err(Invalid(format!(
            "{path}: more than {} matchLabels and matchExpressions together",
            rules::MAX_PUSH_SELECTOR_TERMS
        )));
    }
    for (i, e) in selector.match_expressions.iter().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        let ok = match e.operator.as_str() {
            "In" | "NotIn" => !e.values.is_empty(),
            "Exists" | "DoesNotExist" => e.values.is_empty(),
            _ => {
                return Err(Invalid(format!(
                    "{at}.operator: must be In, NotIn, Exists or DoesNotExist"
                )));
            }
        };
        if !ok {
            return Err(Invalid(format!(
                "{at}: In and NotIn need values, Exists and DoesNotExist take none"
            )));
        }
        max_items(
            format_args!("{at}.values"),
            e.values.len(),
            rules::MAX_PUSH_SELECTOR_TERMS,
        )?;
    }
    Ok(())
}

/// `spec.template`: CEL only, no field that shapes a Secret, bounded as an ExternalSecret's.
fn template(t: &PushSecretTemplate) -> Result<(), Invalid> {
    if t.engine_version.is_some() || t.template_from.is_some() {
        return Err(Invalid::rule("spec.template", &rules::PUSH_TEMPLATE_CEL));
    }
    let shapes_a_secret = t.template.type_.is_some()
        || t.template
            .metadata
            .as_ref()
            .is_some_and(|m| !m.labels.is_empty() || !m.annotations.is_empty());
    if shapes_a_secret {
        return Err(Invalid::rule(
            "spec.template",
            &rules::PUSH_TEMPLATE_NO_SECRET_FIELDS,
        ));
    }
    if t.template.data.len() > rules::MAX_TEMPLATE_KEYS {
        return Err(Invalid::schema(
            "spec.template.data",
            rules::too_many_properties(rules::MAX_TEMPLATE_KEYS),
        ));
    }
    Ok(())
}

/// A remote key or property: set, and within `maxLength`.
fn bounded(path: impl std::fmt::Display + Copy, s: &str) -> Result<(), Invalid> {
    not_empty(path, s)?;
    if s.chars().count() > rules::MAX_REMOTE_KEY_LEN {
        return Err(Invalid::schema(
            path,
            rules::too_long(rules::MAX_REMOTE_KEY_LEN),
        ));
    }
    Ok(())
}
