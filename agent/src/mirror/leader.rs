//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's algorithm and field
//! meanings, so `kubectl get lease` reads as for any controller: the holder renews the Lease every
//! `retry_period`; another replica takes it over once it has seen no renewal for
//! `lease_duration` (measured on its own clock, from when it observed the last change, so clock
//! skew between nodes does not matter); writes are guarded by resourceVersion, so two replicas
//! can never both win a round.
//!
//! Written here rather than taken from a crate because the controller must stop writing the
//! moment its lease may have lapsed: [`Leadership::is_leader`] is a deadline checked before every
//! write, not a notification that may arrive late.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

/// Timing of the election (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease is good for after its last renewal, as seen by the others.
    pub lease_duration: Duration,
    /// How long the holder keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Whether this replica leads, as of now.
#[derive(Clone)]
pub struct Leadership {
    /// Until when this replica may act as leader; `None` when it does not lead.
    until: Arc<Mutex<Option<Instant>>>,
    changes: watch::Receiver<bool>,
}

impl Leadership {
    /// A replica that always leads (`--leader-elect=false`, tests).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // The receiver outlives the sender only as a constant `true`.
        drop(tx);
        Self {
            until: Arc::new(Mutex::new(Some(far_future()))),
            changes: rx,
        }
    }

    /// True while this replica holds an unexpired lease: checked before every write.
    pub fn is_leader(&self) -> bool {
        holds(&self.until)
    }

    /// Waits until leadership is (`true`) or is not (`false`) held.
    pub async fn wait_for(&mut self, leading: bool) {
        if self.is_leader() == leading {
            return;
        }
        loop {
            if self.changes.changed().await.is_err() {
                // The elector has stopped: nothing will change any more.
                return std::future::pending().await;
            }
            if *self.changes.borrow_and_update() == leading {
                return;
            }
        }
    }
}

/// Whether a lease held until `until` is still held now.
fn holds(until: &Mutex<Option<Instant>>) -> bool {
    let until = *until.lock().unwrap_or_else(|p| p.into_inner());
    until.is_some_and(|t| Instant::now() < t)
}

fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 86_400))
        .unwrap_or(now)
}

/// Runs the election for one Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    until: Arc<Mutex<Option<Instant>>>,
    changes: watch::Sender<bool>,
    /// The last Lease record seen and when it was first seen (client-go's observedTime).
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    /// An elector for the Lease `namespace/name`, competing as `identity`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> (Self, Leadership) {
        let until = Arc::new(Mutex::new(None));
        let (tx, rx) = watch::channel(false);
        let elector = Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            until: Arc::clone(&until),
            changes: tx,
            observed: None,
        };
        (elector, Leadership { until, changes: rx })
    }

    /// Acquires and renews until `stop` completes, then releases the lease if held.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let attempt = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => self.set_until(Some(attempt + self.timing.renew_deadline)),
                Ok(false) => self.set_until(None),
                Err(error) => {
                    warn!(lease = %self.name, %error, "cannot read or write the leader lease");
                    // A leader that cannot renew keeps acting only until its renew deadline.
                    if !self.leading() {
                        self.set_until(None);
                    }
                }
            }
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(self.timing.retry_period) => {}
            }
        }
        if self.leading() {
            self.set_until(None);
            self.release().await;
        }
    }

    fn leading(&self) -> bool {
        holds(&self.until)
    }

    fn set_until(&self, until: Option<Instant>) {
        let was = self.leading();
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        let now = self.leading();
        if was != now {
            if now {
                info!(lease = %self.name, identity = %self.identity, "became leader");
            } else {
                warn!(lease = %self.name, identity = %self.identity, "lost leadership; writes stop");
            }
        }
        self.changes.send_if_modified(|v| {
            let changed = *v != now;
            *v = now;
            changed
        });
    }

    /// One round: true when this replica holds the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let spec = LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observed = Some((spec, Instant::now()));
                    Ok(true)
                }
                // Another replica created it first: it leads this round.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        // client-go's observedTime: the record's age is measured from when this replica first
        // saw it, on this replica's clock.
        let observed_at = match &self.observed {
            Some((seen, at)) if *seen == spec => *at,
            _ => Instant::now(),
        };
        self.observed = Some((spec.clone(), observed_at));
        let duration = Duration::from_secs(
            spec.lease_duration_seconds
                .unwrap_or(self.lease_seconds())
                .max(1) as u64,
        );
        let ours = holder == self.identity;
        if !holder.is_empty() && !ours && observed_at.elapsed() < duration {
            return Ok(false);
        }
        let mut next = spec.clone();
        if !ours {
            next.acquire_time = Some(now.clone());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        next.holder_identity = Some(self.identity.clone());
        next.lease_duration_seconds = Some(self.lease_seconds());
        next.renew_time = Some(now);
        let updated = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(next.clone()),
        };
        // The resourceVersion in `metadata` makes this a compare-and-swap.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                self.observed = Some((next, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up so another replica need not wait for it to expire.
    async fn release(&mut self) {
        let Ok(Some(lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        // client-go's ReleaseOnCancel: an empty holder and a 1 s duration.
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let released = Lease {
            metadata: lease.metadata,
            spec: Some(spec),
        };
        if let Err(error) = self
            .api
            .replace(&self.name, &PostParams::default(), &released)
            .await
        {
            warn!(lease = %self.name, %error, "cannot release the leader lease");
        }
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}
