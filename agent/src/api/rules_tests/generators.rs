//! Generators: ExternalSecret entries that name one (`sourceRef.generatorRef`), and the generator
//! kinds, each sample spec checked as its own kind (at `spec`) and wrapped in a ClusterGenerator
//! (at `spec.generator.<kind>Spec`), where the same rules sit deeper.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use super::{Expect, agree, merge, rejected};
use crate::api::StoreKind;
use crate::api::generator::{
    ClusterGenerator, GeneratorObject, Password, PluginGenerator, VaultDynamicSecret,
};
use crate::api::rules::{self, DNS_SUBDOMAIN, DURATION};
use crate::api::validate::{self, Invalid};

/// ExternalSecret samples naming generators: (name, merge patch over the base ExternalSecret,
/// expected verdict).
pub(super) fn external_secret_samples() -> Vec<(&'static str, Value, Expect)> {
    let one_source = format!("spec.dataFrom[0]: {}", rules::EXTRACT_XOR_FIND.message);
    let generator = |kind: &str, name: &str| json!({"generatorRef": {"kind": kind, "name": name}});
    let from_generator = |kind: &str, name: &str| json!({"spec": {"dataFrom": [{"sourceRef": generator(kind, name)}]}});
    let key_from_generator = |kind: &str, name: &str| {
        json!({"spec": {"data": [
            {"secretKey": "password", "remoteRef": {"key": "password"}, "sourceRef": generator(kind, name)}
        ]}})
    };
    let no_store = "spec.secretStoreRef: must be set unless every entry names a generator";
    vec![
        // Generators: `sourceRef.generatorRef` on `data[]` (one key of the result) and
        // `dataFrom[]` (every key of it).
        (
            "every entry from a generator, without a store",
            json!({"spec": {
                "secretStoreRef": null,
                "data": [{"secretKey": "password", "remoteRef": {"key": "password"},
                          "sourceRef": generator("Password", "db-password")}],
                "dataFrom": [{"sourceRef": {"generatorRef": {
                    "apiVersion": "generators.latchkey.dev/v1alpha1",
                    "kind": "ClusterGenerator", "name": "pki.example"}}}],
            }}),
            Expect::Valid,
        ),
        (
            "a generator beside the store's entries",
            json!({"spec": {
                "data": [{"secretKey": "user", "remoteRef": {"key": "prod/db"}},
                         {"secretKey": "password", "remoteRef": {"key": "password"},
                          "sourceRef": generator("VaultDynamicSecret", "db")}],
                "dataFrom": [{"extract": {"key": "prod/app"}},
                             {"sourceRef": generator("PluginGenerator", "account")}],
            }}),
            Expect::Valid,
        ),
        (
            "a generator with extract",
            json!({"spec": {"dataFrom": [
                {"extract": {"key": "a"}, "sourceRef": generator("Password", "pw")}
            ]}}),
            rejected(one_source.clone()),
        ),
        (
            "a generator with find",
            json!({"spec": {"dataFrom": [
                {"find": {"path": "p"}, "sourceRef": generator("Password", "pw")}
            ]}}),
            rejected(one_source.clone()),
        ),
        (
            "an empty sourceRef is no source",
            json!({"spec": {"dataFrom": [{"sourceRef": {}}]}}),
            rejected(one_source.clone()),
        ),
        (
            "data from a generator of an unknown kind",
            key_from_generator("Secret", "pw"),
            rejected(format!(
                "spec.data[0].sourceRef.generatorRef.kind: {}",
                rules::GENERATOR_KIND.message
            )),
        ),
        (
            "dataFrom a generator of ESO's kind spelling",
            from_generator("password", "pw"),
            rejected(format!(
                "spec.dataFrom[0].sourceRef.generatorRef.kind: {}",
                rules::GENERATOR_KIND.message
            )),
        ),
        (
            "data from a badly named generator",
            key_from_generator("Password", "../pw"),
            rejected(format!(
                "spec.data[0].sourceRef.generatorRef.name: {}",
                DNS_SUBDOMAIN.message
            )),
        ),
        (
            "dataFrom a badly named generator",
            from_generator("ClusterGenerator", "Pki_Issuer"),
            rejected(format!(
                "spec.dataFrom[0].sourceRef.generatorRef.name: {}",
                DNS_SUBDOMAIN.message
            )),
        ),
        (
            "a generator name too long",
            from_generator("Password", &"a".repeat(254)),
            rejected(
                "spec.dataFrom[0].sourceRef.generatorRef.name: must be at most 253 characters long",
            ),
        ),
        // Agent-only rules. The CRD admits these: leaving out `secretStoreRef` is fine only when
        // every entry of both lists names a generator, which a rule could only say by iterating
        // the lists (`rules_stay_cheap_for_the_api_server` forbids it); and `apiVersion` has no
        // pattern. The agent refuses them on every read.
        (
            "no store while an entry reads one",
            json!({"spec": {
                "secretStoreRef": null,
                "data": [{"secretKey": "user", "remoteRef": {"key": "prod/db"}},
                         {"secretKey": "password", "remoteRef": {"key": "password"},
                          "sourceRef": generator("Password", "pw")}],
            }}),
            Expect::AgentOnly(no_store.into()),
        ),
        (
            "no store while a dataFrom entry reads one",
            json!({"spec": {
                "secretStoreRef": null,
                "data": [{"secretKey": "password", "remoteRef": {"key": "password"},
                          "sourceRef": generator("Password", "pw")}],
                "dataFrom": [{"extract": {"key": "prod/app"}}],
            }}),
            Expect::AgentOnly(no_store.into()),
        ),
        (
            "no store and no generator",
            json!({"spec": {"secretStoreRef": null}}),
            Expect::AgentOnly(no_store.into()),
        ),
        (
            "a generator of ESO's API group",
            json!({"spec": {"dataFrom": [{"sourceRef": {"generatorRef": {
                "apiVersion": "generators.external-secrets.io/v1alpha1",
                "kind": "Password", "name": "pw"}}}]}}),
            Expect::AgentOnly(
                "spec.dataFrom[0].sourceRef.generatorRef.apiVersion: must be \
                 generators.latchkey.dev/v1alpha1"
                    .into(),
            ),
        ),
    ]
}

/// What a generator sample should get, relative to where its spec is.
enum Verdict {
    /// Both accept it.
    Valid,
    /// Both reject it: the path below the spec (`.length`, or `` for the spec itself) and the
    /// message.
    Rejected(&'static str, String),
    /// Only the agent rejects it (a bound the schema cannot state), same shape.
    AgentOnly(&'static str, String),
}

use Verdict::{AgentOnly, Rejected, Valid};

/// The three wrapped kinds: (kind, the ClusterGenerator's block, base spec).
fn kinds() -> [(&'static str, &'static str, Value); 3] {
    [
        ("Password", "passwordSpec", json!({"length": 16})),
        (
            "VaultDynamicSecret",
            "vaultDynamicSecretSpec",
            // ESO's own PKI example.
            json!({
                "path": "pki/issue/example-dot-com",
                "method": "POST",
                "parameters": {"common_name": "localhost"},
                "provider": {"server": "https://vault:8200", "auth": {"kubernetes": {"role": "app"}}},
            }),
        ),
        (
            "PluginGenerator",
            "pluginGeneratorSpec",
            json!({"provider": {"endpoint": "unix:///var/run/latchkey/plugins/accounts.sock"}}),
        ),
    ]
}

/// (kind, name, merge patch over the kind's base spec, verdict).
fn samples() -> Vec<(&'static str, &'static str, Value, Verdict)> {
    let secret = json!({"name": "vault-token", "key": "token"});
    let auth = |auth: Value| json!({"provider": {"auth": {"kubernetes": null}}}).pipe(auth);
    let many = |n: usize| -> Value {
        (0..n)
            .map(|i| (format!("k{i}"), json!("v")))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let fits = rules::PASSWORD_FITS.message.to_string();
    let one_auth = rules::VAULT_AUTH_ONE.message.to_string();
    vec![
        // Password
        ("Password", "default length", json!({"length": null}), Valid),
        (
            "Password",
            "digits and symbols fill the length",
            json!({"length": 8, "digits": 4, "symbols": 4}),
            Valid,
        ),
        ("Password", "the longest", json!({"length": 1024}), Valid),
        (
            "Password",
            "its own symbols",
            json!({"symbolCharacters": "-_".repeat(128), "noUpper": true, "allowRepeat": true}),
            Valid,
        ),
        (
            "Password",
            "more digits and symbols than length",
            json!({"digits": 10, "symbols": 7}),
            Rejected("", fits.clone()),
        ),
        (
            "Password",
            "digits beyond the default length",
            json!({"length": null, "digits": 25}),
            Rejected("", fits),
        ),
        (
            "Password",
            "zero length",
            json!({"length": 0}),
            Rejected(".length", rules::too_small(1)),
        ),
        (
            "Password",
            "too long",
            json!({"length": 1025}),
            Rejected(".length", rules::too_large(1024)),
        ),
        (
            "Password",
            "too many digits",
            json!({"length": 1024, "digits": 1025}),
            Rejected(".digits", rules::too_large(1024)),
        ),
        (
            "Password",
            "too many symbols",
            json!({"length": 1024, "symbols": 1025}),
            Rejected(".symbols", rules::too_large(1024)),
        ),
        (
            "Password",
            "no symbols to pick from",
            json!({"symbolCharacters": ""}),
            Rejected(".symbolCharacters", rules::NOT_EMPTY.message.into()),
        ),
        (
            "Password",
            "too many symbols to pick from",
            json!({"symbolCharacters": "x".repeat(257)}),
            Rejected(".symbolCharacters", rules::too_long(256)),
        ),
        // VaultDynamicSecret
        (
            "VaultDynamicSecret",
            "a GET without parameters",
            json!({"method": null, "parameters": null, "resultType": "Auth"}),
            Valid,
        ),
        (
            "VaultDynamicSecret",
            "the most parameters (the base's and 63 more)",
            json!({"parameters": many(63), "resultType": "Raw", "allowEmptyResponse": true}),
            Valid,
        ),
        (
            "VaultDynamicSecret",
            "every method",
            json!({"method": "LIST"}),
            Valid,
        ),
        (
            "VaultDynamicSecret",
            "a token from a Secret, on a namespace",
            auth(json!({"provider": {"namespace": "team-a", "auth": {"tokenSecretRef": secret}}})),
            Valid,
        ),
        (
            "VaultDynamicSecret",
            "empty path",
            json!({"path": ""}),
            Rejected(".path", rules::NOT_EMPTY.message.into()),
        ),
        (
            "VaultDynamicSecret",
            "path too long",
            json!({"path": "p".repeat(1025)}),
            Rejected(".path", rules::too_long(1024)),
        ),
        (
            "VaultDynamicSecret",
            "method DELETE",
            json!({"method": "DELETE"}),
            Rejected(".method", rules::VAULT_METHOD.message.into()),
        ),
        (
            "VaultDynamicSecret",
            "method in lower case",
            json!({"method": "post"}),
            Rejected(".method", rules::VAULT_METHOD.message.into()),
        ),
        (
            "VaultDynamicSecret",
            "too many parameters",
            json!({"parameters": many(64)}),
            Rejected(".parameters", rules::too_many_properties(64)),
        ),
        (
            "VaultDynamicSecret",
            "parameters too big",
            json!({"parameters": {"csr": "x".repeat(64 << 10)}}),
            AgentOnly(".parameters", "must be at most 64 KiB as JSON".into()),
        ),
        (
            "VaultDynamicSecret",
            "no auth method",
            auth(json!({})),
            Rejected(".provider.auth", one_auth.clone()),
        ),
        (
            "VaultDynamicSecret",
            "two auth methods",
            json!({"provider": {"auth": {"jwt": {"role": "app"}}}}),
            Rejected(".provider.auth", one_auth),
        ),
        (
            "VaultDynamicSecret",
            "kv v3",
            json!({"provider": {"version": "v3"}}),
            Rejected(".provider.version", rules::VAULT_VERSION.message.into()),
        ),
        (
            "VaultDynamicSecret",
            "token in a badly named Secret",
            auth(
                json!({"provider": {"auth": {"tokenSecretRef": {"name": "Vault_Token", "key": "t"}}}}),
            ),
            Rejected(
                ".provider.auth.tokenSecretRef.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
        (
            "VaultDynamicSecret",
            "approle secret id in a badly named Secret",
            auth(
                json!({"provider": {"auth": {"appRole": {"roleId": "id", "secretRef": {"name": "../x", "key": "k"}}}}}),
            ),
            Rejected(
                ".provider.auth.appRole.secretRef.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
        (
            "VaultDynamicSecret",
            "userpass password in a badly named Secret",
            auth(
                json!({"provider": {"auth": {"userPass": {"username": "u", "secretRef": {"name": "../x", "key": "k"}}}}}),
            ),
            Rejected(
                ".provider.auth.userPass.secretRef.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
        (
            "VaultDynamicSecret",
            "cert client certificate in a badly named Secret",
            auth(
                json!({"provider": {"auth": {"cert": {"clientCert": {"name": "../x", "key": "k"}, "secretRef": {"name": "k", "key": "k"}}}}}),
            ),
            Rejected(
                ".provider.auth.cert.clientCert.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
        (
            "VaultDynamicSecret",
            "cert key in a badly named Secret",
            auth(
                json!({"provider": {"auth": {"cert": {"clientCert": {"name": "c", "key": "k"}, "secretRef": {"name": "../x", "key": "k"}}}}}),
            ),
            Rejected(
                ".provider.auth.cert.secretRef.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
        (
            "VaultDynamicSecret",
            "CA in a badly named ConfigMap",
            auth(
                json!({"provider": {"caProvider": {"type": "ConfigMap", "name": "../x", "key": "k"}}}),
            ),
            Rejected(".provider.caProvider.name", DNS_SUBDOMAIN.message.into()),
        ),
        // PluginGenerator
        (
            "PluginGenerator",
            "over TCP with mutual TLS",
            json!({"provider": {
                "endpoint": "accounts.plugins.svc:4000", "timeout": "30s", "audiences": ["accounts"],
                "tls": {"caBundle": "-----BEGIN CERTIFICATE-----", "clientCertSecretRef": {"name": "client"}},
            }}),
            Valid,
        ),
        (
            "PluginGenerator",
            "TLS on a unix socket",
            json!({"provider": {"tls": {"caBundle": "-----BEGIN CERTIFICATE-----"}}}),
            Rejected(".provider", rules::PLUGIN_TLS_TCP_ONLY.message.into()),
        ),
        (
            "PluginGenerator",
            "TLS with two CAs",
            json!({"provider": {"endpoint": "p:4000", "tls": {
                "caBundle": "-----BEGIN CERTIFICATE-----",
                "caProvider": {"type": "ConfigMap", "name": "ca", "key": "ca.crt"},
            }}}),
            Rejected(".provider.tls", rules::PLUGIN_TLS_ONE_CA.message.into()),
        ),
        (
            "PluginGenerator",
            "CA in a badly named ConfigMap",
            json!({"provider": {"endpoint": "p:4000", "tls": {
                "caProvider": {"type": "ConfigMap", "name": "../x", "key": "ca.crt"},
            }}}),
            Rejected(
                ".provider.tls.caProvider.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
        (
            "PluginGenerator",
            "timeout that is no duration",
            json!({"provider": {"timeout": "soon"}}),
            Rejected(".provider.timeout", DURATION.message.into()),
        ),
        (
            "PluginGenerator",
            "client certificate in a badly named Secret",
            json!({"provider": {
                "endpoint": "p:4000",
                "tls": {"caBundle": "-----BEGIN CERTIFICATE-----", "clientCertSecretRef": {"name": "Client"}},
            }}),
            Rejected(
                ".provider.tls.clientCertSecretRef.name",
                DNS_SUBDOMAIN.message.into(),
            ),
        ),
    ]
}

/// Applies a merge patch to a JSON value, returning it (for samples built from a base).
trait Pipe {
    fn pipe(self, patch: Value) -> Value;
}

impl Pipe for Value {
    fn pipe(mut self, patch: Value) -> Value {
        merge(&mut self, &patch);
        self
    }
}

fn expect(prefix: &str, verdict: &Verdict) -> Expect {
    match verdict {
        Valid => Expect::Valid,
        Rejected(rel, message) => Expect::Rejected(format!("{prefix}{rel}: {message}")),
        AgentOnly(rel, message) => Expect::AgentOnly(format!("{prefix}{rel}: {message}")),
    }
}

fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "generators.latchkey.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "gen", "namespace": "shop"},
        "spec": spec,
    })
}

fn cluster(kind: &str, generator: Value) -> Value {
    json!({
        "apiVersion": "generators.latchkey.dev/v1alpha1",
        "kind": "ClusterGenerator",
        "metadata": {"name": "gen"},
        "spec": {"kind": kind, "generator": generator,
                 "conditions": [{"namespaces": ["shop"]}, {"namespaceRegexes": ["^team-"]}]},
    })
}

/// The agent's check of a namespaced generator; its credentials count as a SecretStore's.
fn namespaced(g: GeneratorObject) -> Result<(), Invalid> {
    let scope = validate::generator(&g)?;
    assert_eq!(scope, StoreKind::SecretStore);
    Ok(())
}

/// The agent's check of a ClusterGenerator; its credentials count as a ClusterSecretStore's.
fn clustered(g: &ClusterGenerator) -> Result<(), Invalid> {
    let scope = validate::generator(&GeneratorObject::Cluster(g.clone().into()))?;
    assert_eq!(scope, StoreKind::ClusterSecretStore);
    Ok(())
}

/// Every sample, as its kind and wrapped in a ClusterGenerator; then the ClusterGenerator's own.
pub(super) fn check_every_sample(
    schemas: &HashMap<String, Value>,
    broken: &mut BTreeSet<(String, String)>,
) {
    let kinds = kinds();
    for (kind, name, patch, verdict) in samples() {
        let (_, block, base) = kinds.iter().find(|(k, _, _)| *k == kind).unwrap();
        let spec = base.clone().pipe(patch);
        let own = object(kind, spec.clone());
        let expect_own = expect("spec", &verdict);
        match kind {
            "Password" => agree::<Password>(
                schemas,
                kind,
                name,
                own,
                |g| namespaced(GeneratorObject::Password(g.clone().into())),
                &expect_own,
                broken,
            ),
            "VaultDynamicSecret" => agree::<VaultDynamicSecret>(
                schemas,
                kind,
                name,
                own,
                |g| namespaced(GeneratorObject::VaultDynamicSecret(g.clone().into())),
                &expect_own,
                broken,
            ),
            _ => agree::<PluginGenerator>(
                schemas,
                kind,
                name,
                own,
                |g| namespaced(GeneratorObject::Plugin(g.clone().into())),
                &expect_own,
                broken,
            ),
        }
        agree::<ClusterGenerator>(
            schemas,
            "ClusterGenerator",
            name,
            cluster(kind, json!({ *block: spec })),
            clustered,
            &expect(&format!("spec.generator.{block}"), &verdict),
            broken,
        );
    }
    let mismatch = format!("spec: {}", rules::CLUSTER_GENERATOR_KIND_MATCHES.message);
    let [(_, _, password), (_, _, vault), _] = kinds;
    for (name, kind, generator) in [
        (
            "kind and block differ",
            "Password",
            json!({"vaultDynamicSecretSpec": vault}),
        ),
        (
            "two blocks",
            "Password",
            json!({"passwordSpec": password, "vaultDynamicSecretSpec": vault}),
        ),
        ("no block", "PluginGenerator", json!({})),
    ] {
        agree::<ClusterGenerator>(
            schemas,
            "ClusterGenerator",
            name,
            cluster(kind, generator),
            clustered,
            &Expect::Rejected(mismatch.clone()),
            broken,
        );
    }
}
