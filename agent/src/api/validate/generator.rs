//! The generator kinds (`generators.latchkey.dev`): the rules their CRDs carry, re-checked on
//! every object the agent or the controller reads. A ClusterGenerator's wrapped spec is checked
//! with the same rules, at its own path (`spec.generator.passwordSpec.length`, ...).

use super::fields::{not_empty, set_names};
use super::plugin::plugin_at;
use super::{Invalid, vault};
use crate::api::StoreKind;
use crate::api::generator::{
    ClusterGeneratorSpec, GeneratorKind, GeneratorObject, PasswordSpec, PluginGeneratorSpec,
    VaultDynamicSecretSpec,
};
use crate::api::rules;

/// Checks a generator object for the rules its CRD also enforces. Returns the store kind its
/// credentials count as (`BuildContext::store_kind`): a namespaced generator's live in the
/// pod's namespace, as a SecretStore's; a ClusterGenerator's in the agent's namespace, as a
/// ClusterSecretStore's. It follows from the object, so a caller cannot pick a wider one.
pub fn generator(g: &GeneratorObject) -> Result<StoreKind, Invalid> {
    match g {
        GeneratorObject::Password(p) => password("spec", &p.spec)?,
        GeneratorObject::VaultDynamicSecret(v) => vault_dynamic_secret("spec", &v.spec)?,
        GeneratorObject::Plugin(p) => plugin_generator("spec", &p.spec)?,
        GeneratorObject::Cluster(c) => {
            cluster_generator(&c.spec)?;
            return Ok(StoreKind::ClusterSecretStore);
        }
    }
    Ok(StoreKind::SecretStore)
}

/// A Password's spec at `at`: the ranges of the counts, the symbols to pick from, and that
/// the digits and symbols fit in the length.
pub fn password(at: &str, p: &PasswordSpec) -> Result<(), Invalid> {
    let max = u64::from(rules::MAX_PASSWORD_LENGTH);
    if p.length < 1 {
        return Err(Invalid::schema(
            format_args!("{at}.length"),
            rules::too_small(1),
        ));
    }
    for (field, value) in [
        ("length", Some(p.length)),
        ("digits", p.digits),
        ("symbols", p.symbols),
    ] {
        if value.is_some_and(|v| u64::from(v) > max) {
            return Err(Invalid::schema(
                format_args!("{at}.{field}"),
                rules::too_large(max),
            ));
        }
    }
    if let Some(symbols) = &p.symbol_characters {
        not_empty(format_args!("{at}.symbolCharacters"), symbols)?;
        if symbols.chars().count() > rules::MAX_SYMBOL_CHARACTERS {
            return Err(Invalid::schema(
                format_args!("{at}.symbolCharacters"),
                rules::too_long(rules::MAX_SYMBOL_CHARACTERS),
            ));
        }
    }
    // Each count is at most MAX_PASSWORD_LENGTH (checked above): the sum cannot overflow.
    let asked = p.digits.unwrap_or(0) + p.symbols.unwrap_or(0);
    if asked > p.length {
        return Err(Invalid::rule(at, &rules::PASSWORD_FITS));
    }
    Ok(())
}

/// A VaultDynamicSecret's spec at `at`: the path, the method, bounded parameters, and the
/// `provider` block with a store's `vault` rules.
pub fn vault_dynamic_secret(at: &str, v: &VaultDynamicSecretSpec) -> Result<(), Invalid> {
    not_empty(format_args!("{at}.path"), &v.path)?;
    if v.path.chars().count() > rules::MAX_VAULT_PATH_LEN {
        return Err(Invalid::schema(
            format_args!("{at}.path"),
            rules::too_long(rules::MAX_VAULT_PATH_LEN),
        ));
    }
    if let Some(method) = &v.method
        && !rules::VAULT_METHOD.is_match(method)
    {
        return Err(Invalid::pattern(
            format_args!("{at}.method"),
            &rules::VAULT_METHOD,
        ));
    }
    if let Some(parameters) = &v.parameters {
        if parameters.len() > rules::MAX_VAULT_PARAMETERS {
            return Err(Invalid::schema(
                format_args!("{at}.parameters"),
                rules::too_many_properties(rules::MAX_VAULT_PARAMETERS),
            ));
        }
        if encoded_len(parameters) > rules::MAX_VAULT_PARAMETERS_BYTES {
            return Err(Invalid(format!(
                "{at}.parameters: must be at most {} KiB as JSON",
                rules::MAX_VAULT_PARAMETERS_BYTES >> 10
            )));
        }
    }
    vault(format_args!("{at}.provider"), &v.provider)
}

/// The length of `parameters` as compact JSON, counted without building the text. Counting
/// stops being exact only past `usize::MAX`, far beyond any limit.
fn encoded_len(parameters: &serde_json::Map<String, serde_json::Value>) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing JSON values into a sink that never fails cannot fail: a map of JSON values always
    // serializes. Count it as too big if it ever did, so the check fails closed.
    match serde_json::to_writer(&mut counter, parameters) {
        Ok(()) => counter.0,
        Err(_) => usize::MAX,
    }
}

/// A PluginGenerator's spec at `at`: its `provider` block, with a store's `plugin` rules.
pub fn plugin_generator(at: &str, p: &PluginGeneratorSpec) -> Result<(), Invalid> {
    plugin_at(format_args!("{at}.provider"), &p.provider).map(|_| ())
}

/// A ClusterGenerator's spec: `generator` holds exactly the block `kind` names, and that block
/// passes its kind's rules.
pub fn cluster_generator(c: &ClusterGeneratorSpec) -> Result<(), Invalid> {
    let g = &c.generator;
    let blocks = set_names(&[
        ("passwordSpec", g.password_spec.is_some()),
        (
            "vaultDynamicSecretSpec",
            g.vault_dynamic_secret_spec.is_some(),
        ),
        ("pluginGeneratorSpec", g.plugin_generator_spec.is_some()),
    ]);
    let mismatch = |detail: String| {
        Invalid::rule_detail(
            "spec",
            &rules::CLUSTER_GENERATOR_KIND_MATCHES,
            format_args!("kind {}, {detail}", c.kind),
        )
    };
    if blocks.len() != 1 {
        return Err(mismatch(if blocks.is_empty() {
            "none is set".into()
        } else {
            format!("found {}", blocks.join(", "))
        }));
    }
    match (
        c.kind,
        &g.password_spec,
        &g.vault_dynamic_secret_spec,
        &g.plugin_generator_spec,
    ) {
        (GeneratorKind::Password, Some(p), _, _) => password("spec.generator.passwordSpec", p),
        (GeneratorKind::VaultDynamicSecret, _, Some(v), _) => {
            vault_dynamic_secret("spec.generator.vaultDynamicSecretSpec", v)
        }
        (GeneratorKind::PluginGenerator, _, _, Some(p)) => {
            plugin_generator("spec.generator.pluginGeneratorSpec", p)
        }
        _ => Err(mismatch(format!("found {}", blocks.join(", ")))),
    }
}
