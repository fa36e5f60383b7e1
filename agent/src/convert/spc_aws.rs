//! The AWS provider's SecretProviderClass parameters (`region`, `objects`, ...) -> an `aws` store
//! with web identity (the pod's token, as IRSA) and one entry per file; `ssmparameter` objects
//! go to a second, `ParameterStore` store when the class mixes both services.

use serde_norway::Value;

use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::Meta;
use super::spc_entries::{Entry, Group, file_name_ok, read_mode};
use crate::api::RemoteRef;
use crate::api::store::{AwsAuth, AwsJwtAuth, AwsProvider, StoreProvider};

/// Written where the class names no region; the store fails until it is replaced.
pub const REGION_PLACEHOLDER: &str = "REPLACE_ME";
/// Written as the role to assume; the class cannot name it (IRSA keeps it on the service account).
pub const ROLE_PLACEHOLDER: &str = "arn:aws:iam::ACCOUNT_ID:role/REPLACE_ME";

/// Converts the `aws` parameters into one group.
pub fn convert(
    params: &mut Fields<'_>,
    meta: &Meta,
    notes: &mut Notes,
) -> Result<Vec<Group>, String> {
    let region = params.string("region", notes);
    if region.is_none() {
        notes.warn(
            params.at("region"),
            format!(
                "is not set (the provider used the node's region): replace the placeholder \
                 region {REGION_PLACEHOLDER} in SecretStore {}",
                meta.name
            ),
        );
    }
    notes.warn(
        "",
        format!(
            "the provider authenticated with the pod's IRSA role (the service account's \
             eks.amazonaws.com/role-arn annotation), which a SecretProviderClass does not name: \
             replace the placeholder role {ROLE_PLACEHOLDER} in SecretStore {} with it",
            meta.name
        ),
    );
    params.drop_field(
        "failoverRegion",
        notes,
        "Latchkey reads one region; failover to a second region is not carried over",
    );
    params.drop_field(
        "preferredAddressType",
        notes,
        "Latchkey uses Secrets Manager's default endpoint (or spec.provider.aws.endpoint); not \
         carried over",
    );
    if params.flag("usePodIdentity", notes) == Some(true) {
        notes.warn(
            params.at("usePodIdentity"),
            "EKS Pod Identity has no Latchkey equivalent: the store uses web identity \
             (auth.jwt, the pod's token with audience sts.amazonaws.com) to assume the role \
             instead; give the role a trust policy for the cluster's OIDC provider",
        );
    }
    let translation = path_translation(params, notes);
    let objects_path = params.at("objects");
    let text = params
        .string("objects", notes)
        .ok_or_else(|| format!("{objects_path} is missing: nothing to mount"))?;
    let objects = super::spc_vault::objects_yaml(&text, &objects_path)?;
    let Value::Sequence(items) = &objects else {
        return Err(format!("{objects_path}: is not a YAML list of objects"));
    };
    let (mut secrets, mut parameters) = (Vec::new(), Vec::new());
    for (i, item) in items.iter().enumerate() {
        let path = format!("{objects_path}[{i}]");
        if let Some(mut f) = Fields::of(item, &path, notes) {
            match object(&mut f, translation, notes) {
                (Service::SecretsManager, e) => secrets.extend(e),
                (Service::ParameterStore, e) => parameters.extend(e),
            }
        }
    }
    let region = region.unwrap_or_else(|| REGION_PLACEHOLDER.into());
    // A store reads one service: a class mixing both becomes two stores (the Secrets Manager
    // one first, named as the class), and two ExternalSecrets.
    let mut groups = Vec::new();
    for (service, suffix, entries) in [
        ("SecretsManager", "", secrets),
        ("ParameterStore", "ssm", parameters),
    ] {
        if entries.is_empty() {
            continue;
        }
        groups.push(Group {
            suffix: suffix.into(),
            provider: StoreProvider {
                aws: Some(AwsProvider {
                    service: service.into(),
                    region: region.clone(),
                    endpoint: None,
                    role: Some(ROLE_PLACEHOLDER.into()),
                    auth: Some(AwsAuth {
                        jwt: Some(AwsJwtAuth { audience: None }),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            },
            entries,
        });
    }
    Ok(groups)
}

/// Which AWS service an object is read from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Service {
    SecretsManager,
    ParameterStore,
}

/// `pathTranslation`: the character that replaces `/` in file names made from object names
/// (`_` by default, none when `False`).
fn path_translation(params: &mut Fields<'_>, notes: &mut Notes) -> Option<char> {
    let path = params.at("pathTranslation");
    let Some(text) = params.string("pathTranslation", notes) else {
        return Some('_');
    };
    let mut chars = text.chars();
    match (
        text.to_ascii_lowercase().as_str(),
        chars.next(),
        chars.next(),
    ) {
        ("true", _, _) => Some('_'),
        ("false", _, _) => None,
        (_, Some(c), None) if c != '/' => Some(c),
        _ => {
            notes.warn(
                path,
                format!(
                    "{} is not True, False or one character; the default _ is used",
                    quoted(&text)
                ),
            );
            Some('_')
        }
    }
}

/// One item of `objects`: its service, and the secret's own file and its `jmesPath` files.
fn object(
    f: &mut Fields<'_>,
    translation: Option<char>,
    notes: &mut Notes,
) -> (Service, Vec<Entry>) {
    // Every field is read before the object is judged, so that a typo is reported as unknown
    // even in an object dropped for another reason.
    let name = f.string("objectName", notes);
    let ty = f.string("objectType", notes);
    let alias = f.string("objectAlias", notes);
    let id = f.string("objectVersion", notes);
    let label = f.string("objectVersionLabel", notes);
    let failover = f.value("failoverObject").is_some();
    let mode = read_mode(f, notes);
    let jmes = jmes_paths(f, notes);
    f.finish(notes);
    let Some(name) = name else {
        notes.warn(f.at("objectName"), "is missing; object not carried over");
        return (Service::SecretsManager, Vec::new());
    };
    let is_arn = name.starts_with("arn:");
    let ssm = match ty.as_deref() {
        Some("secretsmanager") => false,
        Some("ssmparameter") => true,
        Some(other) => {
            notes.warn(
                f.at("objectType"),
                format!(
                    "{} is not secretsmanager or ssmparameter; object not carried over",
                    quoted(other)
                ),
            );
            return (Service::SecretsManager, Vec::new());
        }
        None if is_arn => name.contains(":ssm:"),
        None => {
            notes.warn(
                f.at("objectType"),
                "is missing (the provider requires it unless objectName is an ARN); read as \
                 secretsmanager",
            );
            false
        }
    };
    let service = if ssm {
        Service::ParameterStore
    } else {
        Service::SecretsManager
    };
    let file = match (&alias, translation) {
        (Some(a), _) => a.clone(),
        (None, Some(c)) => name.replace('/', &c.to_string()),
        (None, None) => name.clone(),
    };
    let file_at = if alias.is_some() {
        f.at("objectAlias")
    } else {
        f.at("objectName")
    };
    // Secrets Manager versions are ids (`uuid/`); a parameter's are numbers, taken as they are.
    let pinned = |id: String| match service {
        Service::SecretsManager => format!("uuid/{id}"),
        Service::ParameterStore => id,
    };
    let version = match (id, label) {
        (Some(id), Some(_)) => {
            notes.warn(
                f.at("objectVersionLabel"),
                "Latchkey pins one version: objectVersion (the version id) is kept, the label \
                 is not carried over",
            );
            Some(pinned(id))
        }
        (Some(id), None) => Some(pinned(id)),
        (None, label) => label,
    };
    if failover {
        notes.warn(
            f.at("failoverObject"),
            "Latchkey reads one region; the failover object is not carried over",
        );
    }
    let mut entries = Vec::new();
    if file_name_ok(&file_at, &file, notes) {
        entries.push(Entry {
            secret_key: file,
            remote_ref: RemoteRef {
                key: name.clone(),
                version: version.clone(),
                ..Default::default()
            },
            mode,
            path: f.path().to_string(),
        });
    }
    for (path, expr, alias) in jmes {
        let (Some((expr, expr_at)), Some((alias, alias_at))) = (expr, alias) else {
            notes.warn(path, "needs path and objectAlias; not carried over");
            continue;
        };
        let Some(property) = dotted_path(&expr) else {
            notes.warn(
                expr_at,
                format!(
                    "JMESPath expression {} is not a plain dotted path (a.b.c), which is all \
                     remoteRef.property takes; file {} not carried over",
                    quoted(&expr),
                    quoted(&alias)
                ),
            );
            continue;
        };
        if file_name_ok(&alias_at, &alias, notes) {
            entries.push(Entry {
                secret_key: alias,
                remote_ref: RemoteRef {
                    key: name.clone(),
                    property: Some(property),
                    version: version.clone(),
                    ..Default::default()
                },
                mode,
                path,
            });
        }
    }
    (service, entries)
}

/// A `jmesPath` item: its path, and its expression and alias with theirs.
type JmesPath = (String, Option<(String, String)>, Option<(String, String)>);

/// An object's `jmesPath` items, read.
fn jmes_paths(f: &mut Fields<'_>, notes: &mut Notes) -> Vec<JmesPath> {
    let mut out = Vec::new();
    for (path, item) in f.list("jmesPath", notes) {
        let Some(mut j) = Fields::of(item, &path, notes) else {
            continue;
        };
        let expr_at = j.at("path");
        let alias_at = j.at("objectAlias");
        let expr = j.string("path", notes).map(|e| (e, expr_at));
        let alias = j.string("objectAlias", notes).map(|a| (a, alias_at));
        j.finish(notes);
        out.push((path, expr, alias));
    }
    out
}

/// A JMESPath expression that is only field names joined by dots (`a.b`, `"my-key".c`), as the
/// dotted property path Latchkey takes; `None` for anything else (indexes, filters, functions).
pub fn dotted_path(expr: &str) -> Option<String> {
    let mut out = Vec::new();
    for segment in expr.split('.') {
        let name = match segment.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
            Some(quoted) if !quoted.is_empty() && !quoted.contains(['"', '\\']) => quoted,
            Some(_) => return None,
            None => {
                let mut chars = segment.chars();
                let first_ok = chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
                if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return None;
                }
                segment
            }
        };
        out.push(name);
    }
    Some(out.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_dotted_paths_become_properties() {
        assert_eq!(dotted_path("username").as_deref(), Some("username"));
        assert_eq!(dotted_path("db.host").as_deref(), Some("db.host"));
        assert_eq!(dotted_path("\"my-key\".x").as_deref(), Some("my-key.x"));
        for bad in [
            "a[0]",
            "a.b[?x=='y']",
            "",
            "a..b",
            "length(a)",
            "\"a.b\"",
            "1a",
        ] {
            assert_eq!(dotted_path(bad), None, "{bad}");
        }
    }
}
