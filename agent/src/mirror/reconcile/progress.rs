//! What the controller remembers between reconciles: when each ExternalSecret is due again,
//! its failures in a row, the generation it last synced, and each Secret as last written (to
//! tell drift from its own writes). Bounded by the ExternalSecrets there are.

use std::time::{Duration, Instant};

use super::{REFRESH_JITTER, RETRY_FLOOR, Reconciler, Written};
use crate::api::ExternalSecret;
use crate::api::external_secret::RefreshPolicy;
use crate::fetch::backoff;
use crate::fetch::schedule::Refresh;
use crate::mirror::status::{Outcome, Reason};

impl Reconciler {
    /// When to reconcile again, and the bookkeeping of failures and refreshes.
    pub(super) fn schedule(
        &self,
        es: &ExternalSecret,
        namespace: &str,
        name: &str,
        outcome: &Outcome,
    ) -> Option<Duration> {
        let interval = Refresh::parse(es.spec.refresh_interval.as_deref())
            .ok()
            .and_then(Refresh::max_age);
        let periodic = es.spec.refresh_policy.unwrap_or_default() == RefreshPolicy::Periodic;
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let entry = progress
            .entry((namespace.to_string(), name.to_string()))
            .or_default();
        let now = Instant::now();
        if outcome.reason.is_ready() || outcome.reason == Reason::SecretDeleted {
            entry.failures = 0;
            if outcome.synced_generation.is_some() {
                entry.synced_generation = outcome.synced_generation;
            }
            if outcome.refreshed {
                entry.next_refresh = interval
                    .filter(|_| periodic)
                    .map(|i| now + i.mul_f64(1.0 + fastrand::f64() * REFRESH_JITTER));
            }
            return entry
                .next_refresh
                .filter(|_| periodic)
                .map(|t| t.saturating_duration_since(now));
        }
        entry.failures = entry.failures.saturating_add(1);
        let cap = interval.unwrap_or(backoff::MAX_DELAY).max(RETRY_FLOOR);
        Some(backoff::delay_between(
            entry.failures,
            RETRY_FLOOR,
            cap,
            fastrand::f64(),
        ))
    }

    pub(super) fn refresh_due(&self, namespace: &str, name: &str) -> bool {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|p| p.next_refresh)
            .is_none_or(|t| Instant::now() >= t)
    }

    pub(super) fn synced_generation(&self, namespace: &str, name: &str) -> Option<i64> {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|p| p.synced_generation)
    }

    pub(super) fn queued(&self) -> usize {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress
            .values()
            .filter(|p| p.next_refresh.is_some() || p.failures > 0)
            .count()
    }

    pub(super) fn forget(&self, namespace: &str, name: &str) {
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress.remove(&(namespace.to_string(), name.to_string()));
    }

    /// Drops what is remembered of an ExternalSecret that no longer exists, so a long-running
    /// controller's memory follows the ExternalSecrets there are, not all there ever were.
    pub fn forget_deleted(&self, namespace: &str, name: &str) {
        self.retain(|ns, es| !(ns == namespace && es == name));
    }

    /// Keeps what is remembered only of the ExternalSecrets for which `exists(namespace, name)`.
    pub fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        {
            let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            progress.retain(|(ns, name), _| exists(ns, name));
        }
        {
            let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
            written.retain(|(ns, _), w| exists(ns, &w.external_secret));
        }
        self.metrics.mirror_queued.set(self.queued() as i64);
    }

    pub(super) fn written(&self, key: &(String, String)) -> Option<String> {
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.get(key).map(|w| w.resource_version.clone())
    }

    pub(super) fn remember_written(
        &self,
        key: (String, String),
        external_secret: &str,
        resource_version: String,
    ) {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.insert(
            key,
            Written {
                resource_version,
                external_secret: external_secret.to_string(),
            },
        );
    }

    pub(super) fn forget_written(&self, namespace: &str, target: &str) {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.remove(&(namespace.to_string(), target.to_string()));
    }
}
