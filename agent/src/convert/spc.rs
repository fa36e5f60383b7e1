//! Secrets Store CSI Driver `SecretProviderClass` -> a SecretStore and an ExternalSecret per
//! backend location (the provider modules read the parameters), `secretObjects` -> mirrored
//! Secrets, and the pod volume that replaces the CSI driver's. aws and vault classes become
//! native stores; any other provider becomes a `secretsStoreCSI` store ([`spc_csi`]).

use std::collections::BTreeSet;

use serde_norway::Mapping;

use super::fields::Fields;
use super::mirrored::{BEFORE_CSI, DEFAULT_SERVICE_ACCOUNT, service_account_note};
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::spc_entries::{Entry, Group};
use super::spc_objects::{Converted, class_external_secret, class_store, volume_snippet};
use super::{spc_aws, spc_csi, spc_vault};
use crate::api::ExternalSecret;
use crate::api::external_secret::{
    CreationPolicy, ExternalSecretData, FileItem, Files, Target, Template, TemplateMetadata,
};

/// Converts the SecretProviderClass whose top-level fields are `top`.
pub fn convert(top: &mut Fields<'_>, meta: &Meta, notes: &mut Notes) -> Result<Converted, String> {
    let mut spec = top
        .object("spec", notes)
        .ok_or("spec is missing or not an object")?;
    let provider = spec
        .string("provider", notes)
        .ok_or("spec.provider is missing")?;
    let empty = Mapping::new();
    let mut params = spec
        .object("parameters", notes)
        .unwrap_or_else(|| Fields::new(&empty, spec.at("parameters")));
    let mut groups = match provider.as_str() {
        "aws" => spc_aws::convert(&mut params, meta, notes)?,
        "vault" => spc_vault::convert(&mut params, meta, notes)?,
        "" => {
            return Err(
                "spec.provider: unknown provider \"\": the class names no provider".to_string(),
            );
        }
        // Any other provider is called as it is, through its own provider pod.
        other => return spc_csi::convert(other, &mut spec, &mut params, meta, notes),
    };
    params.finish(notes);
    drop_duplicate_files(&mut groups, notes);
    groups.retain(|g| !g.entries.is_empty());
    if groups.is_empty() {
        return Err("no object of spec.parameters.objects could be converted".into());
    }
    let names: Vec<String> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| group_name(&meta.name, i, &g.suffix))
        .collect();
    if groups.len() > 1 {
        notes.warn(
            "spec.parameters.objects",
            format!(
                "the objects live in {} different KV mounts or AWS services and a Latchkey \
                 store reads one: converted into the stores and ExternalSecrets {}, one pod \
                 volume each (see the volume below)",
                groups.len(),
                names.join(", ")
            ),
        );
    }
    let mut external_secrets: Vec<ExternalSecret> = groups
        .iter()
        .zip(&names)
        .map(|(g, name)| external_secret(meta, name, g))
        .collect();
    let mirrors = secret_objects(
        &mut spec,
        meta,
        &groups,
        &names,
        &mut external_secrets,
        notes,
    );
    spec.finish(notes);

    let mut documents = Vec::new();
    for (g, name) in groups.iter().zip(&names) {
        let store = class_store(meta, name, g.provider.clone());
        documents.push(Document::SecretStore(Box::new(store)));
    }
    documents.extend(
        external_secrets
            .into_iter()
            .chain(mirrors)
            .map(|es| Document::ExternalSecret(Box::new(es))),
    );
    Ok(Converted {
        documents,
        trailer: volume_snippet(&meta.name, &names, false),
    })
}

/// The name of the `i`th group's store and ExternalSecret.
fn group_name(base: &str, i: usize, suffix: &str) -> String {
    if i == 0 {
        return base.to_string();
    }
    let candidate = format!("{base}-{suffix}");
    if crate::identity::is_dns_subdomain(&candidate) {
        candidate
    } else {
        format!("{base}-{}", i + 1)
    }
}

/// Two entries with one file name cannot both be written; the CSI driver would have failed too.
fn drop_duplicate_files(groups: &mut [Group], notes: &mut Notes) {
    let mut seen = BTreeSet::new();
    for g in groups.iter_mut() {
        g.entries.retain(|e| {
            let fresh = seen.insert(e.secret_key.clone());
            if !fresh {
                notes.warn(
                    &e.path,
                    format!(
                        "file name {} is used twice; this entry is not carried over",
                        quoted(&e.secret_key)
                    ),
                );
            }
            fresh
        });
    }
}

/// The mount-only ExternalSecret of one group.
fn external_secret(meta: &Meta, name: &str, group: &Group) -> ExternalSecret {
    let data = group
        .entries
        .iter()
        .map(|e| ExternalSecretData {
            source_ref: None,
            secret_key: e.secret_key.clone(),
            remote_ref: e.remote_ref.clone(),
        })
        .collect();
    let target = group
        .entries
        .iter()
        .any(|e| e.mode.is_some())
        .then(|| Target {
            // Items restrict the volume to the listed keys, so every entry is listed.
            files: Some(Files {
                default_mode: None,
                items: group
                    .entries
                    .iter()
                    .map(|e| FileItem {
                        key: e.secret_key.clone(),
                        path: e.secret_key.clone(),
                        mode: e.mode,
                    })
                    .collect(),
            }),
            ..Default::default()
        });
    class_external_secret(meta, name, name, data, Vec::new(), target)
}

/// One `secretObjects` item, read.
struct SyncedSecret {
    path: String,
    secret_name: String,
    template: Template,
    /// (Secret key, group index, entry) for each `data` item that names a file of the class.
    keys: Vec<(String, usize, Entry)>,
}

/// `spec.secretObjects`: Secrets the CSI driver synced while pods mounted the class. When one
/// Secret holds exactly the files of the only ExternalSecret under their own names, that
/// ExternalSecret mirrors it; otherwise each becomes an ExternalSecret of its own, so the mounted
/// files stay exactly what they were.
fn secret_objects(
    spec: &mut Fields<'_>,
    meta: &Meta,
    groups: &[Group],
    names: &[String],
    external_secrets: &mut [ExternalSecret],
    notes: &mut Notes,
) -> Vec<ExternalSecret> {
    let mut synced = Vec::new();
    for (path, item) in spec.list("secretObjects", notes) {
        if let Some(s) = synced_secret(&path, item, groups, notes) {
            synced.push(s);
        }
    }
    let mut mirrors = Vec::new();
    let whole_group = |s: &SyncedSecret| {
        let keys: BTreeSet<&str> = s.keys.iter().map(|(k, _, _)| k.as_str()).collect();
        let files: BTreeSet<&str> = groups[0]
            .entries
            .iter()
            .map(|e| e.secret_key.as_str())
            .collect();
        groups.len() == 1
            && s.keys.iter().all(|(k, _, e)| *k == e.secret_key)
            && keys == files
            && keys.len() == s.keys.len()
    };
    let single = synced.len() == 1;
    for s in synced {
        notes.warn(
            &s.path,
            format!(
                "mirrored whether or not a pod mounts the class: {}",
                service_account_note(
                    meta.namespace.as_deref(),
                    DEFAULT_SERVICE_ACCOUNT,
                    &s.secret_name,
                    BEFORE_CSI,
                )
            ),
        );
        let target = Target {
            template: (s.template != Template::default()).then(|| s.template.clone()),
            name: Some(s.secret_name.clone()),
            creation_policy: Some(CreationPolicy::Owner),
            ..Default::default()
        };
        if single && whole_group(&s) {
            let es = &mut external_secrets[0];
            let files = es.spec.target.take().and_then(|t| t.files);
            es.spec.target = Some(Target { files, ..target });
            continue;
        }
        let group = s.keys.first().map(|(_, g, _)| *g).unwrap_or(0);
        let mut name = s.secret_name.clone();
        if names.contains(&name) {
            name = format!("{name}-mirror");
        }
        let data = s
            .keys
            .iter()
            .map(|(key, _, e)| ExternalSecretData {
                source_ref: None,
                secret_key: key.clone(),
                remote_ref: e.remote_ref.clone(),
            })
            .collect();
        mirrors.push(class_external_secret(
            meta,
            &name,
            &names[group],
            data,
            Vec::new(),
            Some(target),
        ));
    }
    mirrors
}

/// Reads one `secretObjects` item; `None` (with a note) when it cannot be mirrored.
fn synced_secret(
    path: &str,
    item: &serde_norway::Value,
    groups: &[Group],
    notes: &mut Notes,
) -> Option<SyncedSecret> {
    let mut f = Fields::of(item, path, notes)?;
    let secret_name = f.string("secretName", notes);
    let type_ = f.string("type", notes);
    let labels = f.strings("labels", notes);
    let annotations = f.strings("annotations", notes);
    let mut keys = Vec::new();
    for (dpath, d) in f.list("data", notes) {
        let Some(mut df) = Fields::of(d, &dpath, notes) else {
            continue;
        };
        let object = df.string("objectName", notes);
        let key = df.string("key", notes);
        df.finish(notes);
        let (Some(object), Some(key)) = (object, key) else {
            notes.warn(
                &dpath,
                "needs objectName and key; this key is not carried over",
            );
            continue;
        };
        let found = groups.iter().enumerate().find_map(|(g, group)| {
            group
                .entries
                .iter()
                .find(|e| e.secret_key == object)
                .map(|e| (g, e.clone()))
        });
        match found {
            Some((g, e)) if keys.first().is_none_or(|(_, g0, _)| *g0 == g) => {
                keys.push((key, g, e))
            }
            Some(_) => notes.warn(
                format!("{dpath}.objectName"),
                format!(
                    "{} comes from another KV mount than this Secret's first key, and a \
                     Latchkey ExternalSecret reads one store; not carried over",
                    quoted(&object)
                ),
            ),
            None => notes.warn(
                format!("{dpath}.objectName"),
                format!(
                    "{} is not a converted file of this class; not carried over",
                    quoted(&object)
                ),
            ),
        }
    }
    f.finish(notes);
    let Some(secret_name) = secret_name else {
        notes.warn(
            f.at("secretName"),
            "is missing; this Secret is not carried over",
        );
        return None;
    };
    if keys.is_empty() {
        notes.warn(path, "has no key that could be converted; not carried over");
        return None;
    }
    let metadata = (!labels.is_empty() || !annotations.is_empty()).then_some(TemplateMetadata {
        labels,
        annotations,
    });
    Some(SyncedSecret {
        path: path.to_string(),
        secret_name,
        template: Template {
            type_,
            metadata,
            ..Default::default()
        },
        keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_groups_get_a_suffix() {
        assert_eq!(group_name("db", 0, "kv"), "db");
        assert_eq!(group_name("db", 1, "kv"), "db-kv");
        assert_eq!(group_name("db", 2, "Not_Valid"), "db-3");
    }
}
