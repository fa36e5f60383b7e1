//! What a volume is asked to hold: [`VolumeFile`]s, and the [`Payload`] they become once every
//! check that needs no disk has passed (modes, path conflicts, the size limit). Checking first
//! lets a publish refuse a request before it creates, mounts or writes anything, and gives the
//! budget the payload's whole charge up front.
//!
//! Not for writing (see `writer`) nor for validating a single path (see `path`).

use std::collections::{BTreeSet, HashSet};
use std::fmt;

use super::error::VolumeError;
use super::path::{FilePath, check_set};
use super::tmpfs::INODE_BYTES;
use super::tmpfs::{page_size, round_up_to_pages};
use crate::secret::SecretBytes;

/// The mode callers use for files unless a request says otherwise: anyone in the pod may read.
pub const DEFAULT_FILE_MODE: u32 = 0o444;

/// The bits a mode set outside Latchkey (a provider's file mode, or the ExternalSecret's) may
/// keep: read and execute. Setuid, setgid and sticky have no place in a secret volume, and the volume is
/// read-only, so a write bit would only claim what the pod cannot do.
const UNTRUSTED_MODE_BITS: u32 = 0o555;

/// A mode set outside Latchkey, made safe: only read and execute bits are kept (0o4755
/// becomes 0o555, 0o600 becomes 0o400).
pub fn untrusted_file_mode(mode: u32) -> u32 {
    mode & UNTRUSTED_MODE_BITS
}

/// One file to put into a volume.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeFile {
    /// Where the file goes, relative to the volume root.
    pub path: FilePath,
    /// The bytes to write.
    pub contents: SecretBytes,
    /// Permission bits (0o000..=0o777); [`DEFAULT_FILE_MODE`] unless the request says otherwise.
    pub mode: u32,
}

impl VolumeFile {
    /// A file with the default mode 0444.
    pub fn new(path: FilePath, contents: SecretBytes) -> Self {
        Self {
            path,
            contents,
            mode: DEFAULT_FILE_MODE,
        }
    }
}

impl fmt::Debug for VolumeFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeFile")
            .field("path", &self.path.as_str())
            .field("len", &self.contents.len())
            .field("mode", &format_args!("{:#o}", self.mode))
            .finish()
    }
}

/// A request that passed every check that needs no disk access: paths, modes and budget.
pub(crate) struct Payload<'a> {
    /// Sorted by path, so writes and comparisons happen in a stable order.
    pub(super) files: Vec<&'a VolumeFile>,
    /// Names that get a link in the volume root.
    pub(super) top_level: BTreeSet<&'a str>,
    /// What writing it costs in memory at most: see [`Payload::charge`].
    charge: u64,
}

impl Payload<'_> {
    /// The most memory writing this payload takes in a tmpfs: the pages [`check`] counts, plus
    /// [`INODE_BYTES`] for every file, directory and link it creates (the payload directory and
    /// `..data` included). Never less than what `statvfs` measures once it is written.
    pub(crate) fn charge(&self) -> u64 {
        self.charge
    }
}

/// Checks modes, path conflicts and the size budget of `files` against `size_limit`.
///
/// The budget counts what tmpfs will charge: every file rounded up to whole pages, plus one page
/// per top-level link (a long link target takes a page). Directories cost no pages in tmpfs.
pub(crate) fn check(files: &[VolumeFile], size_limit: u64) -> Result<Payload<'_>, VolumeError> {
    if let Some(bad) = files.iter().find(|f| f.mode & !0o777 != 0) {
        return Err(VolumeError::InvalidMode {
            path: bad.path.as_str().to_owned(),
            mode: bad.mode,
        });
    }
    check_set(files.iter().map(|f| &f.path))?;
    let mut sorted: Vec<&VolumeFile> = files.iter().collect();
    sorted.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    let top_level: BTreeSet<&str> = sorted.iter().map(|f| f.path.top_level()).collect();
    let needed = sorted
        .iter()
        .map(|f| round_up_to_pages(f.contents.len() as u64))
        .fold(0u64, u64::saturating_add)
        .saturating_add((top_level.len() as u64).saturating_mul(page_size()));
    if needed > size_limit {
        return Err(VolumeError::TooLarge {
            needed,
            limit: size_limit,
        });
    }
    // Directories inside the payload: every proper prefix of a path, counted once.
    let dirs: HashSet<&str> = sorted
        .iter()
        .flat_map(|f| {
            let path = f.path.as_str();
            path.match_indices('/').map(move |(at, _)| &path[..at])
        })
        .collect();
    // The payload directory and `..data` are the two inodes beyond files, dirs and links.
    let inodes = (sorted.len() + dirs.len() + top_level.len() + 2) as u64;
    let charge = needed.saturating_add(inodes.saturating_mul(INODE_BYTES));
    Ok(Payload {
        files: sorted,
        top_level,
        charge,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::test_support::{file, file_with_mode};

    const LIMIT: u64 = 1 << 20;

    #[test]
    fn budget_counts_pages_and_top_level_links() {
        let page = page_size();
        let files = [file("a", "x"), file("db/url", "y"), file("db/user", "")];
        // a: 1 page, db/url: 1 page, db/user: 0 pages; links: a, db.
        let needed = 4 * page;
        assert!(check(&files, needed).is_ok());
        match check(&files, needed - 1) {
            Err(VolumeError::TooLarge { needed: n, limit }) => {
                assert_eq!(n, needed);
                assert_eq!(limit, needed - 1);
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("accepted"),
        }
        assert!(check(&[], 0).is_ok());
    }

    #[test]
    fn untrusted_modes_keep_only_read_and_execute_bits() {
        for (given, kept) in [
            (0o4755, 0o555),
            (0o2755, 0o555),
            (0o1777, 0o555),
            (0o600, 0o400),
            (0o644, 0o444),
            (0o640, 0o440),
            (0o222, 0),
            (0o444, 0o444),
            (0o777_777, 0o555),
            (u32::MAX, 0o555),
        ] {
            let mode = untrusted_file_mode(given);
            assert_eq!(mode, kept, "{given:#o}");
            // Whatever a provider sends, the result passes the writer's own mode check.
            assert!(check(&[file_with_mode("a", "x", mode)], LIMIT).is_ok());
        }
    }

    #[test]
    fn check_rejects_bad_modes_and_conflicts() {
        let setuid = [file_with_mode("a", "x", 0o4755)];
        assert!(matches!(
            check(&setuid, LIMIT),
            Err(VolumeError::InvalidMode { mode: 0o4755, .. })
        ));
        let conflict = [file("a", "x"), file("a/b", "y")];
        assert!(matches!(
            check(&conflict, LIMIT),
            Err(VolumeError::Conflict(_))
        ));
    }

    #[test]
    fn debug_never_shows_contents() {
        let f = file("db/password", "hunter2-super-secret");
        let printed = format!("{f:?} {f:#?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(
            printed.contains("db/password") && printed.contains("0o444"),
            "{printed}"
        );
    }
}
