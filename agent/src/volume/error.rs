//! The one error type of the volume module. It exists so the CSI edge can map failures to gRPC
//! codes by variant (see [`ErrorClass`]) and so every message names the path involved.
//!
//! Not for secret material: no variant carries file contents, only paths, key names, sizes and
//! OS errors, so any `VolumeError` may be logged or returned to kubelet as it is.

use std::path::PathBuf;

use nix::errno::Errno;
use thiserror::Error;

use super::path::{PathConflict, PathError};

/// Everything that can go wrong while publishing, updating or removing a volume.
#[derive(Debug, Error)]
pub enum VolumeError {
    /// A file path from the request is not acceptable.
    #[error(transparent)]
    InvalidPath(#[from] PathError),

    /// Two file paths of one request collide.
    #[error(transparent)]
    Conflict(#[from] PathConflict),

    /// A file mode has bits outside 0o777 (setuid, setgid, sticky or garbage).
    #[error("file {path:?}: mode {mode:#o} is not allowed (only permission bits 0o000..=0o777)")]
    InvalidMode {
        /// The key whose mode was rejected.
        path: String,
        /// The rejected mode.
        mode: u32,
    },

    /// The target path from the request is unusable (relative, `..`, the root directory).
    #[error("invalid target path {target}: {reason}")]
    InvalidTarget {
        /// The rejected target.
        target: PathBuf,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// The payload does not fit the per-volume size limit; nothing was written.
    #[error("payload needs {needed} bytes of volume space but the limit is {limit} bytes")]
    TooLarge {
        /// Bytes the payload needs, counted in filesystem pages.
        needed: u64,
        /// The configured per-volume limit.
        limit: u64,
    },

    /// The volume would take the node past its volume budget, or its namespace past its share
    /// of it; nothing was written.
    #[error(
        "the volume needs {} more of the node's memory for volumes, but namespace {namespace} \
         holds {} of its {} share and node-wide {} are held of --volume-budget {}; nothing was \
         written",
        mib(*needed), mib(*namespace_used), mib(*namespace_limit), mib(*node_used), mib(*node_limit)
    )]
    OverBudget {
        /// The pod's namespace.
        namespace: String,
        /// Bytes the write needs at its peak (old and new content during a refresh).
        needed: u64,
        /// Bytes the namespace's volumes hold now.
        namespace_used: u64,
        /// The namespace's share.
        namespace_limit: u64,
        /// Bytes all volumes hold now.
        node_used: u64,
        /// The node's volume budget.
        node_limit: u64,
    },

    /// The filesystem ran out of space or inodes while writing.
    #[error("no space left in volume {target}")]
    NoSpace {
        /// The volume being written.
        target: PathBuf,
    },

    /// The target (or something below it) is a mount point that Latchkey did not create.
    #[error(
        "refusing to touch {target}: it is a {fstype} mount of {mount_source}, not a Latchkey volume"
    )]
    NotOurMount {
        /// The foreign mount point.
        target: PathBuf,
        /// Its filesystem type.
        fstype: String,
        /// Its mount source (named so because thiserror treats a `source` field as the cause).
        mount_source: String,
    },

    /// `publish` was called for a target that already holds a Latchkey volume.
    #[error("{target} is already a published Latchkey volume")]
    AlreadyPublished {
        /// The target path.
        target: PathBuf,
    },

    /// `update` was called for a target that holds no Latchkey volume.
    #[error("{target} is not a published Latchkey volume")]
    NotPublished {
        /// The target path.
        target: PathBuf,
    },

    /// The target exists but is not a directory (a symlink counts as "not a directory").
    #[error("target {target} exists and is not a directory; left it as it is")]
    NotADirectory {
        /// The target path.
        target: PathBuf,
    },

    /// `publish` was called for a directory with content: mounting over it would hide that.
    #[error(
        "refusing to mount a volume over {target}: the directory is not empty ({entries}); \
         a volume is only mounted on an empty or missing directory"
    )]
    NotEmpty {
        /// The target path.
        target: PathBuf,
        /// How many entries, and the first few names.
        entries: String,
    },

    /// `unpublish` found content that Latchkey did not write and removed nothing of it.
    #[error("left {target} in place: it is not a Latchkey volume and is not empty ({entries})")]
    LeftInPlace {
        /// The target path.
        target: PathBuf,
        /// How many entries, and the first few names.
        entries: String,
    },

    /// mount(2) failed.
    #[error("mounting tmpfs at {target}: {source}")]
    Mount {
        /// The mount point.
        target: PathBuf,
        /// The OS error.
        source: nix::Error,
    },

    /// umount2(2) failed.
    #[error("unmounting {target}: {source}")]
    Unmount {
        /// The mount point.
        target: PathBuf,
        /// The OS error.
        source: nix::Error,
    },

    /// `/proc/self/mountinfo` could not be understood.
    #[error("cannot parse /proc/self/mountinfo line {line}: {reason}")]
    MountInfo {
        /// 1-based line number.
        line: usize,
        /// What was wrong with it.
        reason: &'static str,
    },

    /// The blocking-pool thread doing the work stopped (a bug: it panicked).
    #[error("the volume worker failed: {reason}")]
    Worker {
        /// What the runtime said.
        reason: String,
    },

    /// Any other filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing, e.g. "writing".
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// How a caller should report a [`VolumeError`]; the CSI edge turns this into a gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request was wrong (INVALID_ARGUMENT).
    InvalidArgument,
    /// The payload does not fit (RESOURCE_EXHAUSTED).
    ResourceExhausted,
    /// The target is not in a state the call can work with (FAILED_PRECONDITION).
    FailedPrecondition,
    /// Anything else (INTERNAL).
    Internal,
}

impl VolumeError {
    /// The class of this error, for mapping to a gRPC status code.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidPath(_)
            | Self::Conflict(_)
            | Self::InvalidMode { .. }
            | Self::InvalidTarget { .. } => ErrorClass::InvalidArgument,
            Self::TooLarge { .. } | Self::NoSpace { .. } | Self::OverBudget { .. } => {
                ErrorClass::ResourceExhausted
            }
            Self::NotADirectory { .. }
            | Self::NotEmpty { .. }
            | Self::LeftInPlace { .. }
            | Self::NotOurMount { .. }
            | Self::AlreadyPublished { .. }
            | Self::NotPublished { .. } => ErrorClass::FailedPrecondition,
            _ => ErrorClass::Internal,
        }
    }

    /// An `Io` error, or `NoSpace` when the OS reports the filesystem (or its inodes) full.
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        target: &std::path::Path,
        source: std::io::Error,
    ) -> Self {
        match source.raw_os_error().map(Errno::from_raw) {
            Some(Errno::ENOSPC | Errno::EDQUOT) => Self::NoSpace {
                target: target.to_path_buf(),
            },
            _ => Self::Io {
                op,
                path: path.into(),
                source,
            },
        }
    }
}

/// `bytes` as MiB with one decimal, for messages (`3.0 MiB`).
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enospc_and_edquot_become_no_space() {
        for errno in [nix::errno::Errno::ENOSPC, nix::errno::Errno::EDQUOT] {
            let err = VolumeError::io(
                "writing",
                "/t/..x/a",
                std::path::Path::new("/t"),
                std::io::Error::from_raw_os_error(errno as i32),
            );
            assert!(
                matches!(err, VolumeError::NoSpace { ref target } if target == std::path::Path::new("/t"))
            );
            assert_eq!(err.class(), ErrorClass::ResourceExhausted);
        }
    }

    #[test]
    fn other_io_errors_stay_io_and_name_the_path() {
        let err = VolumeError::io(
            "writing",
            "/t/..x/a",
            std::path::Path::new("/t"),
            std::io::Error::from_raw_os_error(nix::errno::Errno::EACCES as i32),
        );
        assert_eq!(err.class(), ErrorClass::Internal);
        let msg = err.to_string();
        assert!(msg.starts_with("writing /t/..x/a: "), "{msg}");
    }

    #[test]
    fn classes_are_distinct() {
        let too_large = VolumeError::TooLarge {
            needed: 2,
            limit: 1,
        };
        assert_eq!(too_large.class(), ErrorClass::ResourceExhausted);
        let mode = VolumeError::InvalidMode {
            path: "a".into(),
            mode: 0o4755,
        };
        assert_eq!(mode.class(), ErrorClass::InvalidArgument);
        assert!(mode.to_string().contains("0o4755"), "{mode}");
        let foreign = VolumeError::NotOurMount {
            target: "/x".into(),
            fstype: "tmpfs".into(),
            mount_source: "other".into(),
        };
        assert_eq!(foreign.class(), ErrorClass::FailedPrecondition);
    }
}
