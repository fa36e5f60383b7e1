//! The node-wide budget of memory held in volumes. Every page a volume's tmpfs holds is charged to
//! the memory cgroup of the process that wrote it: the agent's container. Left unbounded, volumes
//! get the agent OOM-killed, and as the pages stay charged after the kill, killed again on its next
//! publish. [`Budget`] counts what each mounted volume holds, by namespace, and refuses a write
//! that would take the node past its budget or one namespace past its share of it.
//!
//! The count is what tmpfs really holds: measured with `statvfs` after every write (pages in use,
//! plus a fixed cost per inode for the kernel memory of files, directories and links), and
//! rebuilt from the mounted volumes at start, so the agent keeps no state of its own. A write is
//! reserved beforehand with a prediction that is never lower than the measurement (the peak of an
//! atomic swap, where the old and the new payload both exist).
//!
//! Not for finding or measuring volumes (see `Volumes`), nor for the per-volume size limit (the
//! writer checks it).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use super::error::VolumeError;
use super::tmpfs::round_up_to_pages;

/// How much memory volumes may hold on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Most bytes all volumes together may hold (`--volume-budget`).
    pub node_bytes: u64,
    /// Most bytes the volumes of one namespace may hold (`--namespace-volume-share` of the
    /// node's budget).
    pub namespace_bytes: u64,
}

impl BudgetLimits {
    /// No limit at all: the demo and tests that are not about the budget.
    pub const UNLIMITED: Self = Self {
        node_bytes: u64::MAX,
        namespace_bytes: u64::MAX,
    };

    /// A node budget of `node_bytes` of which one namespace may hold `share` (0 < share <= 1).
    pub fn with_share(node_bytes: u64, share: f64) -> Self {
        // Float to integer saturates in Rust; a share above 1 is refused by the flag's parser.
        let namespace_bytes = (node_bytes as f64 * share.clamp(0.0, 1.0)) as u64;
        Self {
            node_bytes,
            namespace_bytes: round_up_to_pages(namespace_bytes).min(node_bytes),
        }
    }
}

/// What one mounted volume holds.
#[derive(Debug, Clone)]
struct Held {
    namespace: Arc<str>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// By the target path's bytes, as `OurMounts`.
    by_target: HashMap<OsString, Held>,
    /// Held plus reserved, by namespace; a namespace at zero is removed.
    by_namespace: HashMap<Arc<str>, u64>,
    /// Held plus reserved, all namespaces.
    total: u64,
}

impl State {
    fn add(&mut self, namespace: &Arc<str>, bytes: u64) {
        *self.by_namespace.entry(Arc::clone(namespace)).or_default() += bytes;
        self.total = self.total.saturating_add(bytes);
    }

    fn sub(&mut self, namespace: &str, bytes: u64) {
        if let Some(used) = self.by_namespace.get_mut(namespace) {
            *used = used.saturating_sub(bytes);
            if *used == 0 {
                self.by_namespace.remove(namespace);
                crate::memory::shrink_emptied(&mut self.by_namespace);
            }
        }
        self.total = self.total.saturating_sub(bytes);
    }
}

/// The memory volumes hold on this node, by target and namespace. Shared by clones of `Volumes`.
#[derive(Debug)]
pub(crate) struct Budget {
    limits: BudgetLimits,
    state: Mutex<State>,
}

/// Bytes set aside for one write until it is measured ([`Reservation::commit`]) or given up
/// (dropped).
#[must_use]
pub(crate) struct Reservation<'a> {
    budget: &'a Budget,
    namespace: Arc<str>,
    bytes: u64,
}

impl Budget {
    /// An empty budget with these limits.
    pub(crate) fn new(limits: BudgetLimits) -> Self {
        Self {
            limits,
            state: Mutex::default(),
        }
    }

    /// Sets `bytes` aside for a write into `target`, for `namespace`, or says which limit it
    /// would cross. Checking and setting aside are one step, so concurrent publishes cannot
    /// both take the last free bytes.
    pub(crate) fn reserve(
        &self,
        namespace: &str,
        bytes: u64,
    ) -> Result<Reservation<'_>, VolumeError> {
        let mut state = self.state();
        let namespace_used = state.by_namespace.get(namespace).copied().unwrap_or(0);
        let over_namespace = namespace_used.saturating_add(bytes) > self.limits.namespace_bytes;
        let over_node = state.total.saturating_add(bytes) > self.limits.node_bytes;
        if over_namespace || over_node {
            return Err(VolumeError::OverBudget {
                namespace: namespace.to_owned(),
                needed: bytes,
                namespace_used,
                namespace_limit: self.limits.namespace_bytes,
                node_used: state.total,
                node_limit: self.limits.node_bytes,
            });
        }
        let namespace: Arc<str> = state
            .by_namespace
            .get_key_value(namespace)
            .map_or_else(|| Arc::from(namespace), |(k, _)| Arc::clone(k));
        state.add(&namespace, bytes);
        Ok(Reservation {
            budget: self,
            namespace,
            bytes,
        })
    }

    /// Records that `target` holds `bytes` for `namespace`, replacing what it held before,
    /// without checking the limits: the memory is already in use (a volume found at start, or
    /// one mounted before the budget knew it).
    pub(crate) fn record(&self, target: &Path, namespace: &str, bytes: u64) {
        let mut state = self.state();
        let namespace: Arc<str> = Arc::from(namespace);
        Self::replace(&mut state, target, namespace, bytes);
    }

    /// The namespace `target` is counted for, if it is counted.
    pub(crate) fn namespace_of(&self, target: &Path) -> Option<Arc<str>> {
        self.state()
            .by_target
            .get(target.as_os_str())
            .map(|held| Arc::clone(&held.namespace))
    }

    /// What `target` holds, 0 when it is not counted.
    #[cfg(test)]
    pub(crate) fn held(&self, target: &Path) -> u64 {
        self.state()
            .by_target
            .get(target.as_os_str())
            .map_or(0, |held| held.bytes)
    }

    /// Forgets `target` (unmounted); its bytes are free again. Returns whether it was counted.
    pub(crate) fn release(&self, target: &Path) -> bool {
        let mut state = self.state();
        let Some(held) = state.by_target.remove(target.as_os_str()) else {
            return false;
        };
        state.sub(&held.namespace, held.bytes);
        crate::memory::shrink_emptied(&mut state.by_target);
        true
    }

    /// Bytes held (and reserved) by each namespace that holds any, and by all together.
    pub(crate) fn usage(&self) -> (Vec<(String, u64)>, u64) {
        let state = self.state();
        let mut by_namespace: Vec<(String, u64)> = state
            .by_namespace
            .iter()
            .map(|(namespace, bytes)| (namespace.to_string(), *bytes))
            .collect();
        by_namespace.sort_unstable();
        (by_namespace, state.total)
    }

    fn replace(state: &mut State, target: &Path, namespace: Arc<str>, bytes: u64) {
        state.add(&namespace, bytes);
        let old = state
            .by_target
            .insert(target.as_os_str().to_owned(), Held { namespace, bytes });
        if let Some(old) = old {
            state.sub(&old.namespace, old.bytes);
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update of the state completes under the lock without calling out (no panic
        // can stop it halfway), so a poisoned lock still guards consistent numbers.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Reservation<'_> {
    /// The write is done and `target` now holds `bytes` (measured): they replace both the
    /// reservation and what the target held before.
    pub(crate) fn commit(self, target: &Path, bytes: u64) {
        let mut state = self.budget.state();
        state.sub(&self.namespace, self.bytes);
        Budget::replace(&mut state, target, Arc::clone(&self.namespace), bytes);
        drop(state);
        // Already given back: nothing for Drop to release.
        std::mem::forget(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.state().sub(&self.namespace, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::test_support::{file, require_root};
    use crate::volume::tmpfs::{INODE_BYTES, page_size};

    const MIB: u64 = 1 << 20;

    fn budget(node: u64, namespace: u64) -> Budget {
        Budget::new(BudgetLimits {
            node_bytes: node,
            namespace_bytes: namespace,
        })
    }

    #[test]
    fn a_share_is_a_fraction_of_the_node_budget_in_whole_pages() {
        let limits = BudgetLimits::with_share(64 * MIB, 0.5);
        assert_eq!(limits.namespace_bytes, 32 * MIB);
        assert_eq!(
            BudgetLimits::with_share(64 * MIB, 1.0).namespace_bytes,
            64 * MIB
        );
        let odd = BudgetLimits::with_share(10 * page_size() + 1, 0.3);
        assert_eq!(odd.namespace_bytes % page_size(), 0);
        assert!(odd.namespace_bytes <= odd.node_bytes);
    }

    #[test]
    fn one_namespace_stops_at_its_share_and_another_still_gets_room() {
        let b = budget(8 * MIB, 4 * MIB);
        for i in 0..4 {
            let t = format!("/t/a{i}");
            b.reserve("flood", MIB).unwrap().commit(Path::new(&t), MIB);
        }
        let err = b.reserve("flood", MIB).err().unwrap();
        let message = err.to_string();
        assert!(
            message.contains("namespace flood holds 4.0 MiB"),
            "{message}"
        );
        assert!(message.contains("of its 4.0 MiB share"), "{message}");
        assert!(message.contains("--volume-budget 8.0 MiB"), "{message}");
        assert_eq!(err.class(), crate::volume::ErrorClass::ResourceExhausted);
        b.reserve("quiet", MIB)
            .unwrap()
            .commit(Path::new("/t/b0"), MIB);
        assert_eq!(
            b.usage(),
            (
                vec![("flood".into(), 4 * MIB), ("quiet".into(), MIB)],
                5 * MIB
            )
        );
    }

    #[test]
    fn the_node_budget_binds_when_the_shares_add_up_to_more() {
        let b = budget(3 * MIB, 2 * MIB);
        b.record(Path::new("/t/a"), "a", 2 * MIB);
        let err = b.reserve("b", 2 * MIB).err().unwrap();
        assert!(
            err.to_string().contains("node-wide 2.0 MiB are held"),
            "{err}"
        );
        drop(b.reserve("b", MIB).unwrap());
    }

    #[test]
    fn a_dropped_reservation_gives_its_bytes_back_and_a_commit_replaces_the_old_count() {
        let b = budget(8 * MIB, 8 * MIB);
        let t = Path::new("/t/x");
        b.reserve("ns", 2 * MIB).unwrap().commit(t, 2 * MIB);
        // A refresh: old and new both exist during the swap.
        let during = b.reserve("ns", 3 * MIB).unwrap();
        assert_eq!(b.usage().1, 5 * MIB);
        drop(during);
        assert_eq!(b.usage().1, 2 * MIB);
        assert_eq!(b.held(t), 2 * MIB);
        b.reserve("ns", 3 * MIB).unwrap().commit(t, 3 * MIB);
        assert_eq!(b.usage(), (vec![("ns".into(), 3 * MIB)], 3 * MIB));
        assert!(b.release(t));
        assert_eq!(b.usage(), (vec![], 0));
        assert_eq!(b.namespace_of(t), None);
        // Releasing twice (an unpublish retried) is harmless.
        assert!(!b.release(t));
        assert_eq!(b.usage().1, 0);
    }

    /// Tmpfs volumes held to `limits`, in a scratch directory whose mounts go with it.
    struct Node {
        volumes: crate::volume::Volumes,
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new(limits: BudgetLimits) -> Self {
            require_root();
            let volumes = crate::volume::Volumes::new(crate::volume::VolumeConfig {
                backend: crate::volume::Backend::Tmpfs,
                size_limit: 4 * MIB,
            })
            .with_budget(limits);
            Self {
                volumes,
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn target(&self, name: &str) -> std::path::PathBuf {
            self.dir
                .path()
                .canonicalize()
                .unwrap()
                .join(name)
                .join("mount")
        }

        fn used(&self, namespace: &str) -> u64 {
            let (by_namespace, _) = self.volumes.usage();
            by_namespace
                .into_iter()
                .find_map(|(ns, bytes)| (ns == namespace).then_some(bytes))
                .unwrap_or(0)
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            for m in crate::volume::mountinfo::below(self.dir.path()).unwrap_or_default() {
                let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }

    fn big(bytes: usize) -> Vec<crate::volume::VolumeFile> {
        vec![file("v", &"x".repeat(bytes))]
    }

    #[test]
    fn a_publish_past_the_share_is_refused_and_leaves_nothing_while_others_still_mount() {
        let node = Node::new(BudgetLimits {
            node_bytes: 8 * MIB,
            namespace_bytes: 4 * MIB,
        });
        let mut mounted = 0;
        let refused = loop {
            let target = node.target(&format!("flood-{mounted}"));
            match node
                .volumes
                .publish("flood", &target, &big(MIB as usize), None)
            {
                Ok(()) => mounted += 1,
                Err(err) => break (target, err),
            }
            assert!(mounted < 10, "never refused");
        };
        // 1 MiB + a page for the link + five inodes each: three fit in 4 MiB, not four.
        assert_eq!(mounted, 3);
        let (target, err) = refused;
        assert_eq!(err.class(), crate::volume::ErrorClass::ResourceExhausted);
        let message = err.to_string();
        assert!(
            message.contains("namespace flood holds 3.0 MiB of its 4.0 MiB share"),
            "{message}"
        );
        assert!(!target.exists(), "{} left behind", target.display());
        assert!(
            !target.parent().unwrap().exists(),
            "its parent was created by the publish"
        );
        assert_eq!(crate::volume::mountinfo::find(&target).unwrap(), None);
        // What the three volumes hold, as measured: the page-rounded file and five inodes (root,
        // payload directory, file, its link and `..data`; short links take no page).
        let each = round_up_to_pages(MIB) + 5 * INODE_BYTES;
        assert_eq!(node.used("flood"), 3 * each);

        node.volumes
            .publish("quiet", &node.target("quiet"), &big(MIB as usize), None)
            .unwrap();
        assert_eq!(node.used("quiet"), each);
        // Unpublishing gives the bytes back: the refused volume now fits.
        node.volumes.unpublish(&node.target("flood-0")).unwrap();
        assert_eq!(node.used("flood"), 2 * each);
        node.volumes
            .publish("flood", &target, &big(MIB as usize), None)
            .unwrap();
    }

    #[test]
    fn a_refresh_that_grows_past_the_share_keeps_the_old_content_and_one_that_does_not_change_passes()
     {
        let node = Node::new(BudgetLimits {
            node_bytes: 8 * MIB,
            namespace_bytes: 3 * MIB,
        });
        let target = node.target("pod");
        node.volumes
            .publish("shop", &target, &big(MIB as usize), None)
            .unwrap();
        // Old and new both exist during the swap: 1 + 2 MiB does not fit in 3 MiB.
        let err = node
            .volumes
            .update("shop", &target, &big(2 * MIB as usize), None)
            .unwrap_err();
        assert_eq!(err.class(), crate::volume::ErrorClass::ResourceExhausted);
        assert_eq!(std::fs::read(target.join("v")).unwrap().len(), MIB as usize);
        let held = node.used("shop");
        // Same content with the budget full (a budget of exactly what is held, counted the way a
        // restarted agent does): nothing to write, nothing to reserve, no refusal.
        let tight = Node::new(BudgetLimits {
            node_bytes: held,
            namespace_bytes: held,
        });
        tight.volumes.count_mounted(Path::new("/")).unwrap();
        assert!(
            !tight
                .volumes
                .update("shop", &target, &big(MIB as usize), None)
                .unwrap()
        );
        // A refresh that fits swaps, and the count follows the new content.
        assert!(
            node.volumes
                .update("shop", &target, &big(100), None)
                .unwrap()
        );
        assert_eq!(node.used("shop"), page_size() + 5 * INODE_BYTES);
    }

    #[test]
    fn the_count_is_rebuilt_from_the_mounted_volumes_with_their_namespaces() {
        let node = Node::new(BudgetLimits::UNLIMITED);
        for i in 0..3 {
            node.volumes
                .publish(
                    "recount",
                    &node.target(&format!("p{i}")),
                    &big(100_000),
                    None,
                )
                .unwrap();
        }
        let before = node.used("recount");
        assert!(before > 3 * 100_000, "{before}");
        // A restarted agent: a new process knows nothing but what is mounted.
        let restarted = Node::new(BudgetLimits::UNLIMITED);
        assert_eq!(restarted.volumes.count_mounted(node.dir.path()).unwrap(), 3);
        assert_eq!(restarted.used("recount"), before);
        // Its unpublish releases what the count found (keyed by the mount point).
        restarted.volumes.unpublish(&node.target("p0")).unwrap();
        assert_eq!(restarted.used("recount"), before / 3 * 2);
    }

    #[test]
    fn an_older_agents_volume_counts_under_no_namespace_until_its_refresh_names_it() {
        let node = Node::new(BudgetLimits::UNLIMITED);
        let target = node.target("legacy");
        std::fs::create_dir_all(&target).unwrap();
        // What an agent before the budget mounted: source `latchkey`, no namespace.
        crate::volume::tmpfs::mount(
            &target,
            crate::volume::MOUNT_SOURCE,
            crate::volume::tmpfs::tmpfs_size(4 * MIB),
            None,
        )
        .unwrap();
        std::fs::write(target.join("old"), "x").unwrap();
        assert_eq!(node.volumes.count_mounted(node.dir.path()).unwrap(), 1);
        assert_eq!(node.used(""), page_size() + 2 * INODE_BYTES);
        assert!(
            node.volumes
                .update("shop", &target, &big(10), None)
                .unwrap()
        );
        assert_eq!(node.used(""), 0);
        assert_eq!(node.used("shop"), 2 * page_size() + 6 * INODE_BYTES);
        node.volumes.unpublish(&target).unwrap();
        assert_eq!(node.volumes.usage(), (vec![], 0));
    }

    #[test]
    fn a_recorded_volume_counts_without_checks() {
        let b = budget(MIB, MIB);
        b.record(Path::new("/t/a"), "a", 2 * MIB);
        assert_eq!(b.usage().1, 2 * MIB);
        assert_eq!(b.namespace_of(Path::new("/t/a")).as_deref(), Some("a"));
        assert!(b.reserve("b", 1).is_err());
    }
}
