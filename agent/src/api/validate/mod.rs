//! Agent-side validation of objects read from the catalog. The CRD schema carries the same rules
//! (see [`super::rules`]), but a CRD rule is not a security boundary, and a directory of manifests
//! never passes through an API server: every object is re-checked before use.
//!
//! Errors read like the API server's: the field path, then the rule's message (sometimes followed
//! by a detail in parentheses).

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt::Display;
use std::time::Duration;

pub mod cluster_external_secret;
mod fields;
pub mod generator;
mod kubernetes;
pub mod plugin;
mod push_metadata;
pub mod push_secret;

pub use cluster_external_secret::cluster_external_secret;
use fields::{file_mode, max_items, name, not_empty, secret_name, set_names, shaped};
pub use generator::generator;
use plugin::{plugin, secrets_store_csi};
pub use push_secret::push_secret;

use super::StoreKind;
use super::external_secret::{CreationPolicy, DeletionPolicy, ExternalSecretSpec, Files};
use super::external_secret::{GeneratorRef, SourceRef};
use super::provider_kinds::{CLUSTER_PROVIDER_API_VERSION, PROVIDER_API_VERSION, ProviderObject};
use super::rules::{self, CelRule, Pattern};
use super::store::{AwsProvider, ProviderRef, StoreProvider, VaultProvider};

/// Why an object was rejected; the text names the field and never contains values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Invalid {
    /// `path` broke `rule`.
    fn rule(path: impl Display, rule: &CelRule) -> Self {
        Invalid(format!("{path}: {}", rule.message))
    }

    /// `path` broke `rule`; `detail` says how.
    fn rule_detail(path: impl Display, rule: &CelRule, detail: impl Display) -> Self {
        Invalid(format!("{path}: {} ({detail})", rule.message))
    }

    /// `path` broke a structural constraint of the schema (`maxItems`, `maxLength`, ...).
    fn schema(path: impl Display, message: String) -> Self {
        Invalid(format!("{path}: {message}"))
    }

    /// `path` does not match `pattern`.
    fn pattern(path: impl Display, pattern: &Pattern) -> Self {
        Invalid(format!("{path}: {}", pattern.message))
    }

    /// `path` does not match `pattern`; `detail` says how.
    fn pattern_detail(path: impl Display, pattern: &Pattern, detail: impl Display) -> Self {
        Invalid(format!("{path}: {} ({detail})", pattern.message))
    }
}

/// The provider a store selects, borrowed from its spec.
#[derive(Debug, Clone, Copy)]
pub enum ProviderSpec<'a> {
    /// `provider.aws`
    Aws(&'a super::store::AwsProvider),
    /// `provider.vault`
    Vault(&'a super::store::VaultProvider),
    /// `provider.kubernetes`
    Kubernetes(&'a super::store::KubernetesProvider),
    /// `provider.fake`
    Fake(&'a super::store::FakeProvider),
    /// `provider.plugin`
    Plugin(&'a super::store::PluginProvider),
    /// `provider.secretsStoreCSI`
    SecretsStoreCsi(&'a super::store::SecretsStoreCsiProvider),
}

impl ProviderSpec<'_> {
    /// The provider's name as written in the store.
    pub fn name(&self) -> &'static str {
        match self {
            ProviderSpec::Aws(_) => "aws",
            ProviderSpec::Vault(_) => "vault",
            ProviderSpec::Kubernetes(_) => "kubernetes",
            ProviderSpec::Fake(_) => "fake",
            ProviderSpec::Plugin(_) => "plugin",
            ProviderSpec::SecretsStoreCsi(_) => "secretsStoreCSI",
        }
    }
}

/// The provider blocks a store's `spec.provider` sets (exactly one in a valid store).
pub fn provider_blocks(p: &StoreProvider) -> impl Iterator<Item = ProviderSpec<'_>> {
    [
        p.aws.as_ref().map(ProviderSpec::Aws),
        p.vault.as_ref().map(ProviderSpec::Vault),
        p.kubernetes.as_ref().map(ProviderSpec::Kubernetes),
        p.fake.as_ref().map(ProviderSpec::Fake),
        p.plugin.as_ref().map(ProviderSpec::Plugin),
        p.secrets_store_csi
            .as_ref()
            .map(ProviderSpec::SecretsStoreCsi),
    ]
    .into_iter()
    .flatten()
}

/// Checks a store's `spec.provider`: exactly one provider block, the rules of that block (AWS
/// service and auth method, Vault KV version and auth method), and what only a
/// ClusterSecretStore may use. Returns the block.
pub fn provider(p: &StoreProvider, kind: StoreKind) -> Result<ProviderSpec<'_>, Invalid> {
    // `bind` runs this on every publish: a valid store costs no allocation.
    let mut blocks = provider_blocks(p);
    let one = match (blocks.next(), blocks.next()) {
        (Some(one), None) => one,
        (None, _) => {
            return Err(Invalid::rule_detail(
                "spec.provider",
                &rules::ONE_PROVIDER,
                "none is set",
            ));
        }
        (Some(_), Some(_)) => {
            let names = provider_blocks(p).map(|p| p.name()).collect::<Vec<_>>();
            return Err(Invalid::rule_detail(
                "spec.provider",
                &rules::ONE_PROVIDER,
                format_args!("found {}", names.join(", ")),
            ));
        }
    };
    match one {
        ProviderSpec::Aws(a) => aws(a)?,
        ProviderSpec::Vault(v) => vault("spec.provider.vault", v)?,
        ProviderSpec::Plugin(plugin) => {
            self::plugin(plugin)?;
        }
        ProviderSpec::SecretsStoreCsi(p) => {
            secrets_store_csi(p)?;
        }
        ProviderSpec::Kubernetes(k) => kubernetes::kubernetes(k)?,
        ProviderSpec::Fake(_) => {}
    }
    if kind == StoreKind::SecretStore
        && p.aws
            .as_ref()
            .and_then(|a| a.auth.as_ref())
            .is_some_and(|auth| auth.agent_identity.is_some())
    {
        return Err(Invalid::rule("spec", &rules::AGENT_IDENTITY_CLUSTER_ONLY));
    }
    Ok(one)
}

/// Checks that a store sets exactly one of `spec.provider` and `spec.providerRef`, and that a
/// `providerRef` names a provider object the store may use: a SecretStore's in
/// `providers.latchkey.dev` (its own namespace), a ClusterSecretStore's in
/// `cluster.providers.latchkey.dev`. Returns the reference when the store uses one; the inline
/// block is checked by [`provider`].
pub fn provider_or_ref<'a>(
    p: &StoreProvider,
    provider_ref: Option<&'a ProviderRef>,
    kind: StoreKind,
) -> Result<Option<&'a ProviderRef>, Invalid> {
    let r = match (p.is_empty(), provider_ref) {
        (false, None) => return Ok(None),
        (true, Some(r)) => r,
        (true, None) => {
            return Err(Invalid::rule_detail(
                "spec",
                &rules::PROVIDER_OR_REF,
                "none is set",
            ));
        }
        (false, Some(_)) => {
            return Err(Invalid::rule_detail(
                "spec",
                &rules::PROVIDER_OR_REF,
                "both are set",
            ));
        }
    };
    let (want, rule) = match kind {
        StoreKind::SecretStore => (PROVIDER_API_VERSION, &rules::PROVIDER_REF_NAMESPACED),
        StoreKind::ClusterSecretStore => {
            (CLUSTER_PROVIDER_API_VERSION, &rules::PROVIDER_REF_CLUSTER)
        }
    };
    if r.api_version != want {
        return Err(Invalid::rule("spec", rule));
    }
    object_name("spec.providerRef.name", &r.name)?;
    Ok(Some(r))
}

/// Checks a provider object's spec: the rules of the inline block it stands for, reported at
/// the object's own paths (`spec.auth`, not `spec.provider.vault.auth`). A namespaced object
/// is used by SecretStores only (see [`provider_or_ref`]), a cluster-scoped one by
/// ClusterSecretStores only, so what only a ClusterSecretStore may use is refused on a
/// namespaced object.
pub fn provider_object(object: &ProviderObject) -> Result<ProviderSpec<'_>, Invalid> {
    let p = &object.provider;
    // As a ClusterSecretStore's block: the one rule that differs by kind is checked below, in
    // the object's own words.
    let spec = provider(p, StoreKind::ClusterSecretStore).map_err(|Invalid(text)| {
        let block = provider_blocks(p).next().map_or("", |b| b.name());
        match text.strip_prefix(&format!("spec.provider.{block}")) {
            Some(rest) => Invalid(format!("spec{rest}")),
            None => Invalid(text),
        }
    })?;
    if !object.cluster
        && p.aws
            .as_ref()
            .and_then(|a| a.auth.as_ref())
            .is_some_and(|auth| auth.agent_identity.is_some())
    {
        return Err(Invalid::rule(
            "spec",
            &rules::AGENT_IDENTITY_CLUSTER_PROVIDER_ONLY,
        ));
    }
    Ok(spec)
}

/// `spec.provider.aws`: the service, and at most one auth method (none is left to the provider).
fn aws(a: &AwsProvider) -> Result<(), Invalid> {
    if a.service != "SecretsManager" && a.service != "ParameterStore" {
        return Err(Invalid::rule(
            "spec.provider.aws.service",
            &rules::AWS_SERVICE,
        ));
    }
    if let Some(auth) = &a.auth {
        let methods = set_names(&[
            ("secretRef", auth.secret_ref.is_some()),
            ("jwt", auth.jwt.is_some()),
            ("agentIdentity", auth.agent_identity.is_some()),
        ]);
        if methods.len() > 1 {
            return Err(Invalid::rule_detail(
                "spec.provider.aws.auth",
                &rules::AWS_AUTH_AT_MOST_ONE,
                format_args!("found {}", methods.join(", ")),
            ));
        }
        if let Some(keys) = &auth.secret_ref {
            const AT: &str = "spec.provider.aws.auth.secretRef";
            secret_name(
                format_args!("{AT}.accessKeyIDSecretRef"),
                &keys.access_key_id_secret_ref,
            )?;
            secret_name(
                format_args!("{AT}.secretAccessKeySecretRef"),
                &keys.secret_access_key_secret_ref,
            )?;
            if let Some(token) = &keys.session_token_secret_ref {
                secret_name(format_args!("{AT}.sessionTokenSecretRef"), token)?;
            }
        }
    }
    Ok(())
}

/// `spec.provider.vault` (or the `provider` block of a VaultDynamicSecret, at `at`): the KV
/// version and exactly one auth method.
pub(super) fn vault(at: impl Display + Copy, v: &VaultProvider) -> Result<(), Invalid> {
    if let Some(version) = &v.version
        && version != "v1"
        && version != "v2"
    {
        return Err(Invalid::rule(
            format_args!("{at}.version"),
            &rules::VAULT_VERSION,
        ));
    }
    if let Some(ca) = &v.ca_provider {
        ca_provider(format_args!("{at}.caProvider"), ca)?;
    }
    let auth = &v.auth;
    let methods = set_names(&[
        ("tokenSecretRef", auth.token_secret_ref.is_some()),
        ("kubernetes", auth.kubernetes.is_some()),
        ("jwt", auth.jwt.is_some()),
        ("appRole", auth.app_role.is_some()),
        ("userPass", auth.user_pass.is_some()),
        ("cert", auth.cert.is_some()),
        ("iam", auth.iam.is_some()),
    ]);
    if methods.len() != 1 {
        let detail = if methods.is_empty() {
            "none is set".to_string()
        } else {
            format!("found {}", methods.join(", "))
        };
        return Err(Invalid::rule_detail(
            format_args!("{at}.auth"),
            &rules::VAULT_AUTH_ONE,
            detail,
        ));
    }
    if let Some(token) = &auth.token_secret_ref {
        secret_name(format_args!("{at}.auth.tokenSecretRef"), token)?;
    }
    if let Some(app_role) = &auth.app_role {
        secret_name(
            format_args!("{at}.auth.appRole.secretRef"),
            &app_role.secret_ref,
        )?;
    }
    vault_secret_auth(at, auth)
}

/// A `caProvider` at `path`: a valid object name and a key.
pub(super) fn ca_provider(
    path: impl Display + Copy,
    ca: &super::store::CaProvider,
) -> Result<(), Invalid> {
    name(format_args!("{path}.name"), &ca.name)?;
    not_empty(format_args!("{path}.key"), &ca.key)
}

/// `userPass` and `cert`: credential Secret names, and a username fit for the login path.
fn vault_secret_auth(
    at: impl Display + Copy,
    auth: &super::store::VaultAuth,
) -> Result<(), Invalid> {
    if let Some(user_pass) = &auth.user_pass {
        let path = format_args!("{at}.auth.userPass.username");
        not_empty(path, &user_pass.username)?;
        if user_pass.username.chars().count() > rules::MAX_VAULT_USERNAME_LEN {
            return Err(Invalid::schema(
                path,
                rules::too_long(rules::MAX_VAULT_USERNAME_LEN),
            ));
        }
        // The username is a segment of the login path: `/`, `?`, `#` or a dot segment would
        // send the password elsewhere.
        let username = user_pass.username.as_str();
        if username == "."
            || username == ".."
            || username
                .chars()
                .any(|c| matches!(c, '/' | '?' | '#' | '%') || c.is_control())
        {
            return Err(Invalid(format!(
                "{path}: must not be '.' or '..' nor contain '/', '?', '#', '%' or control \
                 characters"
            )));
        }
        secret_name(
            format_args!("{at}.auth.userPass.secretRef"),
            &user_pass.secret_ref,
        )?;
    }
    if let Some(cert) = &auth.cert {
        secret_name(format_args!("{at}.auth.cert.clientCert"), &cert.client_cert)?;
        secret_name(format_args!("{at}.auth.cert.secretRef"), &cert.secret_ref)?;
    }
    Ok(())
}

/// Checks that `name` is a valid Kubernetes object name (an RFC 1123 subdomain). Names reach API
/// request paths, so `..`, `/` and the like must never get through.
pub fn object_name(path: impl Display, name: &str) -> Result<(), Invalid> {
    if crate::identity::is_dns_subdomain(name) {
        return Ok(());
    }
    Err(Invalid(format!(
        "{path}: {:?} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', \
         each part starting and ending with a letter or digit, at most 253 characters)",
        crate::telemetry::escape::printable(name, 80)
    )))
}

/// The generator a `sourceRef` names, if any.
pub fn generator_of(source: Option<&SourceRef>) -> Option<&GeneratorRef> {
    source.and_then(|s| s.generator_ref.as_ref())
}

/// Checks a `generatorRef`: a known kind of Latchkey's generator group and a valid name.
fn generator_ref(path: impl Display, g: &GeneratorRef) -> Result<(), Invalid> {
    if g.api_version != crate::api::GENERATOR_API_VERSION {
        return Err(Invalid(format!(
            "{path}.apiVersion: must be {} (got {:?})",
            crate::api::GENERATOR_API_VERSION,
            crate::telemetry::escape::printable(&g.api_version, 80)
        )));
    }
    if !rules::GENERATOR_KIND.is_match(&g.kind) {
        return Err(Invalid::pattern_detail(
            format_args!("{path}.kind"),
            &rules::GENERATOR_KIND,
            format_args!("got {:?}", crate::telemetry::escape::printable(&g.kind, 80)),
        ));
    }
    name(format_args!("{path}.name"), &g.name)
}

/// Checks an ExternalSecret spec for the rules the CRD schema also enforces.
pub fn external_secret(spec: &ExternalSecretSpec) -> Result<(), Invalid> {
    match &spec.secret_store_ref {
        Some(store) => {
            not_empty("spec.secretStoreRef.name", &store.name)?;
            name("spec.secretStoreRef.name", &store.name)?;
        }
        // Agent-only: the CRD cannot say it without a rule iterating both lists.
        None if spec
            .data
            .iter()
            .all(|d| generator_of(d.source_ref.as_ref()).is_some())
            && spec
                .data_from
                .iter()
                .all(|d| generator_of(d.source_ref.as_ref()).is_some()) => {}
        None => {
            return Err(Invalid(
                "spec.secretStoreRef: must be set unless every entry names a generator \
                 (sourceRef.generatorRef)"
                    .into(),
            ));
        }
    }
    if spec.data.is_empty() && spec.data_from.is_empty() {
        return Err(Invalid::rule("spec", &rules::DATA_OR_DATA_FROM));
    }
    if let Some(interval) = &spec.refresh_interval {
        refresh_interval(interval)?;
    }
    if let Some(account) = &spec.service_account_name {
        name("spec.serviceAccountName", account)?;
    }
    max_items("spec.data", spec.data.len(), rules::MAX_ITEMS)?;
    max_items("spec.dataFrom", spec.data_from.len(), rules::MAX_DATA_FROM)?;
    // Runs on every publish: field paths are only formatted for an error, and the keys seen are
    // ordered rather than hashed (a few keys; no hasher to seed).
    let mut seen = BTreeMap::new();
    for (i, d) in spec.data.iter().enumerate() {
        not_empty(format_args!("spec.data[{i}].secretKey"), &d.secret_key)?;
        shaped(
            format_args!("spec.data[{i}].secretKey"),
            &d.secret_key,
            rules::MAX_SECRET_KEY_LEN,
            &rules::FILE_PATH,
        )?;
        match seen.entry(d.secret_key.as_str()) {
            Entry::Occupied(first) => {
                return Err(Invalid::schema(
                    format_args!("spec.data[{i}]"),
                    rules::duplicate_key("secretKey", *first.get()),
                ));
            }
            Entry::Vacant(slot) => {
                slot.insert(i);
            }
        }
        not_empty(
            format_args!("spec.data[{i}].remoteRef.key"),
            &d.remote_ref.key,
        )?;
        if let Some(g) = generator_of(d.source_ref.as_ref()) {
            generator_ref(format_args!("spec.data[{i}].sourceRef.generatorRef"), g)?;
        }
    }
    for (i, d) in spec.data_from.iter().enumerate() {
        let generator = generator_of(d.source_ref.as_ref());
        if usize::from(d.extract.is_some())
            + usize::from(d.find.is_some())
            + usize::from(generator.is_some())
            != 1
        {
            return Err(Invalid::rule(
                format_args!("spec.dataFrom[{i}]"),
                &rules::EXTRACT_XOR_FIND,
            ));
        }
        if let Some(e) = &d.extract {
            not_empty(format_args!("spec.dataFrom[{i}].extract.key"), &e.key)?;
        }
        if let Some(g) = generator {
            generator_ref(format_args!("spec.dataFrom[{i}].sourceRef.generatorRef"), g)?;
        }
        max_items(
            format_args!("spec.dataFrom[{i}].rewrite"),
            d.rewrite.len(),
            rules::MAX_REWRITES,
        )?;
        if let Some(f) = &d.find {
            if f.name.is_none() && f.path.is_none() && f.tags.is_empty() {
                return Err(Invalid::rule(
                    format_args!("spec.dataFrom[{i}].find"),
                    &rules::FIND_NAME_OR_PATH,
                ));
            }
            if f.tags.len() > rules::MAX_FIND_TAGS {
                return Err(Invalid::schema(
                    format_args!("spec.dataFrom[{i}].find.tags"),
                    rules::too_many_properties(rules::MAX_FIND_TAGS),
                ));
            }
        }
    }
    if let Some(t) = &spec.target {
        if t.deletion_policy == Some(DeletionPolicy::Delete)
            && t.creation_policy != Some(CreationPolicy::Owner)
        {
            return Err(Invalid::rule("spec.target", &rules::DELETE_NEEDS_OWNER));
        }
        if t.deletion_policy == Some(DeletionPolicy::Merge)
            && matches!(t.creation_policy, None | Some(CreationPolicy::None))
        {
            return Err(Invalid::rule("spec.target", &rules::MERGE_NEEDS_MIRROR));
        }
        if let Some(secret) = &t.name {
            name("spec.target.name", secret)?;
        }
        if let Some(f) = &t.files {
            files(f)?;
        }
        if let Some(template) = &t.template
            && template.data.len() > rules::MAX_TEMPLATE_KEYS
        {
            return Err(Invalid::schema(
                "spec.target.template.data",
                rules::too_many_properties(rules::MAX_TEMPLATE_KEYS),
            ));
        }
    }
    Ok(())
}

/// `spec.refreshInterval`: a duration that Go and the agent's parser read alike, at most a year.
pub(super) fn refresh_interval(text: &str) -> Result<(), Invalid> {
    const PATH: &str = "spec.refreshInterval";
    shaped(PATH, text, rules::MAX_DURATION_LEN, &rules::DURATION)?;
    // Every form the pattern admits is one Go reads, so a text that still does not parse is
    // beyond what Go can count (the API server's `duration()` fails on it too): too long.
    match super::duration::parse(text) {
        Some(interval) if interval <= Duration::from_secs(rules::MAX_REFRESH_INTERVAL_SECS) => {
            Ok(())
        }
        _ => Err(Invalid::rule(PATH, &rules::REFRESH_INTERVAL_MAX)),
    }
}

/// `spec.target.files`: modes within 0..=0777, relative paths, and a bounded item list.
fn files(f: &Files) -> Result<(), Invalid> {
    file_mode("spec.target.files.defaultMode", f.default_mode)?;
    max_items("spec.target.files.items", f.items.len(), rules::MAX_ITEMS)?;
    for (i, item) in f.items.iter().enumerate() {
        shaped(
            format_args!("spec.target.files.items[{i}].path"),
            &item.path,
            rules::MAX_FILE_PATH_LEN,
            &rules::FILE_PATH,
        )?;
        file_mode(format_args!("spec.target.files.items[{i}].mode"), item.mode)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
