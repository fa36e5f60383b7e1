//! Prometheus metrics of the node agent. Labels are small closed sets (result, reason, provider,
//! operation): never a pod name, a key or anything unbounded, and never a value.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency buckets from 100 µs (a warm publish) to 10 s (a slow backend), in seconds.
const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// `result` and `reason` of a publish: `success` with `mounted` / `refreshed` / `unchanged` /
/// `refresh_failed`, or `error` with the gRPC code (`failed_precondition`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PublishLabels {
    /// `success` or `error`.
    pub result: &'static str,
    /// What happened, or the gRPC code.
    pub reason: &'static str,
}

/// A single `result` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// Outcome.
    pub result: &'static str,
}

/// A single `namespace` label: the namespaces of the pods with volumes on this node, a set
/// bounded by the cluster's namespaces.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    /// The pods' namespace.
    pub namespace: String,
}

/// Labels of a backend request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// Provider name (`fake`, `aws`, ...).
    pub provider: &'static str,
    /// Operation (`get`, `find`, `login`, ...).
    pub operation: &'static str,
    /// `success` or the error kind.
    pub result: &'static str,
}

/// A single `provider` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// Provider name.
    pub provider: &'static str,
}

/// A single `kind` label (a kind the catalog watches).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `ExternalSecret`, `SecretStore`, `ClusterSecretStore` or `Namespace`; a generator kind
    /// for the generator metrics.
    pub kind: &'static str,
}

/// Labels of a cleanup by the controller: the generator kind and how it ended (`cleaned`,
/// `no_state`, `retried`, `left_to_ttl`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GeneratorCleanupLabels {
    /// The generator kind, or `unknown`.
    pub kind: &'static str,
    /// How the attempt ended.
    pub result: &'static str,
}

/// Every metric the agent exports, registered once at start.
pub struct Metrics {
    registry: Registry,
    /// Publish latency by result and reason.
    pub publish_duration: Family<PublishLabels, Histogram>,
    /// Publishes by result.
    pub publishes: Family<ResultLabel, Counter>,
    /// Unpublishes by result.
    pub unpublishes: Family<ResultLabel, Counter>,
    /// Republishes of mounted volumes by result (`changed`, `unchanged`, `failed`).
    pub refreshes: Family<ResultLabel, Counter>,
    /// Volumes currently mounted.
    pub volumes_active: Gauge,
    /// Memory held in volumes (tmpfs pages and inodes) by the pods' namespace.
    pub volume_bytes: Family<NamespaceLabel, Gauge>,
    /// Backend requests by provider, operation and result.
    pub backend_requests: Family<BackendLabels, Counter>,
    /// Backend request latency by provider, operation and result.
    pub backend_duration: Family<BackendLabels, Histogram>,
    /// Values served from the cache.
    pub cache_hits: Counter,
    /// Values that had to be fetched.
    pub cache_misses: Counter,
    /// Fetches that joined one already in flight for the same key.
    pub cache_joins: Counter,
    /// Values dropped once stale for every reader that used them.
    pub cache_expired: Counter,
    /// Backend logins by provider.
    pub logins: Family<ProviderLabel, Counter>,
    /// Objects in the catalog that do not deserialize, by kind.
    pub catalog_unusable: Family<KindLabel, Gauge>,
    /// Mirror reconciles by result (`synced`, `unchanged`, `error`, `conflict`, `deleted`,
    /// `deferred`).
    pub mirror_syncs: Family<ResultLabel, Counter>,
    /// Mirror reconcile latency.
    pub mirror_sync_duration: Histogram,
    /// Mirror reconciles running now (the controller's work in progress).
    pub mirror_in_flight: Gauge,
    /// ExternalSecrets whose next reconcile is scheduled (the controller's queue).
    pub mirror_queued: Gauge,
    /// 1 while this mirror controller replica is the leader.
    pub mirror_leader: Gauge,
    /// Generated credentials with something to clean up (a lease, an account) that this
    /// process holds, by generator kind.
    pub generator_leases: Family<KindLabel, Gauge>,
    /// Cleanup attempts of GeneratorStates being deleted, by generator kind and result.
    pub generator_cleanups: Family<GeneratorCleanupLabels, Counter>,
    /// Generated credentials whose state was released without cleanup (they end by their TTL).
    pub generator_left_to_ttl: Family<KindLabel, Counter>,
    /// GeneratorStates deleted past their garbage-collection deadline.
    pub generator_states_collected: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let publish_duration = Family::<PublishLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> _,
        );
        let backend_duration = Family::<BackendLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> _,
        );
        let m = Self {
            publish_duration,
            publishes: Family::default(),
            unpublishes: Family::default(),
            refreshes: Family::default(),
            volumes_active: Gauge::default(),
            volume_bytes: Family::default(),
            backend_requests: Family::default(),
            backend_duration,
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            cache_joins: Counter::default(),
            cache_expired: Counter::default(),
            logins: Family::default(),
            catalog_unusable: Family::default(),
            mirror_syncs: Family::default(),
            mirror_sync_duration: latency_histogram(),
            mirror_in_flight: Gauge::default(),
            mirror_queued: Gauge::default(),
            mirror_leader: Gauge::default(),
            generator_leases: Family::default(),
            generator_cleanups: Family::default(),
            generator_left_to_ttl: Family::default(),
            generator_states_collected: Counter::default(),
            registry: Registry::default(),
        };
        // Counters are registered without `_total`; the encoder appends it.
        registry.register(
            "latchkey_node_publish_duration_seconds",
            "NodePublishVolume latency by result and reason",
            m.publish_duration.clone(),
        );
        registry.register(
            "latchkey_node_publish",
            "NodePublishVolume calls by result",
            m.publishes.clone(),
        );
        registry.register(
            "latchkey_node_unpublish",
            "NodeUnpublishVolume calls by result",
            m.unpublishes.clone(),
        );
        registry.register(
            "latchkey_node_refresh",
            "Republishes of mounted volumes by result (changed, unchanged, failed)",
            m.refreshes.clone(),
        );
        registry.register(
            "latchkey_volumes_active",
            "Volumes currently mounted",
            m.volumes_active.clone(),
        );
        registry.register(
            "latchkey_volume_bytes",
            "Memory held in volumes (tmpfs pages and inodes) by namespace, counted against \
             --volume-budget",
            m.volume_bytes.clone(),
        );
        registry.register(
            "latchkey_backend_requests",
            "Backend requests by provider, operation and result",
            m.backend_requests.clone(),
        );
        registry.register(
            "latchkey_backend_request_duration_seconds",
            "Backend request latency by provider, operation and result",
            m.backend_duration.clone(),
        );
        registry.register(
            "latchkey_generator_leases",
            "Generated credentials with something to clean up (leases, accounts) held for \
             mounted volumes, by generator kind",
            m.generator_leases.clone(),
        );
        registry.register(
            "latchkey_cache_hits",
            "Values served from the cache",
            m.cache_hits.clone(),
        );
        registry.register(
            "latchkey_cache_misses",
            "Values fetched from a backend",
            m.cache_misses.clone(),
        );
        registry.register(
            "latchkey_cache_singleflight_joins",
            "Fetches that joined one already in flight for the same key",
            m.cache_joins.clone(),
        );
        registry.register(
            "latchkey_cache_expired",
            "Cached values dropped once stale for every reader that used them",
            m.cache_expired.clone(),
        );
        registry.register(
            "latchkey_backend_logins",
            "Backend logins by provider",
            m.logins.clone(),
        );
        registry.register(
            "latchkey_catalog_unusable_objects",
            "Objects the agent cannot read (they do not match its schema), by kind; skipped",
            m.catalog_unusable.clone(),
        );
        registry.register(
            "latchkey_mirror_syncs",
            "Mirror controller reconciles by result",
            m.mirror_syncs.clone(),
        );
        registry.register(
            "latchkey_mirror_sync_duration_seconds",
            "Mirror controller reconcile latency",
            m.mirror_sync_duration.clone(),
        );
        registry.register(
            "latchkey_mirror_reconciles_in_flight",
            "Mirror controller reconciles running now",
            m.mirror_in_flight.clone(),
        );
        registry.register(
            "latchkey_mirror_queued",
            "ExternalSecrets with a scheduled mirror reconcile (the work queue)",
            m.mirror_queued.clone(),
        );
        registry.register(
            "latchkey_mirror_leader",
            "1 while this mirror controller replica leads",
            m.mirror_leader.clone(),
        );
        registry.register(
            "latchkey_generator_cleanups",
            "Controller cleanups of GeneratorStates being deleted, by generator kind and result \
             (cleaned, no_state, retried, left_to_ttl)",
            m.generator_cleanups.clone(),
        );
        registry.register(
            "latchkey_generator_left_to_ttl",
            "Generated credentials released without cleanup (they end by their TTL), by kind",
            m.generator_left_to_ttl.clone(),
        );
        registry.register(
            "latchkey_generator_states_collected",
            "GeneratorStates deleted past their garbage-collection deadline",
            m.generator_states_collected.clone(),
        );
        for kind in [
            "ExternalSecret",
            "SecretStore",
            "ClusterSecretStore",
            "Namespace",
        ] {
            drop(m.catalog_unusable.get_or_create(&KindLabel { kind }));
        }
        // Providers that log in are a closed set: expose their series from the start, at zero,
        // so dashboards and alerts see the family before the first login.
        for provider in ["aws", "vault"] {
            drop(m.logins.get_or_create(&ProviderLabel { provider }));
        }
        // An alert on credentials left to their TTL needs the series before the first one.
        for kind in ["Password", "VaultDynamicSecret", "PluginGenerator"] {
            drop(m.generator_left_to_ttl.get_or_create(&KindLabel { kind }));
        }
        Self { registry, ..m }
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in the encoder.
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/metrics.md is the reference of every metric: a family added here must be added there.
    #[test]
    fn every_metric_is_documented() {
        let doc = include_str!("../../../docs/metrics.md");
        let m = Metrics::new();
        // A family is exposed once it has a series: give each labelled one a series.
        let (result, reason) = ("success", "mounted");
        m.publish_duration
            .get_or_create(&PublishLabels { result, reason })
            .observe(0.0);
        for family in [&m.publishes, &m.unpublishes, &m.refreshes, &m.mirror_syncs] {
            family.get_or_create(&ResultLabel { result }).inc();
        }
        m.generator_leases
            .get_or_create(&KindLabel { kind: "Password" })
            .set(0);
        m.generator_cleanups
            .get_or_create(&GeneratorCleanupLabels {
                kind: "Password",
                result: "cleaned",
            })
            .inc();
        let backend = BackendLabels {
            provider: "fake",
            operation: "get",
            result,
        };
        m.backend_requests.get_or_create(&backend).inc();
        m.backend_duration.get_or_create(&backend).observe(0.0);
        let namespace = "shop".to_string();
        m.volume_bytes
            .get_or_create(&NamespaceLabel { namespace })
            .set(1);
        let text = m.encode();
        let families: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        // Every registered family, so that none is missed by the loop below.
        let registered = include_str!("metrics.rs")
            .matches(concat!("registry", ".register("))
            .count();
        assert_eq!(families.len(), registered, "{families:?}");
        for (name, kind) in families {
            // Counters are exposed with `_total`, which is how the doc names them.
            let shown = if kind == "counter" {
                format!("`{name}_total`")
            } else {
                format!("`{name}`")
            };
            assert!(
                doc.contains(&shown),
                "docs/metrics.md does not describe {shown}"
            );
        }
    }

    #[test]
    fn exposes_every_family_with_its_labels() {
        let m = Metrics::new();
        m.publish_duration
            .get_or_create(&PublishLabels {
                result: "success",
                reason: "mounted",
            })
            .observe(0.0003);
        m.publishes
            .get_or_create(&ResultLabel { result: "success" })
            .inc();
        m.backend_requests
            .get_or_create(&BackendLabels {
                provider: "fake",
                operation: "get",
                result: "success",
            })
            .inc();
        m.volumes_active.set(3);
        let text = m.encode();
        for want in [
            "latchkey_node_publish_duration_seconds_bucket{le=\"0.0005\",result=\"success\",reason=\"mounted\"} 1",
            "latchkey_node_publish_total{result=\"success\"} 1",
            "latchkey_backend_requests_total{provider=\"fake\",operation=\"get\",result=\"success\"} 1",
            "latchkey_volumes_active 3",
            "# TYPE latchkey_cache_hits counter",
            "latchkey_backend_logins_total{provider=\"vault\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
    }
}
