//! References ESO stores make that Latchkey reads differently: credential Secret selectors, fixed
//! service accounts (Latchkey always acts as the pod or the ExternalSecret's account) and token
//! audiences. Shared by the store and Vault conversions.

use super::fields::Fields;
use super::notes::Notes;
use crate::api::store::SecretKeySelector;

/// Why a fixed service account is not carried over.
const SERVICE_ACCOUNT_WHY: &str = "Latchkey authenticates as the pod's own service account \
     (mounts) or the ExternalSecret's spec.serviceAccountName (mirrored Secrets), never a fixed \
     one; not carried over";

/// A reference to a key of a Secret (`name`, `key`, `namespace`).
pub(super) fn selector(
    f: &mut Fields<'_>,
    key: &str,
    notes: &mut Notes,
) -> Option<SecretKeySelector> {
    let path = f.at(key);
    let mut s = f.object(key, notes)?;
    let name = s.string("name", notes);
    let k = s.string("key", notes);
    let namespace = s.string("namespace", notes);
    s.finish(notes);
    match (name, k) {
        (Some(name), Some(key)) => Some(SecretKeySelector {
            name,
            key,
            namespace,
        }),
        _ => {
            notes.warn(path, "needs name and key; not carried over");
            None
        }
    }
}

/// The token audience of a `serviceAccountRef` (`audiences`, at most one is kept); its `name`
/// (and `namespace`) become a note.
pub(super) fn service_account_ref(
    f: &mut Fields<'_>,
    key: &str,
    notes: &mut Notes,
) -> Option<String> {
    let mut s = f.object(key, notes)?;
    s.drop_field("name", notes, SERVICE_ACCOUNT_WHY);
    s.drop_field("namespace", notes, SERVICE_ACCOUNT_WHY);
    let audience = audience(&mut s, notes);
    s.finish(notes);
    audience
}

/// `audiences`: Latchkey requests one token audience per store.
pub(super) fn audience(f: &mut Fields<'_>, notes: &mut Notes) -> Option<String> {
    let path = f.at("audiences");
    let mut audiences = f.string_list("audiences", notes);
    if audiences.len() > 1 {
        notes.warn(
            path,
            "Latchkey requests a token for one audience: the first is kept, the others are not \
             carried over",
        );
    }
    (!audiences.is_empty()).then(|| audiences.remove(0))
}
