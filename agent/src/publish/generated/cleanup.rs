//! Cleanup of generated credentials, off the publish and unpublish paths: retried with backoff
//! for a bounded time, then handed to the controller (when it runs) or left to the credential's
//! TTL, never holding anything up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{CLEANUP_PATIENCE, Credential, Generated, Recorded};
use crate::identity::PodInfo;

impl Generated {
    /// Cleanup of one credential as `pod`, retried with backoff for a bounded time.
    pub(super) fn spawn_cleanup(self: &Arc<Self>, c: Credential, pod: PodInfo) {
        let Some(recorded) = c.state.clone() else {
            return;
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let started = Instant::now();
            let mut wait = Duration::from_millis(500);
            loop {
                let outcome = match this.build(&c.object, c.scope, &pod).await {
                    Ok(g) => g.cleanup(&recorded.state).await,
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(()) => {
                        info!(namespace = %recorded.namespace, state = %recorded.name,
                            generator = %c.reference, "generated credential cleaned up");
                        this.drop_state(&recorded.namespace, &recorded.name).await;
                        this.leases(&c.object).dec();
                        return;
                    }
                    Err(e) if started.elapsed() + wait > CLEANUP_PATIENCE => {
                        this.give_up(&c, &recorded, &e).await;
                        return;
                    }
                    Err(e) => {
                        warn!(namespace = %recorded.namespace, state = %recorded.name,
                            generator = %c.reference, reason = %e,
                            "cannot clean up a generated credential yet; retrying");
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        });
    }

    /// Cleanup kept failing: with the controller running, the state is deleted with its
    /// finalizer kept, so the controller cleans up with a token it mints; without, the
    /// credential is left to its TTL.
    pub(super) async fn give_up(
        &self,
        c: &Credential,
        recorded: &Recorded,
        e: &(dyn std::fmt::Display + Sync),
    ) {
        if self.config.finalizer {
            if let Err(err) = self
                .config
                .states
                .abandon(&recorded.namespace, &recorded.name)
                .await
            {
                warn!(namespace = %recorded.namespace, state = %recorded.name, error = %err,
                    "cannot hand a generated credential over to the controller");
            }
            info!(namespace = %recorded.namespace, state = %recorded.name,
                generator = %c.reference, reason = %e,
                "cleanup handed over to the controller");
        } else {
            self.drop_state(&recorded.namespace, &recorded.name).await;
            warn!(namespace = %recorded.namespace, state = %recorded.name,
                generator = %c.reference, reason = %e,
                "cannot clean up a generated credential; it is left to its TTL");
        }
        self.leases(&c.object).dec();
    }

    /// Removes a state whose credential needs no (more) cleanup.
    pub(super) async fn drop_state(&self, namespace: &str, name: &str) {
        if let Err(e) = self.config.states.remove(namespace, name).await {
            warn!(%namespace, state = %name, error = %e, "cannot remove a GeneratorState");
        }
    }
}
