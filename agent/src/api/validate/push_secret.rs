//! A PushSecret: its stores, its source (a Secret or a generator), its entries, and the fields
//! not supported yet (refused, never ignored).

use std::collections::BTreeMap;

use super::Invalid;
use super::fields::{max_items, name, not_empty};
use crate::api::push_secret::PushSecretSpec;
use crate::api::rules;

/// Checks a PushSecret spec for the rules the CRD schema also enforces, and that no two
/// entries write the same remote place (which only the agent checks: a rule comparing every
/// pair of entries would cost the API server too much).
pub fn push_secret(spec: &PushSecretSpec) -> Result<(), Invalid> {
    if spec.secret_store_refs.is_empty() || spec.data.is_empty() {
        return Err(Invalid::rule("spec", &rules::PUSH_STORES_AND_DATA));
    }
    if spec.template.is_some() {
        return Err(Invalid::rule("spec", &rules::PUSH_NO_TEMPLATE));
    }
    max_items(
        "spec.secretStoreRefs",
        spec.secret_store_refs.len(),
        rules::MAX_PUSH_STORES,
    )?;
    let mut stores = BTreeMap::new();
    for (i, store) in spec.secret_store_refs.iter().enumerate() {
        let path = format!("spec.secretStoreRefs[{i}]");
        if store.label_selector.is_some() {
            return Err(Invalid::rule(&path, &rules::PUSH_STORE_BY_NAME));
        }
        not_empty(format_args!("{path}.name"), &store.name)?;
        name(format_args!("{path}.name"), &store.name)?;
        if let Some(first) = stores.insert(store.status_key(), i) {
            return Err(Invalid::schema(
                &path,
                rules::duplicate_key(&store.status_key(), first),
            ));
        }
    }
    match (&spec.selector.secret, &spec.selector.generator_ref) {
        (Some(source), None) => name("spec.selector.secret.name", &source.name)?,
        (None, Some(generator)) => super::generator_ref("spec.selector.generatorRef", generator)?,
        _ => return Err(Invalid::rule("spec.selector", &rules::PUSH_ONE_SOURCE)),
    }
    max_items("spec.data", spec.data.len(), rules::MAX_PUSH_DATA)?;
    let mut places = BTreeMap::new();
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
    }
    if let Some(text) = &spec.refresh_interval {
        super::refresh_interval(text)?;
    }
    if let Some(sa) = &spec.service_account_name {
        name("spec.serviceAccountName", sa)?;
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
