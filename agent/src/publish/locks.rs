//! One operation at a time per target path: kubelet may retry or republish while a previous call
//! for the same volume is still running.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Slot = Arc<AsyncMutex<()>>;

/// Slots by the target path's bytes, as kubelet spells it (it names a target the same way in
/// every call): hashing a `Path` goes component by component, 8 times per publish.
type Slots = HashMap<OsString, Slot>;

/// Per-target async locks; an entry lives only while someone holds or waits for it.
#[derive(Default)]
pub struct TargetLocks {
    slots: Arc<Mutex<Slots>>,
}

/// Holds a target's lock; dropping it releases the lock and forgets an unused entry.
pub struct TargetGuard {
    slots: Arc<Mutex<Slots>>,
    path: OsString,
    guard: Option<OwnedMutexGuard<()>>,
}

impl TargetLocks {
    /// Waits for exclusive use of `path`.
    pub async fn lock(&self, path: &Path) -> TargetGuard {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(slots.entry(path.as_os_str().to_owned()).or_default())
        };
        let guard = slot.lock_owned().await;
        TargetGuard {
            slots: Arc::clone(&self.slots),
            path: path.as_os_str().to_owned(),
            guard: Some(guard),
        }
    }
}

impl Drop for TargetGuard {
    fn drop(&mut self) {
        self.guard.take();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map holds the slot now: nobody waits, so the entry can go.
        if slots
            .get(&self.path)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            slots.remove(&self.path);
            crate::memory::shrink_emptied(&mut slots);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serialises_one_path_and_forgets_it_afterwards() {
        let locks = TargetLocks::default();
        let a = locks.lock(Path::new("/a")).await;
        let _b = locks.lock(Path::new("/b")).await;
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            locks.lock(Path::new("/a")),
        );
        assert!(waiting.await.is_err(), "second lock on /a must wait");
        drop(a);
        drop(locks.lock(Path::new("/a")).await);
        assert_eq!(locks.slots.lock().unwrap().len(), 1);
    }
}
