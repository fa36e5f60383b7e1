//! The resource types served.

use super::*;

/// One served resource type.
#[derive(Debug)]
pub(super) struct Kind {
    pub(super) group: &'static str,
    pub(super) version: &'static str,
    pub(super) plural: &'static str,
    pub(super) kind: &'static str,
    pub(super) namespaced: bool,
    /// A custom resource: tracks `generation`; list items keep `apiVersion`/`kind`.
    pub(super) crd: bool,
    /// Has a `status` subresource: writes to the main resource ignore `.status`.
    pub(super) status_subresource: bool,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    pub(super) fields: &'static [&'static str],
}

/// Index of `v1` Namespaces in [`KINDS`].
pub(super) const NAMESPACE_KIND: usize = 0;
/// Index of `v1` ServiceAccounts in [`KINDS`].
pub(super) const SERVICE_ACCOUNT_KIND: usize = 4;

pub(super) const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        crd: false,
        status_subresource: true,
        fields: &["status.phase"],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &["type"],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[
            "involvedObject.apiVersion",
            "involvedObject.fieldPath",
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.resourceVersion",
            "involvedObject.uid",
            "reason",
            "reportingComponent",
            "type",
        ],
    },
    Kind {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "reason",
            "type",
        ],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        kind: "ServiceAccount",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[],
    },
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "externalsecrets",
        kind: "ExternalSecret",
        namespaced: true,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "clusterexternalsecrets",
        kind: "ClusterExternalSecret",
        namespaced: false,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "pushsecrets",
        kind: "PushSecret",
        namespaced: true,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "secretstores",
        kind: "SecretStore",
        namespaced: true,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "clustersecretstores",
        kind: "ClusterSecretStore",
        namespaced: false,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "generators.latchkey.dev",
        version: "v1alpha1",
        plural: "generatorstates",
        kind: "GeneratorState",
        namespaced: true,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "generators.latchkey.dev",
        version: "v1alpha1",
        plural: "passwords",
        kind: "Password",
        namespaced: true,
        crd: true,
        status_subresource: false,
        fields: &[],
    },
    Kind {
        group: "generators.latchkey.dev",
        version: "v1alpha1",
        plural: "vaultdynamicsecrets",
        kind: "VaultDynamicSecret",
        namespaced: true,
        crd: true,
        status_subresource: false,
        fields: &[],
    },
    Kind {
        group: "generators.latchkey.dev",
        version: "v1alpha1",
        plural: "plugingenerators",
        kind: "PluginGenerator",
        namespaced: true,
        crd: true,
        status_subresource: false,
        fields: &[],
    },
    Kind {
        group: "generators.latchkey.dev",
        version: "v1alpha1",
        plural: "clustergenerators",
        kind: "ClusterGenerator",
        namespaced: false,
        crd: true,
        status_subresource: false,
        fields: &[],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[],
    },
    // The provider kinds (one CRD each, not installed until a test installs it; see
    // [`FakeApiServer::install`]).
    provider("aws", "AWS"),
    provider("vaults", "Vault"),
    provider("kubernetes", "Kubernetes"),
    provider("fakes", "Fake"),
    provider("plugins", "Plugin"),
    provider("secretsstorecsiproviders", "SecretsStoreCSIProvider"),
    cluster_provider("aws", "AWS"),
    cluster_provider("vaults", "Vault"),
    cluster_provider("kubernetes", "Kubernetes"),
    cluster_provider("fakes", "Fake"),
    cluster_provider("plugins", "Plugin"),
    cluster_provider("secretsstorecsiproviders", "SecretsStoreCSIProvider"),
];

/// A namespaced provider kind of `providers.latchkey.dev/v1alpha1`.
const fn provider(plural: &'static str, kind: &'static str) -> Kind {
    provider_kind("providers.latchkey.dev", plural, kind, true)
}

/// A cluster-scoped provider kind of `cluster.providers.latchkey.dev/v1alpha1`.
const fn cluster_provider(plural: &'static str, kind: &'static str) -> Kind {
    provider_kind("cluster.providers.latchkey.dev", plural, kind, false)
}

const fn provider_kind(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Kind {
    Kind {
        group,
        version: "v1alpha1",
        plural,
        kind,
        namespaced,
        crd: true,
        // `latchkey controller` writes their `Ready` condition (agent/src/provider_status).
        status_subresource: true,
        fields: &[],
    }
}

impl Kind {
    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The group-qualified resource used in messages: `secrets`, `externalsecrets.latchkey.dev`.
    pub(super) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `details` of a Status about one object of this kind.
    pub(super) fn details(&self, name: &str) -> Value {
        let mut details = json!({"name": name, "kind": self.plural});
        if !self.group.is_empty() {
            details["group"] = json!(self.group);
        }
        details
    }
}

/// The discovery document of `group/version` (`GET /apis/GROUP/VERSION`): its installed
/// resources, or `None` (404) when none is.
pub(super) fn discovery(
    group: &str,
    version: &str,
    installed: impl Fn(usize) -> bool,
) -> Option<Value> {
    let resources: Vec<Value> = KINDS
        .iter()
        .enumerate()
        .filter(|(i, k)| k.group == group && k.version == version && installed(*i))
        .flat_map(|(_, k)| {
            let singular = k.kind.to_lowercase();
            let main = json!({"name": k.plural, "singularName": singular, "namespaced": k.namespaced,
                "kind": k.kind, "verbs": ["delete", "get", "list", "patch", "create", "update", "watch"]});
            let status = k.status_subresource.then(|| {
                json!({"name": format!("{}/status", k.plural), "singularName": "",
                    "namespaced": k.namespaced, "kind": k.kind, "verbs": ["get", "patch", "update"]})
            });
            std::iter::once(main).chain(status)
        })
        .collect();
    (!resources.is_empty()).then(|| {
        json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("{group}/{version}"), "resources": resources})
    })
}

pub(super) fn kind_by_path(group: &str, version: &str, plural: &str) -> Option<usize> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.plural == plural)
}

/// The kind of a Rust-side call; panics on a kind the fake does not serve (test setup error).
pub(super) fn kind_by_type(api_version: &str, kind: &str) -> usize {
    KINDS
        .iter()
        .position(|k| k.api_version() == api_version && k.kind == kind)
        .unwrap_or_else(|| panic!("the fake API server does not serve {api_version} {kind}"))
}

/// Kind, namespace and name of an object handed to [`FakeApiServer::apply`].
pub(super) fn identify(object: &Value) -> (usize, String, String) {
    let field = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let kind = kind_by_type(&field(object.get("apiVersion")), &field(object.get("kind")));
    let name = field(object.pointer("/metadata/name"));
    let namespace = field(object.pointer("/metadata/namespace"));
    assert!(!name.is_empty(), "apply: metadata.name is required");
    assert_eq!(
        KINDS[kind].namespaced,
        !namespace.is_empty(),
        "apply {name}: metadata.namespace must be set exactly for namespaced kinds"
    );
    (kind, namespace, name)
}
