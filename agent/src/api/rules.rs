//! The validation rules of the Latchkey API, shared by the CRD schema and the agent.
//!
//! Each [`CelRule`] is attached to its sub-schema as an `x-kubernetes-validations` entry (through
//! `#[x_kube(validation = ...)]` on the types), so the API server enforces it without an admission
//! webhook. The agent enforces the same rule in [`super::validate`] and reports the same `message`,
//! prefixed with the field path as the API server does (`spec.data[0].secretKey: must not be
//! empty`). The `rules_tests` module evaluates every rule of the generated CRDs with a CEL
//! interpreter against sample objects and checks that the agent reaches the same verdict.
//!
//! Checks on a single string's shape are OpenAPI `pattern`s ([`Pattern`]) rather than CEL: the
//! API server runs them without a CEL cost, on every version that serves the CRD. The agent
//! matches the same regular expression and reports the pattern's `message`.
//!
//! The rules mirror the External Secrets Operator's webhook checks where Latchkey has the same
//! fields. Every rule stays cheap for the API server's CEL cost budget: rules test presence and
//! sizes, the one regular expression in a rule runs over a short bounded string (`maxLength`), and
//! every list whose items carry a rule is bounded (`maxItems`).

use std::sync::LazyLock;

use kube::core::Rule;
use regex::Regex;

/// One `x-kubernetes-validations` entry: a CEL expression over `self` and its failure message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CelRule {
    /// The CEL expression; `self` is the value of the schema node the rule is attached to.
    pub rule: &'static str,
    /// What the API server and the agent report when the rule fails (after the field path).
    pub message: &'static str,
}

impl From<&CelRule> for Rule {
    fn from(r: &CelRule) -> Rule {
        Rule::new(r.rule).message(r.message)
    }
}

// ---- ExternalSecret -------------------------------------------------------------------------

/// On `spec` (ESO: "either data or dataFrom should be specified").
pub const DATA_OR_DATA_FROM: CelRule = CelRule {
    rule: "(has(self.data) && size(self.data) > 0) || \
           (has(self.dataFrom) && size(self.dataFrom) > 0)",
    message: "data or dataFrom must have at least one entry",
};

/// On strings that must be set: `spec.secretStoreRef.name`, `spec.data[].secretKey`, and the
/// `key` of every remote reference (`spec.data[].remoteRef.key`, `spec.dataFrom[].extract.key`).
pub const NOT_EMPTY: CelRule = CelRule {
    rule: "size(self) > 0",
    message: "must not be empty",
};

/// Longest `spec.refreshInterval`, in seconds: one year (8760h). Longer means "never" in
/// practice (`0` says so explicitly), and a bound keeps every deadline computation in range.
pub const MAX_REFRESH_INTERVAL_SECS: u64 = 8760 * 3600;

/// `maxLength` of `spec.refreshInterval`: far more than any sensible duration needs, and it bounds
/// the CEL cost of [`REFRESH_INTERVAL_MAX`].
pub const MAX_DURATION_LEN: usize = 64;

/// The regular expression of [`DURATION`], a macro so that [`REFRESH_INTERVAL_MAX`] can embed it.
macro_rules! duration_regex {
    () => {
        "^(0|([0-9]+([.][0-9]+)?(h|m|s|ms|us|µs)|[0-9]+ns)+)$"
    };
}

/// The `pattern` of `spec.refreshInterval`: durations as Go's `time.ParseDuration` reads them
/// (ESO's `metav1.Duration`, Kubernetes' CEL `duration()`, and the agent: [`super::duration`]),
/// without the rarer forms Go also takes (signs, `.5h`, `5.h`, `μs` in Greek mu). Spaces, `d`,
/// `w`, long unit names and fractional nanoseconds are refused, as Go refuses them.
pub const DURATION: Pattern = Pattern {
    regex: duration_regex!(),
    message: "must be a duration such as 1h, 15m, 1h30m or 0 (units h, m, s, ms, us, ns)",
};

/// On `spec.refreshInterval` (Kubernetes' CEL `duration()` parses Go durations, as ESO's
/// `metav1.Duration` does). A value that is not a duration passes this rule and is left to the
/// [`DURATION`] pattern: `duration()` would fail on it, which the API server reports as an
/// evaluation error next to the pattern's own message.
pub const REFRESH_INTERVAL_MAX: CelRule = CelRule {
    rule: concat!(
        "!self.matches('",
        duration_regex!(),
        "') || duration(self) <= duration('8760h')"
    ),
    message: "must be at most 8760h (one year); use 0 to fetch once",
};

/// On `spec.dataFrom[]` (ESO: "extract, find, or generatorRef cannot be set at the same time"
/// and "either extract, find, or sourceRef must be set"). A generator makes its whole result
/// for one volume, so it is never combined with `extract` or `find` (which read a store). An
/// empty `sourceRef` counts as unset. Whether `spec.secretStoreRef` may be left out
/// (every entry names a generator) needs a look over both lists, which a cheap rule cannot
/// take: the agent alone checks it (see [`super::validate::external_secret`]).
pub const EXTRACT_XOR_FIND: CelRule = CelRule {
    rule: "(has(self.extract) ? 1 : 0) + (has(self.find) ? 1 : 0) + \
           (has(self.sourceRef) && has(self.sourceRef.generatorRef) ? 1 : 0) == 1",
    message: "must set exactly one of extract, find, sourceRef.generatorRef",
};

/// On `spec.dataFrom[].find`: a find without criteria would list the whole backend.
pub const FIND_NAME_OR_PATH: CelRule = CelRule {
    rule: "has(self.name) || has(self.path) || has(self.tags)",
    message: "must set name, path or tags",
};

/// `maxProperties` of `spec.dataFrom[].find.tags`: each tag is one filter of the backend's
/// search (Parameter Store takes a few dozen at most).
pub const MAX_FIND_TAGS: usize = 10;

/// On `spec.target` (ESO rejects Delete with creationPolicy Merge or None; Latchkey also rejects
/// Orphan: an orphaned Secret has no owner, so Latchkey does not delete it).
pub const DELETE_NEEDS_OWNER: CelRule = CelRule {
    rule: "!has(self.deletionPolicy) || self.deletionPolicy != 'Delete' || \
           (has(self.creationPolicy) && self.creationPolicy == 'Owner')",
    message: "deletionPolicy Delete requires creationPolicy Owner",
};

/// On `spec.target` (ESO: "deletionPolicy=Merge must not be used with creationPolicy=None");
/// creationPolicy defaults to None in Latchkey, so an absent creationPolicy counts as None.
pub const MERGE_NEEDS_MIRROR: CelRule = CelRule {
    rule: "!has(self.deletionPolicy) || self.deletionPolicy != 'Merge' || \
           (has(self.creationPolicy) && self.creationPolicy != 'None')",
    message: "deletionPolicy Merge requires a mirrored Secret (creationPolicy Owner, Orphan or Merge)",
};

/// On `spec.target.files.defaultMode` and `spec.target.files.items[].mode`.
pub const FILE_MODE: CelRule = CelRule {
    rule: "self >= 0 && self <= 511",
    message: "must be a file mode between 0 and 0777 (511)",
};

/// `maxItems` of `spec.data`, `spec.dataFrom` and `spec.target.files.items`: their items carry
/// rules, and the API server's cost estimate multiplies a rule's cost by the list's bound.
pub const MAX_ITEMS: usize = 1000;

/// `maxItems` of `spec.dataFrom`: each entry may expand into many entries (or a whole listing),
/// so far fewer are allowed than plain `data` entries.
pub const MAX_DATA_FROM: usize = 50;

/// `maxItems` of `spec.dataFrom[].rewrite`: each step runs over every entry name of its source.
pub const MAX_REWRITES: usize = 16;

/// `maxProperties` of `spec.target.template.data`: each key is a CEL program.
pub const MAX_TEMPLATE_KEYS: usize = 100;

/// `maxLength` of `spec.data[].secretKey` (the key length limit of a Kubernetes Secret).
pub const MAX_SECRET_KEY_LEN: usize = 253;

/// `maxLength` of `spec.target.files.items[].path` (the agent's limit counts bytes, see
/// [`crate::volume::path::MAX_PATH_BYTES`]; a schema can only count characters).
pub const MAX_FILE_PATH_LEN: usize = crate::volume::path::MAX_PATH_BYTES;

/// One segment of [`FILE_PATH`]: not `/`, `\\` or a control character (`char::is_control`:
/// U+0000..U+001F, U+007F..U+009F), and not starting with `..` or being `.`.
macro_rules! path_segment {
    () => {
        r"[.]?[^./\\\x00-\x1f\x7f-\x9f][^/\\\x00-\x1f\x7f-\x9f]*"
    };
}

/// The `pattern` of `spec.data[].secretKey` and `spec.target.files.items[].path`: the shape rules
/// of [`crate::volume::FilePath`], which every file name passes before it is written. A segment is
/// an optional `.` and then a character other than `.`, so `.`, `..` and anything starting with
/// `..` (the volume writer's own `..data` names) never match; `/` only separates non-empty
/// segments, at most 16 of them. `FilePath`'s byte limits (253 per segment, 1024 in all) are not
/// here: a regular expression counts characters, and RE2 refuses the nested counts a per-segment
/// limit would need; the agent enforces them when it writes the files.
pub const FILE_PATH: Pattern = Pattern {
    regex: concat!("^", path_segment!(), "(/", path_segment!(), "){0,15}$"),
    message: "must be a relative file path: at most 16 segments separated by '/', none of them \
              empty, '.' or starting with '..', and no backslash or control character",
};

// ---- Generators -----------------------------------------------------------------------------

/// Longest generated password: far beyond any real use, and it bounds the work of one Generate.
pub const MAX_PASSWORD_LENGTH: u32 = 1024;

/// Most keys of a VaultDynamicSecret's `parameters` (its `maxProperties`): a request body is a
/// handful of fields (`common_name`, `ttl`, `alt_names`, ...).
pub const MAX_VAULT_PARAMETERS: usize = 64;

/// Most bytes of a VaultDynamicSecret's `parameters` as JSON (checked by the agent only: a
/// schema cannot measure an object's encoding). The API server caps a whole object at ~1.5 MiB;
/// the agent reads manifests that never went through it.
pub const MAX_VAULT_PARAMETERS_BYTES: usize = 64 << 10;

/// `maxLength` of a VaultDynamicSecret's `path`.
pub const MAX_VAULT_PATH_LEN: usize = 1024;

/// `maxLength` of a Password's `symbolCharacters`.
pub const MAX_SYMBOL_CHARACTERS: usize = 256;

/// The `pattern` of a VaultDynamicSecret's `method` (ESO's methods; Vault treats PUT as POST).
pub const VAULT_METHOD: Pattern = Pattern {
    regex: r"^(GET|POST|PUT|LIST)$",
    message: "must be GET, POST, PUT or LIST",
};

/// The `pattern` of `generatorRef.kind` (`spec.data[].sourceRef.generatorRef.kind` and
/// `spec.dataFrom[].sourceRef.generatorRef.kind`): the generator kinds Latchkey serves.
pub const GENERATOR_KIND: Pattern = Pattern {
    regex: r"^(Password|VaultDynamicSecret|PluginGenerator|ClusterGenerator)$",
    message: "must be Password, VaultDynamicSecret, PluginGenerator or ClusterGenerator",
};

/// On a Password's `spec`: the digits and symbols asked for fit in the length.
pub const PASSWORD_FITS: CelRule = CelRule {
    rule: "(has(self.digits) ? self.digits : 0) + (has(self.symbols) ? self.symbols : 0) <= \
           (has(self.length) ? self.length : 24)",
    message: "digits + symbols must not exceed length",
};

/// On a ClusterGenerator's `spec`: `generator` holds exactly the block `kind` names.
pub const CLUSTER_GENERATOR_KIND_MATCHES: CelRule = CelRule {
    rule: "(has(self.generator.passwordSpec) ? 1 : 0) + \
           (has(self.generator.vaultDynamicSecretSpec) ? 1 : 0) + \
           (has(self.generator.pluginGeneratorSpec) ? 1 : 0) == 1 && \
           (self.kind == 'Password' ? has(self.generator.passwordSpec) : \
            self.kind == 'VaultDynamicSecret' ? has(self.generator.vaultDynamicSecretSpec) : \
            has(self.generator.pluginGeneratorSpec))",
    message: "generator must set exactly the block kind names (passwordSpec, \
              vaultDynamicSecretSpec or pluginGeneratorSpec)",
};

// ---- Object names ---------------------------------------------------------------------------

/// `maxLength` of an object name (a DNS subdomain, RFC 1123).
pub const MAX_NAME_LEN: usize = 253;

/// The `pattern` of the names of stores, Secrets and service accounts (`spec.secretStoreRef.name`,
/// `spec.target.name`, `spec.serviceAccountName`, a store's credential `...SecretRef.name`): an
/// RFC 1123 subdomain, as Kubernetes requires of their names and
/// [`crate::identity::is_dns_subdomain`] checks. Names reach API request paths.
pub const DNS_SUBDOMAIN: Pattern = Pattern {
    regex: r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    message: "is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', each \
              '.'-separated part starting and ending with a letter or digit)",
};

// ---- ClusterExternalSecret -----------------------------------------------------------------

/// `maxLength` of a namespace name (an RFC 1123 label).
pub const MAX_NAMESPACE_LEN: usize = 63;

/// `maxItems` of a ClusterExternalSecret's `spec.namespaces`: each name is one ExternalSecret
/// the controller writes and keeps.
pub const MAX_CES_NAMESPACES: usize = 1000;

/// `maxItems` of a ClusterExternalSecret's `spec.namespaceSelectors`: every Namespace is
/// matched against each of them.
pub const MAX_NAMESPACE_SELECTORS: usize = 32;

/// `maxProperties` of the labels and of the annotations of a ClusterExternalSecret's
/// `spec.externalSecretMetadata`.
pub const MAX_CES_METADATA: usize = 64;

// ---- PushSecret ----------------------------------------------------------------------------

/// `maxItems` of a PushSecret's `spec.secretStoreRefs`: each store is one backend write per
/// change of the source Secret.
pub const MAX_PUSH_STORES: usize = 16;

/// `maxItems` of a PushSecret's `spec.data`: each entry is one value written to every store.
pub const MAX_PUSH_DATA: usize = 100;

/// `maxLength` of `spec.data[].match.remoteRef.remoteKey` and `.property`: longer than any
/// backend's name (AWS: 512, Vault paths are bounded by the agent at 1024).
pub const MAX_REMOTE_KEY_LEN: usize = 1024;

/// On a PushSecret's `spec`: something to push, somewhere to push it.
pub const PUSH_STORES_AND_DATA: CelRule = CelRule {
    rule: "has(self.secretStoreRefs) && size(self.secretStoreRefs) > 0 && \
           has(self.data) && size(self.data) > 0",
    message: "secretStoreRefs and data must each have at least one entry",
};

/// On a PushSecret's `spec.template`: Latchkey templates are CEL expressions under `data`;
/// ESO's Go-template options would be pruned by the API server and the raw value pushed where a
/// rendered one was meant, so they are refused.
pub const PUSH_TEMPLATE_CEL: CelRule = CelRule {
    rule: "!has(self.engineVersion) && !has(self.templateFrom)",
    message: "engineVersion and templateFrom are not supported: templates are CEL expressions \
              under data (latchkey convert turns simple Go templates into CEL)",
};

/// On a PushSecret's `spec.template`: `type`, `labels` and `annotations` shape a Secret, and a
/// push writes none; refused rather than ignored (empty maps, as ESO's examples carry, pass).
pub const PUSH_TEMPLATE_NO_SECRET_FIELDS: CelRule = CelRule {
    rule: "!has(self.type) && (!has(self.metadata) || \
           ((!has(self.metadata.labels) || size(self.metadata.labels) == 0) && \
            (!has(self.metadata.annotations) || size(self.metadata.annotations) == 0)))",
    message: "type and metadata are not supported on a PushSecret's template: a push writes no \
              Secret",
};

/// On a PushSecret's `spec.selector`: one source, a Secret of the namespace or a generator
/// (ESO's webhook asks the same).
pub const PUSH_ONE_SOURCE: CelRule = CelRule {
    rule: "has(self.secret) != has(self.generatorRef)",
    message: "must set exactly one of secret or generatorRef",
};

/// On a PushSecret's `spec.secretStoreRefs[]`: a store is named, or selected by label, not both
/// (ESO: a `labelSelector` ref ignores `name`; here the author says which is meant).
pub const PUSH_STORE_BY_NAME: CelRule = CelRule {
    rule: "has(self.name) != has(self.labelSelector)",
    message: "must set exactly one of name and labelSelector",
};

/// Most stores one PushSecret writes: named ones and those its selectors match together.
pub const MAX_PUSH_SELECTED_STORES: usize = MAX_PUSH_STORES;

/// Most terms (`matchLabels` entries plus `matchExpressions`) and values per expression of a
/// PushSecret's store `labelSelector`; agent-only (the selector type is shared with stores'
/// `namespaceSelector`), it bounds the cost of matching it against every store.
pub const MAX_PUSH_SELECTOR_TERMS: usize = 16;

// ---- SecretStore / ClusterSecretStore -------------------------------------------------------

/// On `spec.provider` (ESO: "store must only have exactly one backend specified").
pub const ONE_PROVIDER: CelRule = CelRule {
    rule: "(has(self.aws) ? 1 : 0) + (has(self.vault) ? 1 : 0) + \
           (has(self.kubernetes) ? 1 : 0) + (has(self.fake) ? 1 : 0) + \
           (has(self.plugin) ? 1 : 0) + (has(self.secretsStoreCSI) ? 1 : 0) == 1",
    message: "must set exactly one of aws, vault, kubernetes, fake, plugin, secretsStoreCSI",
};

/// The `pattern` of `spec.provider.secretsStoreCSI.provider`: the Secrets Store CSI Driver's
/// own rule for provider names (its socket is `<name>.sock`), non-empty. No `/` or `.`, so the
/// name never leaves the provider directory.
pub const SECRETS_STORE_PROVIDER: Pattern = Pattern {
    regex: r"^[a-zA-Z0-9_-]{1,30}$",
    message: "must be 1 to 30 letters, digits, '_' or '-' (a Secrets Store CSI Driver provider \
              name)",
};

/// `maxItems` of `spec.provider.secretsStoreCSI.audiences`.
pub const MAX_AUDIENCES: usize = 8;

/// `maxLength` of `spec.provider.plugin.tls.caBundle`: a few CA certificates.
pub const MAX_CA_BUNDLE_LEN: usize = 64 * 1024;

/// On `spec.provider.plugin.tls`: the roots come from one place.
pub const PLUGIN_TLS_ONE_CA: CelRule = CelRule {
    rule: "(has(self.caBundle) ? 1 : 0) + (has(self.caProvider) ? 1 : 0) == 1",
    message: "must set exactly one of caBundle, caProvider",
};

/// On `spec.provider.plugin`: TLS is for TCP; on a unix socket the directory's permissions
/// already decide who is at the other end.
pub const PLUGIN_TLS_TCP_ONLY: CelRule = CelRule {
    rule: "!has(self.tls) || !self.endpoint.startsWith('unix://')",
    message: "tls is only for a host:port endpoint; a unix socket needs no TLS",
};

/// On `spec.provider.kubernetes`: a remote server gets the pod's token for an audience it
/// checks; a token for this cluster's own API server would let that server act here as the pod.
pub const KUBERNETES_SERVER_AUDIENCE: CelRule = CelRule {
    rule: "!has(self.server) || (has(self.auth) ? !has(self.audience) : \
           (has(self.audience) && size(self.audience) > 0))",
    message: "server needs exactly one of audience and auth: the pod's token for this \
              cluster's own API server never leaves it",
};

/// On `spec.provider.kubernetes`: this cluster's Secrets are read with the pod's own token only.
pub const KUBERNETES_AUTH_NEEDS_SERVER: CelRule = CelRule {
    rule: "!has(self.auth) || has(self.server)",
    message: "auth is only for a remote server; this cluster's Secrets are read with the pod's \
              own token",
};

/// On `spec.provider.kubernetes.server`: the roots come from one place.
pub const KUBERNETES_SERVER_ONE_CA: CelRule = CelRule {
    rule: "(has(self.caBundle) ? 1 : 0) + (has(self.caProvider) ? 1 : 0) == 1",
    message: "must set exactly one of caBundle, caProvider",
};

/// `maxLength` of `spec.provider.kubernetes.server.url`.
pub const MAX_SERVER_URL_LEN: usize = 512;

/// The `pattern` of `spec.provider.kubernetes.server.url`: `https://`, a host name, IPv4 or
/// bracketed IPv6 address, an optional port and path; no user information, query or fragment
/// (the agent parses it again).
pub const HTTPS_URL: Pattern = Pattern {
    regex: r"^https://([a-zA-Z0-9.-]+|\x5b[0-9a-fA-F:.]+\x5d)(:[0-9]{1,5})?(/[a-zA-Z0-9._~%/-]*)?$",
    message: "must be an https:// URL (host, optional port and path; no user, query or fragment)",
};

/// The `pattern` of a namespace name (`spec.provider.kubernetes.remoteNamespace`): an RFC 1123
/// label, as [`crate::identity::is_dns_label`] checks. Names reach API request paths.
pub const DNS_LABEL: Pattern = Pattern {
    regex: r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    message: "is not a valid namespace name (lowercase letters, digits and '-', starting and \
              ending with a letter or digit)",
};

/// `maxLength` of `spec.provider.plugin.endpoint`: a socket path or `host:port` is far shorter.
pub const MAX_PLUGIN_ENDPOINT_LEN: usize = 512;

/// On a SecretStore's `spec`: the node agent's own AWS identity reaches whatever the node's role
/// can read, so only a cluster administrator (a ClusterSecretStore) may hand it out.
pub const AGENT_IDENTITY_CLUSTER_ONLY: CelRule = CelRule {
    rule: "!has(self.provider) || !has(self.provider.aws) || !has(self.provider.aws.auth) || \
           !has(self.provider.aws.auth.agentIdentity)",
    message: "provider.aws.auth.agentIdentity (the node agent's own AWS identity) is only \
              allowed on a ClusterSecretStore",
};

/// On a store's `spec`: the backend inline or by reference, not both, not neither.
pub const PROVIDER_OR_REF: CelRule = CelRule {
    rule: "has(self.provider) != has(self.providerRef)",
    message: "must set exactly one of provider, providerRef",
};

/// On a SecretStore's `spec`: it may name only a provider object of its own namespace.
pub const PROVIDER_REF_NAMESPACED: CelRule = CelRule {
    rule: "!has(self.providerRef) || \
           self.providerRef.apiVersion == 'providers.latchkey.dev/v1alpha1'",
    message: "providerRef.apiVersion must be providers.latchkey.dev/v1alpha1 (a SecretStore \
              names a provider object of its own namespace)",
};

/// On a ClusterSecretStore's `spec`: it may name only a cluster-scoped provider object.
pub const PROVIDER_REF_CLUSTER: CelRule = CelRule {
    rule: "!has(self.providerRef) || \
           self.providerRef.apiVersion == 'cluster.providers.latchkey.dev/v1alpha1'",
    message: "providerRef.apiVersion must be cluster.providers.latchkey.dev/v1alpha1 (a \
              ClusterSecretStore names a cluster-scoped provider object)",
};

/// On the `spec` of a namespaced `AWS` provider object (`providers.latchkey.dev`): only
/// SecretStores name one, and a SecretStore may not use the agent's own identity
/// ([`AGENT_IDENTITY_CLUSTER_ONLY`]).
pub const AGENT_IDENTITY_CLUSTER_PROVIDER_ONLY: CelRule = CelRule {
    rule: "!has(self.auth) || !has(self.auth.agentIdentity)",
    message: "auth.agentIdentity (the node agent's own AWS identity) is only allowed on a \
              cluster-scoped AWS provider (cluster.providers.latchkey.dev)",
};

/// On `spec.provider.aws.service`, the two services of ESO's `aws` provider.
pub const AWS_SERVICE: CelRule = CelRule {
    rule: "self == 'SecretsManager' || self == 'ParameterStore'",
    message: "must be SecretsManager or ParameterStore",
};

/// On `spec.provider.aws.auth`. No method at all passes the schema (as in ESO, where it means
/// the SDK's default chain); refusing that is the AWS provider's job, since Latchkey uses the
/// agent's own identity only when `agentIdentity` is chosen explicitly.
pub const AWS_AUTH_AT_MOST_ONE: CelRule = CelRule {
    rule: "(has(self.secretRef) ? 1 : 0) + (has(self.jwt) ? 1 : 0) + \
           (has(self.agentIdentity) ? 1 : 0) <= 1",
    message: "must set at most one of secretRef, jwt, agentIdentity",
};

/// Longest `vault.auth.userPass.username`: it is a path segment of the login request.
pub const MAX_VAULT_USERNAME_LEN: usize = 256;

/// On `spec.provider.vault.version`.
pub const VAULT_VERSION: CelRule = CelRule {
    rule: "self == 'v1' || self == 'v2'",
    message: "must be v1 or v2",
};

/// On `spec.provider.vault.auth`.
pub const VAULT_AUTH_ONE: CelRule = CelRule {
    rule: "(has(self.tokenSecretRef) ? 1 : 0) + (has(self.kubernetes) ? 1 : 0) + \
           (has(self.jwt) ? 1 : 0) + (has(self.appRole) ? 1 : 0) + \
           (has(self.userPass) ? 1 : 0) + (has(self.cert) ? 1 : 0) + (has(self.iam) ? 1 : 0) == 1",
    message: "must set exactly one of tokenSecretRef, kubernetes, jwt, appRole, userPass, cert, iam",
};

// ---- Patterns -------------------------------------------------------------------------------

/// An OpenAPI `pattern` and the agent's message for a string that does not match it.
///
/// OpenAPI names ECMA-262 for `pattern`, the API server runs Go's RE2, and the agent the `regex`
/// crate, so a pattern only uses what all three read alike: literal characters, `\.`, `\\`,
/// `\xHH`, classes of those and ranges, groups, `|`, `?`, `*`, `+` and `{m,n}`. It is anchored
/// (`^...$`), as a `pattern` otherwise matches anywhere in the string. The API server reports a
/// mismatch in its own words (`should match '<regex>'`); the agent reports `message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// The regular expression.
    pub regex: &'static str,
    /// What the agent reports (after the field path) for a string that does not match.
    pub message: &'static str,
}

/// Every [`Pattern`] of the API; the agent compiles these once.
pub const PATTERNS: [&Pattern; 8] = [
    &FILE_PATH,
    &DURATION,
    &DNS_SUBDOMAIN,
    &SECRETS_STORE_PROVIDER,
    &VAULT_METHOD,
    &GENERATOR_KIND,
    &HTTPS_URL,
    &DNS_LABEL,
];

/// [`PATTERNS`] compiled, in the same order. Found by a scan rather than a hash map: a few
/// entries, and hashing the long path pattern on every check cost more than the scan.
static COMPILED: LazyLock<[Option<Regex>; PATTERNS.len()]> =
    LazyLock::new(|| PATTERNS.map(|p| Regex::new(p.regex).ok()));

impl Pattern {
    /// Whether `s` matches. A pattern missing from [`PATTERNS`] or not compiling matches nothing,
    /// so a mistake there fails closed (and the `rules_tests` samples catch it).
    pub fn is_match(&self, s: &str) -> bool {
        PATTERNS
            .iter()
            .zip(COMPILED.iter())
            .find(|(p, _)| p.regex == self.regex)
            .and_then(|(_, re)| re.as_ref())
            .is_some_and(|re| re.is_match(s))
    }
}

// ---- Structural constraints (OpenAPI keywords, reported by the API server in its own words) --

/// The agent's message for a list longer than its `maxItems`.
pub fn too_many_items(max: usize) -> String {
    format!("must have at most {max} items")
}

/// The agent's message for a map with more keys than its `maxProperties`.
pub fn too_many_properties(max: usize) -> String {
    format!("must have at most {max} properties")
}

/// The agent's message for a number below its `minimum`.
pub fn too_small(min: u64) -> String {
    format!("must be at least {min}")
}

/// The agent's message for a number above its `maximum`.
pub fn too_large(max: u64) -> String {
    format!("must be at most {max}")
}

/// The agent's message for a string longer than its `maxLength` (counted in characters).
pub fn too_long(max: usize) -> String {
    format!("must be at most {max} characters long")
}

/// The agent's message for a `x-kubernetes-list-type: map` entry whose key repeats an earlier
/// entry's (`spec.data` is keyed by `secretKey`; ESO rejects duplicate secretKeys too).
pub fn duplicate_key(key: &str, first: usize) -> String {
    format!("duplicates the {key} of entry {first}")
}
