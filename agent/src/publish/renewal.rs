//! What the node agent runs beside kubelet's calls for generated credentials: a once-a-second
//! tick that renews leases (and replaces those past renewal) and cleans up replaced ones, and
//! the take-over at start of what an earlier run recorded.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tracing::warn;

use super::{Publisher, generated};
use crate::generators::states::StateError;
use crate::volume;

impl Publisher {
    /// Takes over the GeneratorStates an earlier run of the agent on this node recorded (see
    /// [`GeneratorConfig`]): credentials of volumes still mounted are replaced at their next
    /// republish; those of volumes gone are handed to the controller or left to their TTL.
    /// Returns how many were adopted and how many were let go.
    pub async fn recover(&self) -> Result<(usize, usize), StateError> {
        let mut counts = (0, 0);
        for state in self.generated.recorded_here().await? {
            let target = state
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(generated::ANNOTATION_TARGET))
                .map(PathBuf::from);
            let mounted = match &target {
                Some(t) => volume::is_published(&self.volumes, t)
                    .await
                    .unwrap_or(false),
                None => false,
            };
            if self.generated.adopt(&state, mounted).await {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        Ok(counts)
    }

    /// Renews the generated credentials that are due and cleans up those whose grace period
    /// has passed; the caller runs it about once a second.
    pub async fn tick(&self) {
        use futures::StreamExt;
        let due = self.generated.tick(Instant::now());
        futures::stream::iter(due)
            .for_each_concurrent(8, |req| async move {
                let _lock = self.locks.lock(&req.target).await;
                // Unpublished meanwhile: nothing to renew (and nothing may be mounted again).
                if !self.generated.knows(&req.target) {
                    return;
                }
                let mounted_here = AtomicBool::new(false);
                if let Err(error) = Box::pin(self.publish_locked(&req, &mounted_here)).await {
                    warn!(target_path = %req.target.display(), %error,
                        "renewing generated credentials failed");
                }
            })
            .await;
    }
}
