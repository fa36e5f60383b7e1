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

use super::StoreKind;
use super::external_secret::{CreationPolicy, DeletionPolicy, ExternalSecretSpec, Files};
use super::rules::{self, CelRule, Pattern};
use super::store::{
    AwsProvider, PluginProvider, SecretKeySelector, SecretsStoreCsiProvider, StoreProvider,
    VaultProvider,
};

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
        ProviderSpec::Vault(v) => vault(v)?,
        ProviderSpec::Plugin(plugin) => {
            self::plugin(plugin)?;
        }
        ProviderSpec::SecretsStoreCsi(p) => {
            secrets_store_csi(p)?;
        }
        ProviderSpec::Kubernetes(_) | ProviderSpec::Fake(_) => {}
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

/// `spec.provider.aws`: the service, and at most one auth method (none is left to the provider).
fn aws(a: &AwsProvider) -> Result<(), Invalid> {
    if a.service != "SecretsManager" {
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

/// `spec.provider.vault`: the KV version and exactly one auth method.
fn vault(v: &VaultProvider) -> Result<(), Invalid> {
    if let Some(version) = &v.version
        && version != "v1"
        && version != "v2"
    {
        return Err(Invalid::rule(
            "spec.provider.vault.version",
            &rules::VAULT_VERSION,
        ));
    }
    let auth = &v.auth;
    let methods = set_names(&[
        ("tokenSecretRef", auth.token_secret_ref.is_some()),
        ("kubernetes", auth.kubernetes.is_some()),
        ("jwt", auth.jwt.is_some()),
        ("appRole", auth.app_role.is_some()),
    ]);
    if methods.len() != 1 {
        let detail = if methods.is_empty() {
            "none is set".to_string()
        } else {
            format!("found {}", methods.join(", "))
        };
        return Err(Invalid::rule_detail(
            "spec.provider.vault.auth",
            &rules::VAULT_AUTH_ONE,
            detail,
        ));
    }
    if let Some(token) = &auth.token_secret_ref {
        secret_name("spec.provider.vault.auth.tokenSecretRef", token)?;
    }
    if let Some(app_role) = &auth.app_role {
        secret_name(
            "spec.provider.vault.auth.appRole.secretRef",
            &app_role.secret_ref,
        )?;
    }
    Ok(())
}

/// Default of `spec.provider.plugin.timeout`.
pub const PLUGIN_DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `spec.provider.plugin.timeout`: a publish waits for it, and kubelet's own call times
/// out after about two minutes.
pub const PLUGIN_MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a plugin listens, parsed from `spec.provider.plugin.endpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginEndpoint<'a> {
    /// `unix://<dir>/<name>`: a socket `name` in directory `dir` (absolute, no `.`/`..`).
    Unix {
        /// The directory as written, without a trailing `/` (`/` for the root).
        dir: &'a str,
        /// The socket's file name (`[A-Za-z0-9_.-]{1,64}.sock`).
        name: &'a str,
    },
    /// `host:port`, plaintext gRPC over TCP.
    Tcp {
        /// DNS name, IPv4 address or bracketed IPv6 address.
        host: &'a str,
        /// TCP port (1-65535).
        port: u16,
    },
}

/// `spec.provider.plugin`: the endpoint's shape, the timeout, the config reference, the
/// audiences and `tls` (TCP only). Whether a unix socket is in the directory the agent allows
/// is the provider's check (it knows the flag), as is whether `tls.caBundle` holds certificates.
/// Returns the call timeout.
pub fn plugin(p: &PluginProvider) -> Result<Duration, Invalid> {
    const AT: &str = "spec.provider.plugin";
    let endpoint = plugin_endpoint(&p.endpoint)?;
    let timeout = call_timeout("spec.provider.plugin.timeout", p.timeout.as_deref())?;
    audiences(format_args!("{AT}.audiences"), &p.audiences)?;
    if let Some(tls) = &p.tls {
        if matches!(endpoint, PluginEndpoint::Unix { .. }) {
            return Err(Invalid::rule(AT, &rules::PLUGIN_TLS_TCP_ONLY));
        }
        not_empty(format_args!("{AT}.tls.caBundle"), tls.ca_bundle.trim())?;
        if tls.ca_bundle.len() > rules::MAX_CA_BUNDLE_LEN {
            return Err(Invalid::schema(
                format_args!("{AT}.tls.caBundle"),
                format!("must be at most {} KiB", rules::MAX_CA_BUNDLE_LEN >> 10),
            ));
        }
        if let Some(secret) = &tls.client_cert_secret_ref {
            name(
                format_args!("{AT}.tls.clientCertSecretRef.name"),
                &secret.name,
            )?;
        }
    }
    if let Some(c) = &p.config_ref {
        const PATH: &str = "spec.provider.plugin.configRef";
        not_empty(format_args!("{PATH}.name"), &c.name)?;
        for (field, value) in [
            ("apiVersion", &c.api_version),
            ("kind", &c.kind),
            ("name", &c.name),
        ] {
            if value.chars().count() > rules::MAX_NAME_LEN || value.chars().any(char::is_control) {
                return Err(Invalid(format!(
                    "{PATH}.{field}: must be at most {} characters, without control characters",
                    rules::MAX_NAME_LEN
                )));
            }
        }
    }
    Ok(timeout)
}

/// A call timeout at `path`: [`PLUGIN_DEFAULT_TIMEOUT`] when absent, else more than 0 and at
/// most [`PLUGIN_MAX_TIMEOUT`].
fn call_timeout(path: &str, text: Option<&str>) -> Result<Duration, Invalid> {
    let Some(text) = text else {
        return Ok(PLUGIN_DEFAULT_TIMEOUT);
    };
    shaped(path, text, rules::MAX_DURATION_LEN, &rules::DURATION)?;
    match super::duration::parse(text) {
        Some(t) if !t.is_zero() && t <= PLUGIN_MAX_TIMEOUT => Ok(t),
        _ => Err(Invalid(format!(
            "{path}: must be more than 0 and at most {}",
            humantime::format_duration(PLUGIN_MAX_TIMEOUT)
        ))),
    }
}

/// Most bytes of `spec.provider.secretsStoreCSI.parameters` (keys and values): they travel in
/// every Mount call; a SecretProviderClass's are a few KiB.
pub const MAX_SECRETS_STORE_PARAMETERS_BYTES: usize = 64 << 10;

/// `spec.provider.secretsStoreCSI`: the provider name (it names a socket: no `/`, no `.`), the
/// parameters' size, the audiences and the timeout. Returns the call timeout.
pub fn secrets_store_csi(p: &SecretsStoreCsiProvider) -> Result<Duration, Invalid> {
    const AT: &str = "spec.provider.secretsStoreCSI";
    if !rules::SECRETS_STORE_PROVIDER.is_match(&p.provider) {
        return Err(Invalid::pattern(
            format_args!("{AT}.provider"),
            &rules::SECRETS_STORE_PROVIDER,
        ));
    }
    let bytes: usize = p.parameters.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_SECRETS_STORE_PARAMETERS_BYTES {
        return Err(Invalid(format!(
            "{AT}.parameters: must be at most {} KiB in all",
            MAX_SECRETS_STORE_PARAMETERS_BYTES >> 10
        )));
    }
    if p.parameters
        .keys()
        .any(|k| k.starts_with(crate::identity::POD_INFO_PREFIX))
    {
        // The pod attributes are the agent's to set: a store must not forge another pod's.
        return Err(Invalid(format!(
            "{AT}.parameters: keys starting with {} are set by the agent (the pod's attributes \
             and tokens)",
            crate::identity::POD_INFO_PREFIX
        )));
    }
    if p.audiences.len() > rules::MAX_AUDIENCES {
        return Err(Invalid::schema(
            format_args!("{AT}.audiences"),
            rules::too_many_items(rules::MAX_AUDIENCES),
        ));
    }
    for (i, audience) in p.audiences.iter().enumerate() {
        if audience.chars().count() > rules::MAX_NAME_LEN || audience.chars().any(char::is_control)
        {
            return Err(Invalid(format!(
                "{AT}.audiences[{i}]: must be at most {} characters, without control characters",
                rules::MAX_NAME_LEN
            )));
        }
    }
    call_timeout(&format!("{AT}.timeout"), p.timeout.as_deref())
}

/// A list of token audiences at `path`: at most [`rules::MAX_AUDIENCES`], each bounded and
/// without control characters.
fn audiences(path: impl Display, list: &[String]) -> Result<(), Invalid> {
    if list.len() > rules::MAX_AUDIENCES {
        return Err(Invalid::schema(
            path,
            rules::too_many_items(rules::MAX_AUDIENCES),
        ));
    }
    for (i, audience) in list.iter().enumerate() {
        if audience.chars().count() > rules::MAX_NAME_LEN || audience.chars().any(char::is_control)
        {
            return Err(Invalid(format!(
                "{path}[{i}]: must be at most {} characters, without control characters",
                rules::MAX_NAME_LEN
            )));
        }
    }
    Ok(())
}

/// Parses a plugin endpoint: `unix:///abs/dir/name.sock` or `host:port`. Refuses relative
/// socket paths, `.`/`..` and empty segments, socket names outside `[A-Za-z0-9_.-]{1,64}.sock`,
/// URL schemes other than `unix://`, and ports outside 1-65535.
pub fn plugin_endpoint(text: &str) -> Result<PluginEndpoint<'_>, Invalid> {
    const PATH: &str = "spec.provider.plugin.endpoint";
    let bad = |why: &str| {
        Invalid(format!(
            "{PATH}: {:?} {why}",
            crate::telemetry::escape::printable(text, 80)
        ))
    };
    if text.chars().count() > rules::MAX_PLUGIN_ENDPOINT_LEN {
        return Err(Invalid::schema(
            PATH,
            rules::too_long(rules::MAX_PLUGIN_ENDPOINT_LEN),
        ));
    }
    if let Some(path) = text.strip_prefix("unix://") {
        let Some(rest) = path.strip_prefix('/') else {
            return Err(bad("must be unix:// followed by an absolute socket path"));
        };
        let (dir, name) = match rest.rsplit_once('/') {
            Some((dir, name)) => (&path[..dir.len() + 1], name),
            None => ("/", rest),
        };
        if dir != "/"
            && dir[1..]
                .split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return Err(bad("must not contain empty, '.' or '..' path segments"));
        }
        let stem = name.strip_suffix(".sock").unwrap_or_default();
        let stem_ok = (1..=64).contains(&stem.len())
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !stem_ok || name.starts_with('.') {
            return Err(bad(
                "must name a socket file of 1 to 64 letters, digits, '_', '.' or '-' (not \
                 starting with '.') followed by .sock",
            ));
        }
        return Ok(PluginEndpoint::Unix { dir, name });
    }
    if text.contains("://") {
        return Err(bad("must be unix:///<path> or host:port (no other scheme)"));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(bad("must be unix:///<path> or host:port"));
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(bad("has no valid port (1-65535)")),
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
    };
    if !host_ok {
        return Err(bad(
            "has no valid host (a DNS name, an IPv4 address or a bracketed IPv6 address)",
        ));
    }
    Ok(PluginEndpoint::Tcp { host, port })
}

/// The `name` of the credential Secret `selector` (at `path`) points at.
fn secret_name(path: impl Display, selector: &SecretKeySelector) -> Result<(), Invalid> {
    name(format_args!("{path}.name"), &selector.name)
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

/// The names of the options that are set.
fn set_names<'a>(options: &[(&'a str, bool)]) -> Vec<&'a str> {
    options
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect()
}

/// Checks an ExternalSecret spec for the rules the CRD schema also enforces.
pub fn external_secret(spec: &ExternalSecretSpec) -> Result<(), Invalid> {
    not_empty("spec.secretStoreRef.name", &spec.secret_store_ref.name)?;
    name("spec.secretStoreRef.name", &spec.secret_store_ref.name)?;
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
    }
    for (i, d) in spec.data_from.iter().enumerate() {
        if d.extract.is_some() == d.find.is_some() {
            return Err(Invalid::rule(
                format_args!("spec.dataFrom[{i}]"),
                &rules::EXTRACT_XOR_FIND,
            ));
        }
        if let Some(e) = &d.extract {
            not_empty(format_args!("spec.dataFrom[{i}].extract.key"), &e.key)?;
        }
        max_items(
            format_args!("spec.dataFrom[{i}].rewrite"),
            d.rewrite.len(),
            rules::MAX_REWRITES,
        )?;
        if let Some(f) = &d.find
            && f.name.is_none()
            && f.path.is_none()
        {
            return Err(Invalid::rule(
                format_args!("spec.dataFrom[{i}].find"),
                &rules::FIND_NAME_OR_PATH,
            ));
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
fn refresh_interval(text: &str) -> Result<(), Invalid> {
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

/// A string whose schema has a `maxLength` (counted in characters, as the API server does) and a
/// `pattern`.
fn shaped(path: impl Display, s: &str, max_len: usize, pattern: &Pattern) -> Result<(), Invalid> {
    if s.chars().count() > max_len {
        return Err(Invalid::schema(path, rules::too_long(max_len)));
    }
    if !pattern.is_match(s) {
        return Err(Invalid::pattern(path, pattern));
    }
    Ok(())
}

/// The name of a store, Secret or service account.
fn name(path: impl Display, s: &str) -> Result<(), Invalid> {
    shaped(path, s, rules::MAX_NAME_LEN, &rules::DNS_SUBDOMAIN)
}

fn file_mode(path: impl Display, mode: Option<i32>) -> Result<(), Invalid> {
    match mode {
        Some(m) if !(0..=0o777).contains(&m) => Err(Invalid::rule(path, &rules::FILE_MODE)),
        _ => Ok(()),
    }
}

fn not_empty(path: impl Display, s: &str) -> Result<(), Invalid> {
    if s.is_empty() {
        return Err(Invalid::rule(path, &rules::NOT_EMPTY));
    }
    Ok(())
}

fn max_items(path: impl Display, len: usize, max: usize) -> Result<(), Invalid> {
    if len > max {
        return Err(Invalid::schema(path, rules::too_many_items(max)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::external_secret::*;
    use crate::api::store::*;

    fn es() -> ExternalSecretSpec {
        ExternalSecretSpec {
            secret_store_ref: SecretStoreRef {
                name: "s".into(),
                kind: StoreKind::SecretStore,
            },
            refresh_interval: None,
            data: vec![ExternalSecretData {
                secret_key: "k".into(),
                remote_ref: RemoteRef {
                    key: "r".into(),
                    ..Default::default()
                },
            }],
            data_from: vec![],
            target: None,
            service_account_name: None,
            refresh_policy: None,
        }
    }

    #[test]
    fn accepts_a_plain_spec() {
        assert_eq!(external_secret(&es()), Ok(()));
    }

    #[test]
    fn rejects_each_broken_rule() {
        let mut s = es();
        s.data.clear();
        assert!(external_secret(&s).unwrap_err().0.contains("at least one"));

        let mut s = es();
        s.data[0].secret_key.clear();
        assert!(
            external_secret(&s)
                .unwrap_err()
                .0
                .contains("data[0].secretKey")
        );

        let mut s = es();
        s.data_from.push(DataFrom {
            extract: Some(RemoteRef {
                key: "a".into(),
                ..Default::default()
            }),
            find: Some(FindRef::default()),
            rewrite: vec![],
        });
        assert!(
            external_secret(&s)
                .unwrap_err()
                .0
                .contains("exactly one of extract, find")
        );

        let mut s = es();
        s.target = Some(Target {
            deletion_policy: Some(DeletionPolicy::Delete),
            ..Default::default()
        });
        assert!(
            external_secret(&s)
                .unwrap_err()
                .0
                .contains("requires creationPolicy Owner")
        );
    }

    #[test]
    fn paths_durations_and_names_are_checked_before_use() {
        let mut s = es();
        s.data[0].secret_key = "../x".into();
        assert_eq!(
            external_secret(&s).unwrap_err().0,
            format!("spec.data[0].secretKey: {}", rules::FILE_PATH.message)
        );

        let mut s = es();
        s.refresh_interval = Some("banana".into());
        assert_eq!(
            external_secret(&s).unwrap_err().0,
            format!("spec.refreshInterval: {}", rules::DURATION.message)
        );
        s.refresh_interval = Some("1h30m".into());
        assert_eq!(external_secret(&s), Ok(()));

        let mut s = es();
        s.target = Some(Target {
            name: Some("Db_Creds".into()),
            ..Default::default()
        });
        assert_eq!(
            external_secret(&s).unwrap_err().0,
            format!("spec.target.name: {}", rules::DNS_SUBDOMAIN.message)
        );
    }

    #[test]
    fn provider_must_be_exactly_one() {
        assert!(
            provider(&StoreProvider::default(), StoreKind::SecretStore)
                .unwrap_err()
                .0
                .contains("none is set")
        );
        let both = StoreProvider {
            fake: Some(FakeProvider::default()),
            kubernetes: Some(KubernetesProvider::default()),
            ..Default::default()
        };
        assert!(
            provider(&both, StoreKind::SecretStore)
                .unwrap_err()
                .0
                .contains("kubernetes, fake")
        );
        let one = StoreProvider {
            fake: Some(FakeProvider::default()),
            ..Default::default()
        };
        assert_eq!(
            provider(&one, StoreKind::SecretStore).unwrap().name(),
            "fake"
        );
    }

    #[test]
    fn auth_errors_name_the_methods_found() {
        let vault = |auth: VaultAuth| StoreProvider {
            vault: Some(VaultProvider {
                server: "https://vault:8200".into(),
                auth,
                ..Default::default()
            }),
            ..Default::default()
        };
        let role = || {
            Some(VaultRoleAuth {
                role: "app".into(),
                ..Default::default()
            })
        };
        assert_eq!(
            provider(&vault(VaultAuth::default()), StoreKind::SecretStore)
                .unwrap_err()
                .0,
            "spec.provider.vault.auth: must set exactly one of tokenSecretRef, kubernetes, jwt, \
             appRole (none is set)"
        );
        let two = VaultAuth {
            kubernetes: role(),
            jwt: role(),
            ..Default::default()
        };
        assert!(
            provider(&vault(two), StoreKind::SecretStore)
                .unwrap_err()
                .0
                .ends_with("(found kubernetes, jwt)")
        );
        let one = VaultAuth {
            jwt: role(),
            ..Default::default()
        };
        assert_eq!(
            provider(&vault(one), StoreKind::SecretStore)
                .unwrap()
                .name(),
            "vault"
        );

        let aws = StoreProvider {
            aws: Some(AwsProvider {
                service: "SecretsManager".into(),
                region: "eu-west-1".into(),
                auth: Some(AwsAuth {
                    jwt: Some(AwsJwtAuth::default()),
                    agent_identity: Some(Empty {}),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            provider(&aws, StoreKind::ClusterSecretStore).unwrap_err().0,
            "spec.provider.aws.auth: must set at most one of secretRef, jwt, agentIdentity \
             (found jwt, agentIdentity)"
        );
    }

    #[test]
    fn the_agent_identity_is_for_cluster_stores_only() {
        let store = StoreProvider {
            aws: Some(AwsProvider {
                service: "SecretsManager".into(),
                region: "eu-west-1".into(),
                auth: Some(AwsAuth {
                    agent_identity: Some(Empty {}),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            provider(&store, StoreKind::SecretStore).unwrap_err().0,
            "spec: provider.aws.auth.agentIdentity (the node agent's own AWS identity) is only \
             allowed on a ClusterSecretStore"
        );
        assert!(provider(&store, StoreKind::ClusterSecretStore).is_ok());
    }

    #[test]
    fn object_names_keep_paths_out() {
        for bad in ["..", "a/b", "../x", "", "A", "a..b", "-a", &"a".repeat(254)] {
            assert!(object_name("name", bad).is_err(), "{bad:?}");
        }
        for good in ["a", "db-creds", "a.b-c", "0x"] {
            assert!(object_name("name", good).is_ok(), "{good:?}");
        }
        let err = object_name("name", "x\n\x1b[2J").unwrap_err().0;
        assert!(!err.chars().any(char::is_control), "{err:?}");
    }

    #[test]
    fn plugin_endpoints_are_a_socket_name_in_an_absolute_dir_or_host_port() {
        assert_eq!(
            plugin_endpoint("unix:///var/run/latchkey/plugins/vault.sock"),
            Ok(PluginEndpoint::Unix {
                dir: "/var/run/latchkey/plugins",
                name: "vault.sock"
            })
        );
        assert_eq!(
            plugin_endpoint("unix:///p.sock"),
            Ok(PluginEndpoint::Unix {
                dir: "/",
                name: "p.sock"
            })
        );
        assert_eq!(
            plugin_endpoint("plugin.ns.svc:4000"),
            Ok(PluginEndpoint::Tcp {
                host: "plugin.ns.svc",
                port: 4000
            })
        );
        assert_eq!(
            plugin_endpoint("[::1]:4000"),
            Ok(PluginEndpoint::Tcp {
                host: "[::1]",
                port: 4000
            })
        );
        for bad in [
            "unix://../x.sock",
            "unix://x.sock",
            "unix:///var/run/latchkey/plugins/../x.sock",
            "unix:///var/run/latchkey/plugins/./x.sock",
            "unix:///var//x.sock",
            "unix:///var/run/x",
            "unix:///var/run/.sock",
            "unix:///var/run/.hidden.sock",
            "unix:///var/run/a b.sock",
            "http://plugin:4000",
            "dns:///plugin:4000",
            "plugin",
            "plugin:0",
            "plugin:99999",
            "plugin:+80",
            ":4000",
            "a/b:4000",
            "[nope]:4000",
        ] {
            assert!(plugin_endpoint(bad).is_err(), "{bad} accepted");
        }
        let long = format!("unix:///{}.sock", "a".repeat(65));
        assert!(plugin_endpoint(&long).is_err());
    }

    #[test]
    fn secrets_store_csi_names_a_socket_and_never_forges_pod_attributes() {
        let mut p = SecretsStoreCsiProvider {
            provider: "azure".into(),
            ..Default::default()
        };
        assert_eq!(secrets_store_csi(&p), Ok(PLUGIN_DEFAULT_TIMEOUT));
        for bad in ["", "../x", "a/b", "a.b", "x".repeat(31).as_str()] {
            p.provider = bad.into();
            assert!(secrets_store_csi(&p).is_err(), "{bad:?} accepted");
        }
        p.provider = "azure".into();
        p.parameters.insert(
            "csi.storage.k8s.io/pod.namespace".into(),
            "kube-system".into(),
        );
        let err = secrets_store_csi(&p).unwrap_err().to_string();
        assert!(err.contains("set by the agent"), "{err}");
        p.parameters.clear();
        p.parameters.insert(
            "objects".into(),
            "x".repeat(MAX_SECRETS_STORE_PARAMETERS_BYTES),
        );
        assert!(secrets_store_csi(&p).is_err());
        p.parameters.clear();
        p.timeout = Some("6m".into());
        assert!(secrets_store_csi(&p).is_err());
    }

    #[test]
    fn plugin_timeout_defaults_and_is_bounded() {
        let mut p = PluginProvider {
            endpoint: "unix:///run/p.sock".into(),
            ..Default::default()
        };
        assert_eq!(plugin(&p), Ok(PLUGIN_DEFAULT_TIMEOUT));
        p.timeout = Some("1500ms".into());
        assert_eq!(plugin(&p), Ok(Duration::from_millis(1500)));
        for bad in ["0", "6m", "1d", "soon"] {
            p.timeout = Some(bad.into());
            assert!(plugin(&p).is_err(), "{bad} accepted");
        }
        p.timeout = None;
        p.config_ref = Some(PluginConfigRef {
            name: String::new(),
            ..Default::default()
        });
        assert!(plugin(&p).is_err());
    }

    #[test]
    fn plugin_tls_only_on_tcp_with_a_ca_bundle() {
        use crate::api::store::{PluginTls, TlsSecretRef};
        let tls = PluginTls {
            ca_bundle: "-----BEGIN CERTIFICATE-----".into(),
            client_cert_secret_ref: Some(TlsSecretRef {
                name: "plugin-client".into(),
                namespace: None,
            }),
        };
        let mut p = PluginProvider {
            endpoint: "plugin.ns.svc:4000".into(),
            tls: Some(tls.clone()),
            audiences: vec!["vault".into()],
            ..Default::default()
        };
        assert!(plugin(&p).is_ok());
        p.endpoint = "unix:///run/p.sock".into();
        let err = plugin(&p).unwrap_err().0;
        assert!(
            err.contains("spec.provider.plugin: tls is only") && err.contains("unix"),
            "{err}"
        );
        p.endpoint = "plugin.ns.svc:4000".into();
        p.tls = Some(PluginTls {
            ca_bundle: " ".into(),
            ..tls.clone()
        });
        assert!(plugin(&p).is_err(), "an empty caBundle");
        p.tls = Some(PluginTls {
            client_cert_secret_ref: Some(TlsSecretRef {
                name: "../x".into(),
                namespace: None,
            }),
            ..tls
        });
        assert!(plugin(&p).is_err(), "a bad Secret name");
        p.tls = None;
        p.audiences = vec!["a\nb".into()];
        assert!(plugin(&p).is_err(), "a control character in an audience");
        p.audiences = vec!["a".into(); rules::MAX_AUDIENCES + 1];
        assert!(plugin(&p).is_err(), "too many audiences");
    }
}
