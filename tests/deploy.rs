//! Deploy files: the Helm chart renders what kustomize builds, uses every value it offers and
//! places each where it belongs; every manifest of the repository is a valid object of its
//! Kubernetes type; Secret permissions stay where the design puts them in the chart too; and the
//! image has one version everywhere. Needs `kubectl` (for `kubectl kustomize`), not a cluster.

#[path = "support/helm.rs"]
mod helm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::{Value, json};

use helm::{Chart, yaml_documents};

const IMAGE: &str = "ghcr.io/latchkey-dev/latchkey";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> Chart {
    Chart::load(&repo().join("daemonset/chart"))
}

/// `kubectl kustomize daemonset/<dir>`, parsed. Fails rather than skips without kubectl: these
/// are the files users apply.
fn kustomize(dir: &str) -> Vec<Value> {
    let path = repo().join("daemonset").join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!("kubectl is required for the deploy tests (kubectl kustomize): {e}")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_documents(std::str::from_utf8(&out.stdout).unwrap())
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn key(doc: &Value) -> String {
    format!(
        "{} {} {}/{}",
        str_at(doc, "/apiVersion"),
        str_at(doc, "/kind"),
        str_at(doc, "/metadata/namespace"),
        str_at(doc, "/metadata/name")
    )
}

/// Null map entries are how a template says "not set"; the API server drops them too. A whole
/// float is the integer it equals: the CRDs' bounds are written `1024.0` (the Kubernetes types
/// hold them as floats) and kustomize rewrites them as `1024`.
fn normalise(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            if f.fract() == 0.0 && f.abs() < 9e15 {
                json!(f as i64)
            } else {
                v.clone()
            }
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalise(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalise).collect()),
        other => other.clone(),
    }
}

fn by_key(docs: &[Value]) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for doc in docs {
        assert!(
            map.insert(key(doc), normalise(doc)).is_none(),
            "{} rendered twice",
            key(doc)
        );
    }
    map
}

/// Asserts two sets of objects are the same, order aside, naming the first that differs.
fn assert_same_objects(chart: &[Value], kustomize: &[Value], what: &str) {
    let (c, k) = (by_key(chart), by_key(kustomize));
    assert_eq!(
        c.keys().collect::<Vec<_>>(),
        k.keys().collect::<Vec<_>>(),
        "{what}: not the same objects (left: chart, right: kustomize)"
    );
    for (name, object) in &c {
        let mut diffs = Vec::new();
        diff(object, &k[name], String::new(), &mut diffs);
        assert!(
            diffs.is_empty(),
            "{what}: {name} differs (chart vs kustomize):\n{}",
            diffs.join("\n")
        );
    }
}

/// Where two values differ, as `pointer: left vs right`.
fn diff(a: &Value, b: &Value, at: String, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                diff(l, r, format!("{at}/{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                diff(l, r, format!("{at}/{i}"), out);
            }
        }
        _ if a != b => out.push(format!("  {at}: {a} vs {b}")),
        _ => {}
    }
}

/// The chart installs into a namespace that exists (`helm install --create-namespace`), so it
/// renders no Namespace; kustomize creates `latchkey`. That is the only difference allowed.
fn without_namespace_object(docs: Vec<Value>) -> Vec<Value> {
    docs.into_iter()
        .filter(|d| !(d["kind"] == "Namespace" && d["metadata"]["name"] == "latchkey"))
        .collect()
}

#[test]
fn chart_renders_what_kustomize_builds() {
    let chart = chart();
    let mount_only = chart.render("latchkey", "latchkey", &helm::no_overrides());
    assert_same_objects(
        &mount_only,
        &without_namespace_object(kustomize(".")),
        "defaults vs daemonset/",
    );
    let with_mirror = chart.render(
        "latchkey",
        "latchkey",
        &json!({"controller": {"enabled": true}}),
    );
    assert_same_objects(
        &with_mirror,
        &without_namespace_object(kustomize("with-mirror")),
        "controller.enabled=true vs daemonset/with-mirror",
    );
}

/// The agent puts the cleanup finalizer on GeneratorStates exactly when the controller that
/// releases it is installed: without it, a finalizer would hold states (and their namespace's
/// deletion) with nobody to release them.
#[test]
fn the_agent_sets_the_generator_finalizer_only_with_the_controller() {
    let chart = chart();
    let mount_only = chart.render("latchkey", "latchkey", &helm::no_overrides());
    let with_mirror = chart.render(
        "latchkey",
        "latchkey",
        &json!({"controller": {"enabled": true}}),
    );
    for (docs, want, what) in [
        (kustomize("."), false, "daemonset/"),
        (kustomize("with-mirror"), true, "daemonset/with-mirror"),
        (mount_only, false, "the chart"),
        (with_mirror, true, "the chart with controller.enabled"),
    ] {
        let agent = container(find(&docs, "DaemonSet", "latchkey-node"), "latchkey");
        let set = args(agent).contains(&"--generator-finalizer");
        assert_eq!(set, want, "{what}: --generator-finalizer");
    }
}

/// The agent runs with glibc's allocator defaults, as it is benchmarked (scripts/bench-go-csi.sh):
/// a malloc tunable in daemonset/ or the chart would make the deployment differ from the numbers.
#[test]
fn the_agent_runs_with_the_allocator_settings_it_was_measured_with() {
    let rendered = chart().render("latchkey", "latchkey", &helm::no_overrides());
    for (docs, what) in [(kustomize("."), "daemonset/"), (rendered, "the chart")] {
        let agent = container(find(&docs, "DaemonSet", "latchkey-node"), "latchkey");
        assert_eq!(env(agent, "GLIBC_TUNABLES"), Value::Null, "{what}");
    }
}

#[test]
fn chart_crds_are_the_generated_ones() {
    let generated = std::fs::read(repo().join("crds/latchkey-crds.yaml")).unwrap();
    let copy = std::fs::read(repo().join("daemonset/chart/crds/latchkey-crds.yaml")).unwrap();
    assert!(
        generated == copy,
        "daemonset/chart/crds/latchkey-crds.yaml differs from crds/latchkey-crds.yaml: \
         cp crds/latchkey-crds.yaml daemonset/chart/crds/"
    );
}

/// Every value of values.yaml, changed. `metrics.enabled` is checked by its own render below:
/// turned off, the ports it would move disappear.
fn changed_values() -> Value {
    json!({
        "image": {"repository": "registry.example/lk", "tag": "9.9.9-test", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "logLevel": "info,latchkey=debug",
        "logFormat": "text",
        "providers": ["vault", "aws"],
        "metrics": {"enabled": true, "port": 19808, "controllerPort": 19809,
                    "scrapeAnnotations": false,
                    "serviceMonitor": {"enabled": true, "interval": "15s",
                                       "labels": {"release": "prom"}},
                    "podMonitor": {"enabled": true, "interval": "20s",
                                   "labels": {"release": "prom-pods"}}},
        "tokenRequests": [{"audience": "vault", "expirationSeconds": 3600}],
        "node": {
            "kubeletDir": "/var/snap/microk8s/common/var/lib/kubelet",
            "pluginSocketDir": "/run/secret-plugins",
            "secretsStoreProviderDir": "/etc/kubernetes/secrets-store-csi-providers",
            "priorityClassName": "node-prio",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "secrets",
                             "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "pool", "operator": "In", "values": ["a"]}]}]}}},
            "volumeBudget": "96Mi",
            "namespaceVolumeShare": "0.25",
            "resources": {"requests": {"cpu": "21m", "memory": "41Mi"},
                          "limits": {"memory": "201Mi"}},
            "extraArgs": ["--volume-size-limit=8Mi"],
            "podAnnotations": {"example.com/owner": "node-team"},
            "podLabels": {"team": "node"},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        },
        "sidecars": {
            "nodeDriverRegistrar": {
                "image": {"repository": "mirror.example/registrar", "tag": "v0.0.1",
                          "pullPolicy": "Always"},
                "resources": {"requests": {"cpu": "6m", "memory": "11Mi"},
                              "limits": {"memory": "33Mi"}},
            },
            "livenessProbe": {
                "image": {"repository": "mirror.example/probe", "tag": "v0.0.2",
                          "pullPolicy": "Never"},
                "port": 19810,
                "resources": {"requests": {"cpu": "7m", "memory": "12Mi"},
                              "limits": {"memory": "34Mi"}},
            },
        },
        "controller": {
            "enabled": true,
            "replicas": 3,
            "leaderElect": false,
            "namespaces": ["shop", "billing"],
            "selector": "team in (a, b)",
            "priorityClassName": "ctrl-prio",
            "nodeSelector": {"pool": "system"},
            "tolerations": [{"key": "ctrl", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                 "labelSelector": {"matchLabels": {"team": "secrets"}}}}]}},
            "resources": {"requests": {"cpu": "22m", "memory": "42Mi"},
                          "limits": {"memory": "202Mi"}},
            "extraArgs": ["--dry-run"],
            "podAnnotations": {"example.com/owner": "ctrl-team"},
            "podLabels": {"team": "ctrl"},
            "updateStrategy": {"type": "Recreate"},
            "extraEnv": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        },
    })
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

fn env(c: &Value, name: &str) -> Value {
    c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].clone())
        .unwrap_or(Value::Null)
}

fn port(c: &Value, name: &str) -> Value {
    c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .map(|p| p["containerPort"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn every_changed_value_lands_where_it_belongs() {
    let chart = chart();
    let v = changed_values();
    // The overrides must really change every value, or a value could go unchecked.
    let mut merged = chart.values().clone();
    helm::merge(&mut merged, &v);
    for path in helm::leaf_paths(chart.values()) {
        let pointer = format!("/{}", path.replace('.', "/"));
        if path == "metrics.enabled" {
            continue;
        }
        assert_ne!(
            chart.values().pointer(&pointer),
            merged.pointer(&pointer),
            "changed_values() leaves {path} at its default"
        );
    }

    let ns = "secrets-system";
    let docs = chart.render("lk", ns, &v);
    let ds = find(&docs, "DaemonSet", "latchkey-node");
    let deploy = find(&docs, "Deployment", "latchkey-controller");
    let agent = container(ds, "latchkey");
    let controller = container(deploy, "latchkey");
    let registrar = container(ds, "node-driver-registrar");
    let probe = container(ds, "liveness-probe");
    let (ds_pod, deploy_pod) = (&ds["spec"]["template"], &deploy["spec"]["template"]);

    // Namespace handling: everything namespaced is in the release's namespace, except the
    // controller's write RoleBindings, which are in the namespaces it serves.
    for doc in &docs {
        let Some(doc_ns) = doc["metadata"]["namespace"].as_str() else {
            continue;
        };
        let write_binding =
            doc["kind"] == "RoleBinding" && doc["metadata"]["name"] == "latchkey-controller-write";
        if !write_binding {
            assert_eq!(doc_ns, ns, "{}", key(doc));
        }
        for s in doc["subjects"].as_array().into_iter().flatten() {
            assert_eq!(s["namespace"], ns, "{}", key(doc));
        }
    }

    // providers: just these kinds' CRDs (both scopes), in any order.
    let provider_crds: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| str_at(d, "/metadata/name"))
        .filter(|n| n.contains("providers.latchkey.dev"))
        .collect();
    assert_eq!(provider_crds.len(), 4, "{provider_crds:?}");
    assert!(
        provider_crds
            .iter()
            .all(|n| n.starts_with("vaults.") || n.starts_with("awses.") || n.starts_with("aws.")),
        "{provider_crds:?}"
    );

    // image
    for c in [agent, controller] {
        assert_eq!(c["image"], "registry.example/lk:9.9.9-test");
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(env(c, "RUST_LOG"), "info,latchkey=debug");
        assert!(args(c).contains(&"--log-format=text"), "{:?}", args(c));
    }
    for (pod, part) in [(ds_pod, "node"), (deploy_pod, "controller")] {
        assert_eq!(
            pod["spec"]["imagePullSecrets"],
            json!([{"name": "regcred"}])
        );
        // metrics.scrapeAnnotations=false: no prometheus.io/* annotation, only the pod's own.
        assert_eq!(
            pod["metadata"]["annotations"], v[part]["podAnnotations"],
            "{pod}"
        );
        // podLabels beside the selector's label, which stays.
        let mut labels = v[part]["podLabels"].clone();
        labels["app.kubernetes.io/name"] = json!(format!("latchkey-{part}"));
        assert_eq!(pod["metadata"]["labels"], labels, "{part}.podLabels");
    }
    // extraEnv: after the chart's own variables, which stay.
    for (c, part) in [(agent, "node"), (controller, "controller")] {
        let extra = &v[part]["extraEnv"][0];
        assert_eq!(
            c["env"].as_array().unwrap().last(),
            Some(extra),
            "{part}.extraEnv"
        );
        assert_eq!(env(c, "RUST_LOG"), "info,latchkey=debug");
    }
    // updateStrategy: the DaemonSet's updateStrategy, the Deployment's strategy.
    assert_eq!(ds["spec"]["updateStrategy"], v["node"]["updateStrategy"]);
    assert_eq!(
        deploy["spec"]["strategy"],
        v["controller"]["updateStrategy"]
    );

    // metrics.serviceMonitor and .podMonitor: one headless Service per workload, and monitors
    // that select both pods' `metrics` port.
    for (name, port) in [
        ("latchkey-node-metrics", 19808),
        ("latchkey-controller-metrics", 19809),
    ] {
        let svc = find(&docs, "Service", name);
        assert_eq!(svc["spec"]["clusterIP"], "None", "{name}");
        assert_eq!(svc["spec"]["ports"][0]["port"], port, "{name}");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics", "{name}");
        let selected = &svc["spec"]["selector"]["app.kubernetes.io/name"];
        assert_eq!(
            &svc["metadata"]["labels"]["app.kubernetes.io/name"],
            selected
        );
    }
    for (kind, part, endpoints) in [
        ("ServiceMonitor", "serviceMonitor", "endpoints"),
        ("PodMonitor", "podMonitor", "podMetricsEndpoints"),
    ] {
        let m = find(&docs, kind, "latchkey");
        assert_eq!(
            m["metadata"]["labels"], v["metrics"][part]["labels"],
            "{kind}"
        );
        let e = &m["spec"][endpoints][0];
        assert_eq!(e["port"], "metrics", "{kind}");
        assert_eq!(e["interval"], v["metrics"][part]["interval"], "{kind}");
        assert_eq!(
            m["spec"]["selector"]["matchExpressions"][0]["values"],
            json!(["latchkey-node", "latchkey-controller"]),
            "{kind}"
        );
    }

    // metrics ports
    assert!(args(agent).contains(&"--metrics-addr=:19808"));
    assert_eq!(port(agent, "metrics"), 19808);
    assert!(args(controller).contains(&"--metrics-addr=:19809"));
    assert_eq!(port(controller, "metrics"), 19809);

    // tokenRequests
    let driver = find(&docs, "CSIDriver", "csi.latchkey.dev");
    assert_eq!(driver["spec"]["tokenRequests"], v["tokenRequests"]);

    // node
    let kubelet = "/var/snap/microk8s/common/var/lib/kubelet";
    let paths: Vec<&str> = ds_pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vol| vol["hostPath"]["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            format!("{kubelet}/plugins/csi.latchkey.dev"),
            format!("{kubelet}/pods"),
            format!("{kubelet}/plugins_registry"),
            "/run/secret-plugins".to_string(),
            "/etc/kubernetes/secrets-store-csi-providers".to_string(),
        ]
    );
    // Plugin sockets: the flag, the mount and the host path name the same directory.
    assert!(args(agent).contains(&"--plugin-socket-dir=/run/secret-plugins"));
    let plugins_mount = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "plugins-dir")
        .unwrap();
    assert_eq!(plugins_mount["mountPath"], "/run/secret-plugins");
    assert_eq!(plugins_mount["readOnly"], true);
    // Secrets Store CSI Driver providers: the same, for their directory.
    assert!(
        args(agent)
            .contains(&"--secrets-store-provider-dir=/etc/kubernetes/secrets-store-csi-providers")
    );
    let providers_mount = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "secrets-store-providers-dir")
        .unwrap();
    assert_eq!(
        providers_mount["mountPath"],
        "/etc/kubernetes/secrets-store-csi-providers"
    );
    assert_eq!(providers_mount["readOnly"], true);
    // The agent mounts at the path kubelet names on the host, so the two must be the same.
    let pods_mount = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "pods-dir")
        .unwrap();
    assert_eq!(pods_mount["mountPath"], format!("{kubelet}/pods"));
    assert!(
        args(registrar).contains(
            &format!("--kubelet-registration-path={kubelet}/plugins/csi.latchkey.dev/csi.sock")
                .as_str()
        )
    );
    let node = &v["node"];
    for field in [
        "priorityClassName",
        "nodeSelector",
        "tolerations",
        "affinity",
    ] {
        assert_eq!(ds_pod["spec"][field], node[field], "node.{field}");
    }
    assert_eq!(agent["resources"], node["resources"]);
    assert_eq!(args(agent).last(), Some(&"--volume-size-limit=8Mi"));
    for arg in ["--volume-budget=96Mi", "--namespace-volume-share=0.25"] {
        assert!(args(agent).contains(&arg), "{arg}: {:?}", args(agent));
    }

    // sidecars
    assert_eq!(registrar["image"], "mirror.example/registrar:v0.0.1");
    assert_eq!(registrar["imagePullPolicy"], "Always");
    assert_eq!(
        registrar["resources"],
        v["sidecars"]["nodeDriverRegistrar"]["resources"]
    );
    assert_eq!(probe["image"], "mirror.example/probe:v0.0.2");
    assert_eq!(probe["imagePullPolicy"], "Never");
    assert_eq!(
        probe["resources"],
        v["sidecars"]["livenessProbe"]["resources"]
    );
    assert!(args(probe).contains(&"--http-endpoint=:19810"));
    assert_eq!(port(agent, "healthz"), 19810);

    // controller
    let ctl = &v["controller"];
    assert_eq!(deploy["spec"]["replicas"], 3);
    let a = args(controller);
    for want in [
        "--namespace=shop",
        "--namespace=billing",
        "--leader-elect=false",
    ] {
        assert!(a.contains(&want), "{want} missing: {a:?}");
    }
    assert!(
        a.windows(2).any(|w| w == ["--selector", "team in (a, b)"]),
        "{a:?}"
    );
    assert_eq!(a.last(), Some(&"--dry-run"));
    for field in [
        "priorityClassName",
        "nodeSelector",
        "tolerations",
        "affinity",
    ] {
        assert_eq!(deploy_pod["spec"][field], ctl[field], "controller.{field}");
    }
    assert_eq!(controller["resources"], ctl["resources"]);
    // controller.namespaces binds the write role there only.
    let write_bindings: Vec<String> = docs
        .iter()
        .filter(|d| d["roleRef"]["name"] == "latchkey-controller-write")
        .map(|d| format!("{} {}", d["kind"], str_at(d, "/metadata/namespace")))
        .collect();
    assert_eq!(
        write_bindings,
        ["\"RoleBinding\" shop", "\"RoleBinding\" billing"]
    );

    // metrics.enabled=false: no metrics endpoint, nor what points at it.
    let off = chart.render(
        "lk",
        ns,
        &json!({"controller": {"enabled": true},
                "metrics": {"enabled": false, "serviceMonitor": {"enabled": true},
                            "podMonitor": {"enabled": true}}}),
    );
    for kind in ["Service", "ServiceMonitor", "PodMonitor"] {
        assert!(
            off.iter().all(|d| d["kind"] != kind),
            "{kind} without metrics"
        );
    }
    for (kind, name) in [
        ("DaemonSet", "latchkey-node"),
        ("Deployment", "latchkey-controller"),
    ] {
        let w = find(&off, kind, name);
        let c = container(w, "latchkey");
        assert!(args(c).contains(&"--metrics-addr=none"), "{kind}");
        assert_eq!(port(c, "metrics"), Value::Null, "{kind}");
        assert!(c.get("readinessProbe").is_none(), "{kind}");
        assert!(
            w["spec"]["template"]["metadata"]
                .get("annotations")
                .is_none()
        );
    }
    // The node agent's liveness does not depend on metrics: it goes through the sidecar.
    let ds_off = find(&off, "DaemonSet", "latchkey-node");
    assert_eq!(
        container(ds_off, "latchkey")["livenessProbe"]["httpGet"]["port"],
        "healthz"
    );

    // podAnnotations beside the scrape annotations, when both are on.
    let both = chart.render(
        "lk",
        ns,
        &json!({"controller": {"enabled": true, "podAnnotations": {"b": "2"}},
                "node": {"podAnnotations": {"a": "1"}}}),
    );
    for (kind, name, own, port) in [
        ("DaemonSet", "latchkey-node", ("a", "1"), "9808"),
        ("Deployment", "latchkey-controller", ("b", "2"), "9809"),
    ] {
        let annotations = &find(&both, kind, name)["spec"]["template"]["metadata"]["annotations"];
        assert_eq!(annotations[own.0], own.1, "{kind}");
        assert_eq!(annotations["prometheus.io/port"], port, "{kind}");
    }
}

/// A value no template reads is a knob that does nothing.
#[test]
fn every_value_is_used_by_a_template() {
    let chart = chart();
    let texts: Vec<&str> = chart.template_texts().collect();
    let used_whole = |path: &str| {
        let needle = format!(".Values.{path}");
        texts.iter().any(|t| {
            t.match_indices(&needle).any(|(i, _)| {
                let next = t[i + needle.len()..].chars().next().unwrap_or(' ');
                !(next.is_alphanumeric() || next == '_' || next == '.')
            })
        })
    };
    let leaves = helm::leaf_paths(chart.values());
    assert!(leaves.len() > 30, "{leaves:?}");
    for leaf in leaves {
        let parts: Vec<&str> = leaf.split('.').collect();
        // The value itself, or a map holding it that a template uses whole (toYaml, with).
        let used = (1..=parts.len()).any(|n| used_whole(&parts[..n].join(".")));
        assert!(used, "values.yaml: {leaf} is used by no template");
    }
}

/// The DaemonSet is privileged: a namespace where Pod Security Admission enforces baseline (a
/// common cluster default) refuses its pods, so the Namespace kustomize creates admits them.
#[test]
fn the_namespace_admits_the_privileged_agent() {
    for dir in [".", "with-mirror"] {
        let docs = kustomize(dir);
        let ns = find(&docs, "Namespace", "latchkey");
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
            "daemonset/{dir}"
        );
        let ds = find(&docs, "DaemonSet", "latchkey-node");
        assert_eq!(ds["metadata"]["namespace"], "latchkey", "daemonset/{dir}");
        assert_eq!(
            container(ds, "latchkey")["securityContext"]["privileged"],
            true
        );
    }
}

/// By default the controller's replicas prefer different nodes, so losing one node does not
/// take both; preferred, not required, so a one-node cluster still runs two.
#[test]
fn controller_replicas_prefer_different_nodes() {
    let rendered = chart().render("lk", "lk", &json!({"controller": {"enabled": true}}));
    for (docs, what) in [
        (kustomize("with-mirror"), "daemonset/with-mirror"),
        (rendered, "the chart"),
    ] {
        let pod = &find(&docs, "Deployment", "latchkey-controller")["spec"]["template"];
        let anti = &pod["spec"]["affinity"]["podAntiAffinity"];
        assert!(
            anti.get("requiredDuringSchedulingIgnoredDuringExecution")
                .is_none(),
            "{what}"
        );
        let terms = anti["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no preferred anti-affinity"));
        assert_eq!(terms.len(), 1, "{what}");
        let term = &terms[0]["podAffinityTerm"];
        assert_eq!(term["topologyKey"], "kubernetes.io/hostname", "{what}");
        // It selects the replicas themselves.
        assert_eq!(
            term["labelSelector"]["matchLabels"], pod["metadata"]["labels"],
            "{what}"
        );
    }
}

/// The egress example selects the controller's pods and only them, in their namespace, and lets
/// DNS through: a policy that selected nothing would look applied and do nothing, and one
/// without DNS would cut the controller off everything.
#[test]
fn the_egress_example_applies_to_the_controller() {
    let policies = kustomize("components/controller-egress");
    let policy = find(&policies, "NetworkPolicy", "latchkey-controller-egress");
    let docs = kustomize("with-mirror");
    let controller = find(&docs, "Deployment", "latchkey-controller");
    let node = find(&docs, "DaemonSet", "latchkey-node");
    let selector = policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    let selects = |w: &Value| {
        selector
            .iter()
            .all(|(k, v)| w["spec"]["template"]["metadata"]["labels"][k] == *v)
    };
    assert!(selects(controller) && !selects(node));
    assert_eq!(
        policy["metadata"]["namespace"],
        controller["metadata"]["namespace"]
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Egress"]));
    let dns = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_array().into_iter().flatten())
        .any(|p| p["port"] == 53 && p["protocol"] == "UDP");
    assert!(dns, "no DNS egress: {policy}");
}

// ---- every manifest is a valid object of its type ----

/// Deserializes `doc` as `T`, refusing fields `T` does not have (a misspelt field is otherwise
/// dropped silently by the API server's decoder for typed clients, and by kubectl's only with a
/// warning).
fn strict<T: serde::de::DeserializeOwned>(doc: &Value) -> Result<(), String> {
    let mut unknown = Vec::new();
    let parsed: Result<T, _> =
        serde_ignored::deserialize(doc.clone(), |path| unknown.push(path.to_string()));
    parsed.map_err(|e| e.to_string())?;
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!("unknown fields {unknown:?}"))
    }
}

fn check_typed(doc: &Value, origin: &str) {
    let api = str_at(doc, "/apiVersion");
    let kind = str_at(doc, "/kind");
    let result = match (api, kind) {
        ("apps/v1", "DaemonSet") => strict::<DaemonSet>(doc),
        ("apps/v1", "Deployment") => strict::<Deployment>(doc),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(doc),
        ("v1", "Namespace") => strict::<Namespace>(doc),
        ("v1", "Pod") => strict::<Pod>(doc),
        ("v1", "Secret") => strict::<Secret>(doc),
        ("v1", "Service") => strict::<Service>(doc),
        ("networking.k8s.io/v1", "NetworkPolicy") => strict::<NetworkPolicy>(doc),
        ("monitoring.coreos.com/v1", "ServiceMonitor" | "PodMonitor") => strict::<Monitor>(doc)
            .and_then(|()| {
                let field = match kind {
                    "ServiceMonitor" => "endpoints",
                    _ => "podMetricsEndpoints",
                };
                doc["spec"][field]
                    .as_array()
                    .is_some_and(|e| !e.is_empty())
                    .then_some(())
                    .ok_or(format!("a {kind} without spec.{field}"))
            }),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => strict::<ClusterRoleBinding>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(doc),
        ("storage.k8s.io/v1", "CSIDriver") => strict::<CSIDriver>(doc),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(doc),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            strict::<CustomResourceDefinition>(doc)
        }
        // The agent's own loader, which refuses unknown fields (see also
        // every_example_document_loads_strictly in agent/src/catalog/manifests/tests.rs).
        ("latchkey.dev/v1alpha1" | "generators.latchkey.dev/v1alpha1", _) => {
            latchkey::catalog::ManifestCatalog::default()
                .add_documents(Path::new(origin), &serde_norway::to_string(doc).unwrap())
                .map_err(|e| e.to_string())
        }
        _ => Err(format!("unknown kind {api} {kind}: add it to check_typed")),
    };
    if let Err(e) = result {
        panic!("{origin}: {}: {e}", key(doc));
    }
}

/// The fields of the Prometheus Operator's ServiceMonitor and PodMonitor the chart uses (there is
/// no typed crate for them here): any other is a typo.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // read by serde only
struct Monitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: MonitorSpec,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct MonitorSpec {
    selector: LabelSelector,
    endpoints: Option<Vec<MetricsEndpoint>>,
    pod_metrics_endpoints: Option<Vec<MetricsEndpoint>>,
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct MetricsEndpoint {
    port: String,
    path: Option<String>,
    interval: Option<String>,
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

/// Every directory of daemonset/ holding a kustomization.yaml, relative to daemonset/.
fn kustomize_dirs() -> Vec<String> {
    let mut files = Vec::new();
    yaml_files(&repo().join("daemonset"), &mut files);
    let root = repo().join("daemonset");
    let mut dirs: Vec<String> = files
        .iter()
        .filter(|p| p.file_name().unwrap() == "kustomization.yaml")
        .map(|p| {
            let dir = p.parent().unwrap().strip_prefix(&root).unwrap();
            let dir = dir.to_str().unwrap();
            if dir.is_empty() {
                ".".into()
            } else {
                dir.into()
            }
        })
        .collect();
    dirs.sort();
    for want in [
        ".",
        "with-mirror",
        "components/mirror",
        "components/controller-egress",
    ] {
        assert!(
            dirs.iter().any(|d| d == want),
            "no daemonset/{want}: {dirs:?}"
        );
    }
    dirs
}

#[test]
fn every_manifest_is_a_valid_kubernetes_object() {
    let mut checked = 0;
    let mut check_all = |docs: &[Value], origin: &str| {
        assert!(!docs.is_empty(), "{origin}: no documents");
        for doc in docs {
            check_typed(doc, origin);
            checked += 1;
        }
    };
    // daemonset/ as applied: its files are kustomize inputs, the outputs are what must be valid.
    // Every overlay and component renders on its own.
    for dir in kustomize_dirs() {
        check_all(
            &kustomize(&dir),
            &format!("kubectl kustomize daemonset/{dir}"),
        );
    }
    let mut files = Vec::new();
    yaml_files(&repo().join("examples"), &mut files);
    files.push(repo().join("crds/latchkey-crds.yaml"));
    let mut providers = Vec::new();
    yaml_files(&repo().join("crds/providers"), &mut providers);
    providers.retain(|p| p.ends_with("crds.yaml"));
    assert_eq!(providers.len(), 6, "{providers:?}");
    files.extend(providers);
    for path in files {
        let docs = yaml_documents(&std::fs::read_to_string(&path).unwrap());
        check_all(&docs, &path.display().to_string());
    }
    let chart = chart();
    for (what, overrides) in [
        ("defaults", helm::no_overrides()),
        (
            "controller.enabled=true",
            json!({"controller": {"enabled": true}}),
        ),
        ("changed values", changed_values()),
    ] {
        check_all(
            &chart.render("lk", "lk", &overrides),
            &format!("chart, {what}"),
        );
    }
    assert!(checked > 50, "only {checked} documents checked");
}

// ---- RBAC: Secret permissions stay where the design puts them ----

/// `(role name, verb)` of every ClusterRole and Role rule on core Secrets, with the kind.
fn secret_grants(docs: &[Value]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for role in docs
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
    {
        for rule in role["rules"].as_array().unwrap() {
            let has = |field: &str, want: &str| {
                rule[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| v == want || v == "*")
            };
            if has("apiGroups", "") && has("resources", "secrets") {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.push((
                        str_at(role, "/kind").into(),
                        str_at(role, "/metadata/name").into(),
                        verb.as_str().unwrap().into(),
                    ));
                }
            }
        }
    }
    out
}

fn is_read(verb: &str) -> bool {
    matches!(verb, "get" | "list" | "watch")
}

#[test]
fn chart_keeps_secret_permissions_where_the_design_puts_them() {
    let chart = chart();
    let mount_only = chart.render("lk", "lk", &helm::no_overrides());
    let with_mirror = chart.render("lk", "lk", &json!({"controller": {"enabled": true}}));
    let narrowed = chart.render("lk", "lk", &changed_values());
    // Without the controller: only the node agent's Role, and only `get` in its own namespace.
    let grants = secret_grants(&mount_only);
    assert_eq!(
        grants,
        [(
            "Role".into(),
            "latchkey-node-credentials".into(),
            "get".into()
        )],
        "mount-only"
    );
    let node_role = find(&mount_only, "Role", "latchkey-node-credentials");
    assert_eq!(node_role["metadata"]["namespace"], "lk");
    for docs in [&with_mirror, &narrowed] {
        let grants = secret_grants(docs);
        for (kind, name, verb) in &grants {
            // The node agent never has Secret access beyond that Role, whatever the values.
            if name.starts_with("latchkey-node") {
                assert_eq!(
                    (kind.as_str(), name.as_str(), verb.as_str()),
                    ("Role", "latchkey-node-credentials", "get")
                );
            }
            // Secret writes exist only in the mirror controller's roles.
            if !is_read(verb) {
                assert!(
                    name.starts_with("latchkey-controller"),
                    "{kind} {name}: {verb}"
                );
            }
        }
        for verb in ["create", "patch", "delete"] {
            assert!(
                grants.iter().any(|(_, _, v)| v == verb),
                "controller lacks {verb}: {grants:?}"
            );
        }
    }
    // The same invariant on the kustomize side is tests/mirror.rs's
    // secret_permissions_stay_where_the_design_puts_them.
}

// ---- RBAC: generators ----

const GENERATOR_KINDS: [&str; 4] = [
    "passwords",
    "vaultdynamicsecrets",
    "plugingenerators",
    "clustergenerators",
];

/// Verbs on each resource of the generators group, over the named ClusterRoles and Roles.
fn generator_grants(docs: &[Value], roles: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for role in docs.iter().filter(|d| {
        matches!(d["kind"].as_str(), Some("ClusterRole" | "Role"))
            && roles.contains(&str_at(d, "/metadata/name"))
    }) {
        for rule in role["rules"].as_array().unwrap() {
            let groups = rule["apiGroups"].as_array().unwrap();
            if !groups
                .iter()
                .any(|g| g == "generators.latchkey.dev" || g == "*")
            {
                continue;
            }
            for resource in rule["resources"].as_array().unwrap() {
                let verbs = out.entry(resource.as_str().unwrap().into()).or_default();
                for verb in rule["verbs"].as_array().unwrap() {
                    verbs.push(verb.as_str().unwrap().into());
                }
                verbs.sort();
                verbs.dedup();
            }
        }
    }
    out
}

fn grants(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(resource, verbs)| {
            let mut verbs: Vec<String> = verbs.iter().map(|v| v.to_string()).collect();
            verbs.sort();
            (resource.to_string(), verbs)
        })
        .collect()
}

/// The node agent reads generators and records the states of what it generates for the pods it
/// mounts; the controller reads both, and records, changes or deletes states (mirror
/// generations, Cleanup, finalizer, GC) only where its write role is bound. Neither writes a generator: those are the tenants'.
#[test]
fn generator_permissions_are_what_each_part_needs() {
    let chart = chart();
    let mut node_want: Vec<(&str, &[&str])> =
        GENERATOR_KINDS.iter().map(|k| (*k, &["get"][..])).collect();
    node_want.push((
        "generatorstates",
        &["create", "get", "list", "watch", "patch", "delete"],
    ));
    let node_want = grants(&node_want);
    let mut read_want: Vec<(&str, &[&str])> =
        GENERATOR_KINDS.iter().map(|k| (*k, &["get"][..])).collect();
    read_want.push(("generatorstates", &["get", "list", "watch"]));
    let read_want = grants(&read_want);
    // `create`: the mirror records a state per generation (agent/src/mirror/generated.rs).
    let write_want = grants(&[("generatorstates", &["create", "patch", "update", "delete"])]);
    let controller = ["latchkey-controller-read", "latchkey-controller-write"];
    for (docs, what) in [
        (kustomize("."), "daemonset/"),
        (kustomize("with-mirror"), "daemonset/with-mirror"),
        (chart.render("lk", "lk", &helm::no_overrides()), "the chart"),
        (
            chart.render("lk", "lk", &json!({"controller": {"enabled": true}})),
            "the chart with the controller",
        ),
    ] {
        assert_eq!(
            generator_grants(&docs, &["latchkey-node"]),
            node_want,
            "{what}: node agent"
        );
        let with_controller = docs.iter().any(|d| d["kind"] == "Deployment");
        if with_controller {
            assert_eq!(
                generator_grants(&docs, &controller[..1]),
                read_want,
                "{what}: controller, cluster-wide"
            );
            assert_eq!(
                generator_grants(&docs, &controller[1..]),
                write_want,
                "{what}: controller, where it writes"
            );
        }
        // No other role touches the generators group.
        let every: Vec<&str> = docs
            .iter()
            .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
            .map(|d| str_at(d, "/metadata/name"))
            .filter(|n| *n != "latchkey-node" && !controller.contains(n))
            .collect();
        assert!(generator_grants(&docs, &every).is_empty(), "{what}");
    }
}

// ---- RBAC: ClusterExternalSecrets ----

/// Verbs on the ExternalSecret kinds of `latchkey.dev`, over the named ClusterRoles and Roles.
fn external_secret_grants(docs: &[Value], roles: &[&str]) -> BTreeMap<String, Vec<String>> {
    latchkey_grants(docs, roles, "externalsecrets")
}

/// The verbs `roles` grant on latchkey.dev resources whose name contains `needle`.
fn latchkey_grants(docs: &[Value], roles: &[&str], needle: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for role in docs.iter().filter(|d| {
        matches!(d["kind"].as_str(), Some("ClusterRole" | "Role"))
            && roles.contains(&str_at(d, "/metadata/name"))
    }) {
        for rule in role["rules"].as_array().unwrap() {
            let groups = rule["apiGroups"].as_array().unwrap();
            if !groups.iter().any(|g| g == "latchkey.dev" || g == "*") {
                continue;
            }
            for resource in rule["resources"].as_array().unwrap() {
                let resource = resource.as_str().unwrap();
                if !resource.contains(needle) {
                    continue;
                }
                let verbs = out.entry(resource.into()).or_default();
                for verb in rule["verbs"].as_array().unwrap() {
                    verbs.push(verb.as_str().unwrap().into());
                }
                verbs.sort();
                verbs.dedup();
            }
        }
    }
    out
}

/// The controller reads ClusterExternalSecrets cluster-wide and writes only their status (and
/// the finalizers subresource blockOwnerDeletion needs), never their spec: only cluster admins
/// write those. It writes ExternalSecrets only where its write role is bound. The node agent
/// never sees a ClusterExternalSecret.
#[test]
fn cluster_external_secret_permissions_are_what_the_controller_needs() {
    let chart = chart();
    for (docs, what) in [
        (kustomize("with-mirror"), "daemonset/with-mirror"),
        (
            chart.render("lk", "lk", &json!({"controller": {"enabled": true}})),
            "the chart with the controller",
        ),
    ] {
        let read = external_secret_grants(&docs, &["latchkey-controller-read"]);
        assert_eq!(
            read["clusterexternalsecrets"],
            ["get", "list", "watch"],
            "{what}"
        );
        assert_eq!(read["externalsecrets"], ["get", "list", "watch"], "{what}");
        assert_eq!(
            external_secret_grants(&docs, &["latchkey-controller-cluster-external-secrets"]),
            grants(&[
                ("clusterexternalsecrets/status", &["patch", "update"]),
                ("clusterexternalsecrets/finalizers", &["update"]),
            ]),
            "{what}"
        );
        let write = external_secret_grants(&docs, &["latchkey-controller-write"]);
        assert_eq!(
            write["externalsecrets"],
            ["create", "delete", "patch"],
            "{what}"
        );
        assert!(!write.contains_key("clusterexternalsecrets"), "{what}");
        let node = external_secret_grants(&docs, &["latchkey-node"]);
        assert!(
            node.keys()
                .all(|r| !r.starts_with("clusterexternalsecrets")),
            "{what}: {node:?}"
        );
    }
}

/// The controller reads PushSecrets, writes their status and its finalizer (a patch of
/// metadata.finalizers, and the finalizers subresource), never creates or deletes them; the node
/// agent never sees one.
#[test]
fn push_secret_permissions_are_what_the_controller_needs() {
    let chart = chart();
    for (docs, what) in [
        (kustomize("with-mirror"), "daemonset/with-mirror"),
        (
            chart.render("lk", "lk", &json!({"controller": {"enabled": true}})),
            "the chart with the controller",
        ),
    ] {
        let read = latchkey_grants(&docs, &["latchkey-controller-read"], "pushsecrets");
        assert_eq!(
            read,
            grants(&[("pushsecrets", &["get", "list", "watch"])]),
            "{what}"
        );
        let write = latchkey_grants(&docs, &["latchkey-controller-write"], "pushsecrets");
        assert_eq!(
            write,
            grants(&[
                ("pushsecrets", &["patch"]),
                ("pushsecrets/finalizers", &["update"]),
                ("pushsecrets/status", &["patch", "update"]),
            ]),
            "{what}"
        );
        let node = latchkey_grants(&docs, &["latchkey-node"], "pushsecrets");
        assert!(node.is_empty(), "{what}: {node:?}");
    }
}

/// The controller reads provider objects and patches only their status (the `Ready` condition,
/// agent/src/provider_status): cluster-scoped ones cluster-wide, namespaced ones where its write
/// role is bound. The node agent only reads them.
#[test]
fn provider_status_permissions_are_status_only() {
    use latchkey::api::provider_kinds::{CLUSTER_PROVIDER_GROUP, PROVIDER_GROUP, ProviderKind};
    let status: Vec<(String, &[&str])> = ProviderKind::ALL
        .iter()
        .map(|k| (format!("{}/status", k.plural()), &["patch"][..]))
        .collect();
    let status: Vec<(&str, &[&str])> = status.iter().map(|(r, v)| (r.as_str(), *v)).collect();
    let status = grants(&status);
    let chart = chart();
    for (docs, what) in [
        (kustomize("with-mirror"), "daemonset/with-mirror"),
        (
            chart.render("lk", "lk", &json!({"controller": {"enabled": true}})),
            "the chart with the controller",
        ),
    ] {
        assert_eq!(
            group_grants(
                &docs,
                &["latchkey-controller-cluster-store-status"],
                CLUSTER_PROVIDER_GROUP
            ),
            status,
            "{what}"
        );
        assert_eq!(
            group_grants(&docs, &["latchkey-controller-write"], PROVIDER_GROUP),
            status,
            "{what}"
        );
        // Namespaced objects' status only where the write role is bound; cluster-scoped ones'
        // cluster-wide, as for ClusterSecretStores.
        assert!(
            group_grants(
                &docs,
                &["latchkey-controller-write"],
                CLUSTER_PROVIDER_GROUP
            )
            .is_empty(),
            "{what}"
        );
    }
}

// ---- one version of the image ----

#[test]
fn the_image_has_one_version_everywhere() {
    let version = env!("CARGO_PKG_VERSION");
    let chart = chart();
    assert_eq!(
        chart.meta()["appVersion"],
        version,
        "daemonset/chart/Chart.yaml appVersion vs agent/Cargo.toml"
    );
    let mut kustomizations = Vec::new();
    yaml_files(&repo().join("daemonset"), &mut kustomizations);
    let mut tags = 0;
    for path in kustomizations
        .iter()
        .filter(|p| p.file_name().unwrap() == "kustomization.yaml")
    {
        let doc = &yaml_documents(&std::fs::read_to_string(path).unwrap())[0];
        for image in doc["images"].as_array().into_iter().flatten() {
            if image["name"] == IMAGE {
                assert_eq!(image["newTag"], version, "{}", path.display());
                tags += 1;
            }
        }
    }
    assert!(tags >= 2, "no `images:` tag for {IMAGE} in daemonset/");

    let want = format!("{IMAGE}:{version}");
    let images = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .filter_map(|d| d.pointer("/spec/template/spec/containers"))
            .flat_map(|cs| cs.as_array().unwrap().iter())
            .map(|c| c["image"].as_str().unwrap().to_string())
            .filter(|i| i.starts_with(IMAGE))
            .collect()
    };
    for (what, docs) in [
        ("daemonset/with-mirror", kustomize("with-mirror")),
        (
            "the chart",
            chart.render("lk", "lk", &json!({"controller": {"enabled": true}})),
        ),
    ] {
        let found = images(&docs);
        assert_eq!(found, [want.clone(), want.clone()], "{what}");
    }
}

// ---- RBAC: provider kinds ----

/// Verbs on each resource of API group `group`, over the named ClusterRoles and Roles.
fn group_grants(docs: &[Value], roles: &[&str], group: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for role in docs.iter().filter(|d| {
        matches!(d["kind"].as_str(), Some("ClusterRole" | "Role"))
            && roles.contains(&str_at(d, "/metadata/name"))
    }) {
        for rule in role["rules"].as_array().unwrap() {
            let groups = rule["apiGroups"].as_array().unwrap();
            if !groups.iter().any(|g| g == group || g == "*") {
                continue;
            }
            for resource in rule["resources"].as_array().unwrap() {
                let verbs = out.entry(resource.as_str().unwrap().into()).or_default();
                for verb in rule["verbs"].as_array().unwrap() {
                    verbs.push(verb.as_str().unwrap().into());
                }
                verbs.sort();
                verbs.dedup();
            }
        }
    }
    out
}

/// The node agent and the controller watch the provider kinds (both groups) that stores name
/// by `spec.providerRef`, and write none; other roles touch only their status (the controller's
/// `Ready`, see `provider_status_permissions_are_status_only`).
#[test]
fn provider_kinds_are_read_by_the_agent_and_the_controller_only() {
    use latchkey::api::provider_kinds::{CLUSTER_PROVIDER_GROUP, PROVIDER_GROUP, ProviderKind};
    let want: Vec<(&str, &[&str])> = ProviderKind::ALL
        .iter()
        .map(|k| (k.plural(), &["get", "list", "watch"][..]))
        .collect();
    let want = grants(&want);
    let chart = chart();
    for (docs, what) in [
        (kustomize("."), "daemonset/"),
        (kustomize("with-mirror"), "daemonset/with-mirror"),
        (chart.render("lk", "lk", &helm::no_overrides()), "the chart"),
        (
            chart.render("lk", "lk", &json!({"controller": {"enabled": true}})),
            "the chart with the controller",
        ),
    ] {
        let with_controller = docs.iter().any(|d| d["kind"] == "Deployment");
        for group in [PROVIDER_GROUP, CLUSTER_PROVIDER_GROUP] {
            assert_eq!(
                group_grants(&docs, &["latchkey-node"], group),
                want,
                "{what}: node agent, {group}"
            );
            if with_controller {
                assert_eq!(
                    group_grants(&docs, &["latchkey-controller-read"], group),
                    want,
                    "{what}: controller, {group}"
                );
            }
            let others: Vec<&str> = docs
                .iter()
                .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
                .map(|d| str_at(d, "/metadata/name"))
                .filter(|n| !["latchkey-node", "latchkey-controller-read"].contains(n))
                .collect();
            let other = group_grants(&docs, &others, group);
            assert!(
                other
                    .iter()
                    .all(|(r, verbs)| r.ends_with("/status") && verbs == &["patch"]),
                "{what}: {group}: {other:?}"
            );
        }
    }
}

/// `to` as a path relative to the directory `from`.
fn relative_to(from: &Path, to: &Path) -> String {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = std::iter::repeat_n("..".to_string(), from.components().count() - common);
    let downs = to
        .components()
        .skip(common)
        .map(|c| c.as_os_str().to_str().unwrap().to_string());
    ups.chain(downs).collect::<Vec<_>>().join("/")
}

/// Names of the CustomResourceDefinitions among `docs`, sorted.
fn crd_names(docs: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| str_at(d, "/metadata/name").to_string())
        .collect();
    names.sort();
    names
}

/// The provider kinds' CRDs come one provider at a time: the chart's `providers` value and a
/// kustomize overlay listing the provider's Component install just those, beside the core CRDs,
/// and Helm keeps a provider CRD the value stops naming instead of deleting its objects.
#[test]
fn only_the_providers_asked_for_are_installed() {
    use latchkey::api::provider_kinds::ProviderKind;
    let core = crd_names(&kustomize("base"));
    assert_eq!(core.len(), 10, "{core:?}");
    assert!(core.iter().all(|n| !n.contains("providers.latchkey.dev")));
    let with = |kinds: &[ProviderKind]| {
        let mut names = core.clone();
        for k in kinds {
            names.extend([k.crd_name(false), k.crd_name(true)]);
        }
        names.sort();
        names
    };
    let chart = chart();
    let everything = chart.render("lk", "lk", &helm::no_overrides());
    assert_eq!(
        crd_names(&everything),
        with(&ProviderKind::ALL),
        "chart defaults"
    );
    assert_eq!(
        crd_names(&kustomize(".")),
        with(&ProviderKind::ALL),
        "daemonset/"
    );
    let only_vault = chart.render("latchkey", "latchkey", &json!({"providers": ["vault"]}));
    assert_eq!(
        crd_names(&only_vault),
        with(&[ProviderKind::Vault]),
        "providers=[vault]"
    );
    let none = chart.render("lk", "lk", &json!({"providers": []}));
    assert_eq!(crd_names(&none), core, "providers=[]");
    for crd in everything
        .iter()
        .filter(|d| str_at(d, "/metadata/name").contains("providers.latchkey.dev"))
    {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}",
            crd["metadata"]["name"]
        );
    }

    // A user's overlay: the base and one provider's Component, as daemonset/kustomization.yaml
    // says; it builds what the chart renders with providers=[vault].
    // kustomize takes only relative paths.
    let overlay = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let up = relative_to(overlay.path(), &repo());
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n- {up}/daemonset/base\ncomponents:\n- {up}/crds/providers/vault\n"
        ),
    )
    .unwrap();
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(overlay.path())
        .output()
        .expect("kubectl is required for the deploy tests");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = yaml_documents(std::str::from_utf8(&out.stdout).unwrap());
    assert_same_objects(
        &only_vault,
        &without_namespace_object(built),
        "providers=[vault] vs base + crds/providers/vault",
    );

    // values.schema.json refuses a provider name the chart has no template for, so a typo fails
    // `helm install` instead of installing nothing.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("daemonset/chart/values.schema.json")).unwrap(),
    )
    .unwrap();
    let allowed = &schema["properties"]["providers"]["items"]["enum"];
    let stems: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.file_stem()).collect();
    assert_eq!(allowed, &json!(stems));
    assert_eq!(
        chart.values()["providers"],
        json!(stems),
        "values.yaml default"
    );
}
