//! The agent-side validators, rule by rule.

use super::plugin::*;
use super::*;
use crate::api::external_secret::*;
use crate::api::store::*;

fn es() -> ExternalSecretSpec {
    ExternalSecretSpec {
        secret_store_ref: Some(SecretStoreRef {
            name: "s".into(),
            kind: StoreKind::SecretStore,
        }),
        refresh_interval: None,
        data: vec![ExternalSecretData {
            source_ref: None,
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
        source_ref: None,
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
         appRole, userPass, cert, iam (none is set)"
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
    let user = |username: &str| VaultAuth {
        user_pass: Some(crate::api::store::VaultUserPass {
            username: username.into(),
            secret_ref: crate::api::store::SecretKeySelector {
                name: "pw".into(),
                key: "password".into(),
                namespace: None,
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(provider(&vault(user("shop")), StoreKind::SecretStore).is_ok());
    for bad in ["", "../root", "a/b", "a\nb", "..", "a?b", "a#b", "a%2fb"] {
        let err = provider(&vault(user(bad)), StoreKind::SecretStore).unwrap_err();
        assert!(
            err.0
                .starts_with("spec.provider.vault.auth.userPass.username"),
            "{err}"
        );
    }
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
        ca_bundle: Some("-----BEGIN CERTIFICATE-----".into()),
        client_cert_secret_ref: Some(TlsSecretRef {
            name: "plugin-client".into(),
            namespace: None,
        }),
        ..Default::default()
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
        ca_bundle: Some(" ".into()),
        ..tls.clone()
    });
    assert!(plugin(&p).is_err(), "an empty caBundle");
    let from_map = crate::api::store::CaProvider {
        kind: crate::api::store::CaProviderKind::ConfigMap,
        name: "plugin-ca".into(),
        key: "ca.crt".into(),
        namespace: None,
    };
    p.tls = Some(PluginTls {
        ca_bundle: None,
        ca_provider: Some(from_map.clone()),
        ..tls.clone()
    });
    assert!(plugin(&p).is_ok(), "a caProvider instead of a caBundle");
    p.tls = Some(PluginTls {
        ca_provider: Some(from_map),
        ..tls.clone()
    });
    assert_eq!(
        plugin(&p).unwrap_err().0,
        "spec.provider.plugin.tls: must set exactly one of caBundle, caProvider"
    );
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

mod generators {
    use std::sync::Arc;

    use super::super::generator::*;
    use crate::api::StoreKind;
    use crate::api::generator::*;

    fn vds(parameters: serde_json::Value) -> VaultDynamicSecretSpec {
        serde_json::from_value(serde_json::json!({
            "path": "pki/issue/example-dot-com",
            "parameters": parameters,
            "provider": {"server": "https://vault:8200", "auth": {"kubernetes": {"role": "app"}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_cluster_generator_s_credentials_count_as_a_cluster_store_s() {
        let spec = vds(serde_json::json!({"common_name": "localhost"}));
        let own = GeneratorObject::VaultDynamicSecret(Arc::new(VaultDynamicSecret::new(
            "pki",
            spec.clone(),
        )));
        assert_eq!(generator(&own), Ok(StoreKind::SecretStore));
        let cluster = GeneratorObject::Cluster(Arc::new(ClusterGenerator::new(
            "pki",
            ClusterGeneratorSpec {
                kind: GeneratorKind::VaultDynamicSecret,
                generator: GeneratorSpecs {
                    vault_dynamic_secret_spec: Some(spec),
                    ..Default::default()
                },
                conditions: vec![],
            },
        )));
        assert_eq!(generator(&cluster), Ok(StoreKind::ClusterSecretStore));
    }

    #[test]
    fn oversized_parameters_are_refused_without_quoting_them() {
        let value = format!("hunter2-{}", "x".repeat(64 << 10));
        let err = vault_dynamic_secret("spec", &vds(serde_json::json!({"csr": value})))
            .unwrap_err()
            .0;
        assert_eq!(err, "spec.parameters: must be at most 64 KiB as JSON");
        // Just under the bound: the JSON text (quotes, key, braces) is what counts.
        let fits = "x".repeat((64 << 10) - r#"{"csr":""}"#.len());
        assert_eq!(
            vault_dynamic_secret("spec", &vds(serde_json::json!({"csr": fits}))),
            Ok(())
        );
    }

    #[test]
    fn wrapped_plugin_messages_name_the_wrapped_field() {
        let spec: PluginGeneratorSpec = serde_json::from_value(serde_json::json!({
            "provider": {"endpoint": "unix:///run/plugins/../x.sock"}
        }))
        .unwrap();
        let err = plugin_generator("spec.generator.pluginGeneratorSpec", &spec)
            .unwrap_err()
            .0;
        assert!(
            err.starts_with("spec.generator.pluginGeneratorSpec.provider.endpoint: "),
            "{err}"
        );
        // A store's plugin keeps its own path.
        let err = super::super::plugin::plugin(&spec.provider).unwrap_err().0;
        assert!(err.starts_with("spec.provider.plugin.endpoint: "), "{err}");
    }
}
