//! External Secrets Operator generators (`generators.external-secrets.io/v1alpha1`) -> Latchkey
//! generators (`generators.latchkey.dev/v1alpha1`) for the kinds both have: `Password`,
//! `VaultDynamicSecret` and a `ClusterGenerator` wrapping one of them. The spec fields are
//! ESO's; the Vault block is a store's and is converted as one.

use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use crate::api::generator::{
    ClusterGenerator, ClusterGeneratorSpec, GeneratorKind, GeneratorSpecs, Password, PasswordSpec,
    VaultDynamicSecret, VaultDynamicSecretSpec, VaultResultType,
};

/// The ESO generator kinds converted.
pub const KINDS: &[&str] = &["Password", "VaultDynamicSecret", "ClusterGenerator"];

/// Converts the generator of `kind` (one of [`KINDS`]) whose top-level fields are `top`.
pub fn generator(
    top: &mut Fields<'_>,
    meta: &Meta,
    kind: &str,
    notes: &mut Notes,
) -> Result<Vec<Document>, String> {
    let mut spec = top
        .object("spec", notes)
        .ok_or("spec is missing or not an object")?;
    let doc = match kind {
        "Password" => {
            let mut g = Password::new(&meta.name, password(&mut spec, notes)?);
            g.metadata = meta.object_meta(&meta.name, true);
            Document::Password(Box::new(g))
        }
        "VaultDynamicSecret" => {
            let mut g = VaultDynamicSecret::new(&meta.name, vault_dynamic(&mut spec, notes)?);
            g.metadata = meta.object_meta(&meta.name, true);
            Document::VaultDynamicSecret(Box::new(g))
        }
        _ => {
            let mut g = ClusterGenerator::new(&meta.name, cluster(&mut spec, notes)?);
            g.metadata = meta.object_meta(&meta.name, false);
            Document::ClusterGenerator(Box::new(g))
        }
    };
    spec.finish(notes);
    Ok(vec![doc])
}

/// A `Password` spec (`spec` or `spec.generator.passwordSpec`).
fn password(f: &mut Fields<'_>, notes: &mut Notes) -> Result<PasswordSpec, String> {
    let count = |f: &mut Fields<'_>, key: &str, notes: &mut Notes| -> Result<Option<u32>, String> {
        match f.string(key, notes) {
            None => Ok(None),
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|_| format!("{}: {} is not a count", f.at(key), quoted(&text))),
        }
    };
    let length = count(f, "length", notes)?.unwrap_or(24);
    let digits = count(f, "digits", notes)?;
    let symbols = count(f, "symbols", notes)?;
    let symbol_characters = f.string("symbolCharacters", notes);
    let no_upper = f.flag("noUpper", notes).unwrap_or(false);
    let allow_repeat = f.flag("allowRepeat", notes).unwrap_or(false);
    f.finish(notes);
    Ok(PasswordSpec {
        length,
        digits,
        symbols,
        symbol_characters,
        no_upper,
        allow_repeat,
    })
}

/// A `VaultDynamicSecret` spec (`spec` or `spec.generator.vaultDynamicSecretSpec`).
fn vault_dynamic(f: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultDynamicSecretSpec, String> {
    let path = f
        .string("path", notes)
        .ok_or_else(|| format!("{} is missing", f.at("path")))?;
    let method = f.string("method", notes);
    let parameters = match f.value("parameters") {
        None => None,
        Some(v) => match serde_json::to_value(v) {
            Ok(serde_json::Value::Object(map)) => Some(map),
            _ => return Err(format!("{} is not a JSON object", f.at("parameters"))),
        },
    };
    let result_type = match f.string("resultType", notes).as_deref() {
        None => None,
        Some("Data") => Some(VaultResultType::Data),
        Some("Auth") => Some(VaultResultType::Auth),
        Some("Raw") => Some(VaultResultType::Raw),
        Some(other) => {
            return Err(format!(
                "{}: {} is not Data, Auth or Raw",
                f.at("resultType"),
                quoted(other)
            ));
        }
    };
    let allow_empty_response = f.flag("allowEmptyResponse", notes).unwrap_or(false);
    f.drop_field(
        "controller",
        notes,
        "Latchkey has no controller classes; not carried over",
    );
    f.drop_field(
        "retrySettings",
        notes,
        "Latchkey retries with its own backoff; not carried over",
    );
    let at = f.at("provider");
    let mut p = f
        .object("provider", notes)
        .ok_or_else(|| format!("{at} is missing"))?;
    // The generator's `path` is the whole API path: the store's note about a missing KV mount
    // `path` does not apply here.
    let mut scratch = Notes::default();
    let provider = super::eso_vault::vault(&mut p, &mut scratch)?;
    p.finish(&mut scratch);
    let mount_note = p.at("path");
    notes
        .list
        .extend(scratch.list.into_iter().filter(|n| n.path != mount_note));
    notes.unknown.extend(scratch.unknown);
    f.finish(notes);
    Ok(VaultDynamicSecretSpec {
        path,
        method,
        parameters,
        result_type,
        allow_empty_response,
        provider,
    })
}

/// A `ClusterGenerator` spec: `kind` and the one `generator.<kind>Spec` block.
fn cluster(f: &mut Fields<'_>, notes: &mut Notes) -> Result<ClusterGeneratorSpec, String> {
    let kind_text = f
        .string("kind", notes)
        .ok_or_else(|| format!("{} is missing", f.at("kind")))?;
    let mut g = f
        .object("generator", notes)
        .ok_or_else(|| format!("{} is missing", f.at("generator")))?;
    let mut generator = GeneratorSpecs::default();
    let kind = match kind_text.as_str() {
        "Password" => {
            let at = g.at("passwordSpec");
            let mut s = g
                .object("passwordSpec", notes)
                .ok_or_else(|| format!("{at} is missing"))?;
            generator.password_spec = Some(password(&mut s, notes)?);
            GeneratorKind::Password
        }
        "VaultDynamicSecret" => {
            let at = g.at("vaultDynamicSecretSpec");
            let mut s = g
                .object("vaultDynamicSecretSpec", notes)
                .ok_or_else(|| format!("{at} is missing"))?;
            generator.vault_dynamic_secret_spec = Some(vault_dynamic(&mut s, notes)?);
            GeneratorKind::VaultDynamicSecret
        }
        other => {
            return Err(format!(
                "{}: a ClusterGenerator of {} has no Latchkey equivalent (Latchkey has \
                 Password, VaultDynamicSecret and PluginGenerator)",
                f.at("kind"),
                quoted(other)
            ));
        }
    };
    g.finish(notes);
    notes.warn(
        "",
        "ESO's ClusterGenerator serves every namespace; the Latchkey one has no conditions, so \
         it does too: add spec.conditions (as a ClusterSecretStore's) to narrow it",
    );
    Ok(ClusterGeneratorSpec {
        kind,
        generator,
        conditions: Vec::new(),
    })
}
