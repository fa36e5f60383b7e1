//! Messages and durations of the PushSecret loop: bounded, naming stores and remote keys only.

use std::sync::Arc;
use std::time::Duration;

use super::{DEFAULT_REFRESH, MAX_MESSAGE, MIN_REFRESH};
use crate::api::StoreKind;
use crate::api::push_secret::PushSecret;
use crate::catalog::Lenient;

/// `SecretStore/name` back into its parts.
pub(super) fn parse_store_key(key: &str) -> Option<(StoreKind, &str)> {
    let (kind, name) = key.split_once('/')?;
    let kind = match kind {
        "SecretStore" => StoreKind::SecretStore,
        "ClusterSecretStore" => StoreKind::ClusterSecretStore,
        _ => return None,
    };
    Some((kind, name))
}

/// The stores and remote keys of `object`, for messages (bounded).
pub(super) fn describe_targets(object: &PushSecret) -> String {
    let stores: Vec<String> = object
        .spec
        .secret_store_refs
        .iter()
        .map(|s| s.describe())
        .collect();
    let mut remotes: Vec<&str> = object
        .spec
        .data
        .iter()
        .map(|d| d.match_.remote_ref.remote_key.as_str())
        .collect();
    remotes.sort_unstable();
    remotes.dedup();
    bounded(format!(
        "{} (remote keys {})",
        stores.join(", "),
        remotes.join(", ")
    ))
}

/// `text` cut to [`MAX_MESSAGE`] bytes at a character boundary.
pub(super) fn bounded(mut text: String) -> String {
    if text.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

pub(super) fn refresh(object: &PushSecret) -> Duration {
    match object
        .spec
        .refresh_interval
        .as_deref()
        .map(crate::api::duration::parse)
    {
        None | Some(None) => DEFAULT_REFRESH,
        Some(Some(d)) if d.is_zero() => Duration::from_secs(24 * 3600),
        Some(Some(d)) => d.clamp(MIN_REFRESH, Duration::from_secs(24 * 3600)),
    }
}

pub(super) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// A PushSecret as the loop keeps it: without managedFields (an entry per writer, the
/// controller's own status writes among them, each a tree of JSON maps) and kubectl's last
/// applied configuration, which no reconcile reads.
pub(super) fn compact(object: &mut Lenient<PushSecret>) {
    let metadata = match object {
        // Just deserialized, so not shared: `make_mut` does not copy.
        Lenient::Usable(push) => &mut Arc::make_mut(push).metadata,
        Lenient::Unusable { metadata, .. } => &mut **metadata,
    };
    metadata.managed_fields = None;
    if let Some(annotations) = metadata.annotations.as_mut() {
        annotations.remove(crate::api::LAST_APPLIED_ANNOTATION);
    }
}
