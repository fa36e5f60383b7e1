//! The atomic writer: puts a set of files into a volume so that a reader sees either the complete
//! old set or the complete new set, never a mix, the way kubelet's AtomicWriter does for Secret
//! and ConfigMap volumes (so tools that watch those volumes work unchanged).
//!
//! Layout of a volume root:
//!
//! ```text
//! ..2026_05_01_12_00_00.123456789/   the current payload (dirs 0755, files with their mode)
//! ..data -> ..2026_05_01_12_00_00.123456789
//! password -> ..data/password       one link per top-level name
//! db -> ..data/db                   (db/url lives inside the payload directory)
//! ```
//!
//! A new payload is written into a new timestamped directory, then `..data` is replaced by
//! renaming a temporary link over it: that rename is the single moment the new set becomes
//! visible. Names starting with `..` are ours alone ([`FilePath`] rejects them).
//!
//! Not for mounting (see `tmpfs`), not for deciding between publish and update, and not for
//! validating single paths (see `path`).

use std::collections::{BTreeSet, HashSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;

use zeroize::Zeroizing;

use super::error::VolumeError;
use super::path::{FilePath, check_set};
use super::tmpfs::INODE_BYTES;
use super::tmpfs::{page_size, round_up_to_pages};
use crate::secret::SecretBytes;

/// The mode callers use for files unless a request says otherwise: anyone in the pod may read.
pub const DEFAULT_FILE_MODE: u32 = 0o444;

/// The bits a mode from outside the pod's spec (a provider's file mode) may keep: read and
/// execute. Setuid, setgid and sticky have no place in a secret volume, and the volume is
/// read-only, so a write bit would only claim what the pod cannot do.
const UNTRUSTED_MODE_BITS: u32 = 0o555;

/// A mode from outside the pod's spec, made safe: only read and execute bits are kept (0o4755
/// becomes 0o555, 0o600 becomes 0o400).
pub fn untrusted_file_mode(mode: u32) -> u32 {
    mode & UNTRUSTED_MODE_BITS
}

/// Mode of the directories we create inside a payload.
const DIR_MODE: u32 = 0o755;
/// The same with an fsGroup: only the pod's group may enter.
const GROUP_DIR_MODE: u32 = 0o750;
/// The link that names the current payload directory.
const DATA_LINK: &str = "..data";
/// Where the next `..data` link is prepared before it is renamed into place.
const DATA_TMP: &str = "..data_tmp";
/// Where a new top-level link is prepared before it is renamed into place.
const LINK_TMP: &str = "..link_tmp";
/// How many names to try when a timestamped directory name is already taken (clock went back).
const NAME_ATTEMPTS: u32 = 16;

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
    files: Vec<&'a VolumeFile>,
    /// Names that get a link in the volume root.
    top_level: BTreeSet<&'a str>,
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

/// Writes payloads into one volume root. Callers serialise writers of the same root.
pub(crate) struct AtomicWriter<'a> {
    root: &'a Path,
    /// The pod's fsGroup: when set, directories are 0750 and everything is group-owned by it.
    /// `write_payload_dir` is the only place that creates files and directories, so ownership
    /// and modes are applied in one spot.
    group: Option<u32>,
}

impl<'a> AtomicWriter<'a> {
    /// A writer for the volume rooted at `root`, an existing directory.
    pub(crate) fn new(root: &'a Path, group: Option<u32>) -> Self {
        Self { root, group }
    }

    fn dir_mode(&self) -> u32 {
        if self.group.is_some() {
            GROUP_DIR_MODE
        } else {
            DIR_MODE
        }
    }

    /// Makes the volume hold exactly `payload`. Returns `false` and touches nothing when it
    /// already does. On error the previous content is left as it was.
    #[cfg(test)]
    pub(crate) fn write(&self, payload: &Payload<'_>) -> Result<bool, VolumeError> {
        Ok(self.write_reserving(payload, || Ok(()))?.is_some())
    }

    /// [`Self::write`], calling `reserve` once it is known that something will be written and
    /// before anything is: `None` when the volume already holds `payload` (nothing reserved),
    /// else what `reserve` returned. A failed `reserve` fails the write, touching nothing.
    pub(crate) fn write_reserving<R>(
        &self,
        payload: &Payload<'_>,
        reserve: impl FnOnce() -> Result<R, VolumeError>,
    ) -> Result<Option<R>, VolumeError> {
        let current = self.current_dir()?;
        if let Some(dir) = &current
            && self.holds(dir, payload)
        {
            return Ok(None);
        }
        let reserved = reserve()?;
        // Leftovers of an interrupted write would eat the second half of the tmpfs, which the
        // new payload needs while the old one is still live.
        self.remove_leftovers(current.as_deref())?;

        let new_dir = self.create_payload_dir()?;
        let staged = self
            .write_payload_dir(&new_dir, payload)
            .and_then(|()| self.add_missing_links(payload));
        let created_links = match staged {
            Ok(links) => links,
            Err(err) => {
                self.discard(&new_dir, &[]);
                return Err(err);
            }
        };
        if let Err(err) = self.swap_data_link(&new_dir) {
            self.discard(&new_dir, &created_links);
            return Err(err);
        }

        // The new set is live. What follows only tidies up: a failure leaves a dangling link or
        // a stale directory (removed by the next write), never wrong content, so it is logged.
        if let Err(err) = self.remove_old_links(payload) {
            tracing::warn!(root = %self.root.display(), error = %err, "removing old links");
        }
        if let Some(old) = current {
            let old = self.root.join(old);
            match fs::remove_dir_all(&old) {
                Err(err) if err.kind() != ErrorKind::NotFound => {
                    tracing::warn!(dir = %old.display(), error = %err, "removing old payload");
                }
                _ => {}
            }
        }
        Ok(Some(reserved))
    }

    /// First write into an empty root that nobody reads yet (a fresh tmpfs, or an empty target
    /// directory before the pod starts): the payload directory, the top-level links and then
    /// `..data` are created directly, without the listing, comparing and link renames an
    /// update needs. On error everything written is removed again.
    pub(crate) fn write_fresh(&self, payload: &Payload<'_>) -> Result<(), VolumeError> {
        let new_dir = self.create_payload_dir()?;
        let mut linked = 0;
        let written = self.write_payload_dir(&new_dir, payload).and_then(|()| {
            let mut path = PathBuffer::new(self.root);
            let root = path.len();
            let mut points_to = PathBuffer::new(Path::new(DATA_LINK));
            for name in &payload.top_level {
                path.truncate(root);
                path.push(name);
                points_to.truncate(DATA_LINK.len());
                points_to.push(name);
                symlink(points_to.as_path(), path.as_path())
                    .map_err(|e| self.io("creating link", path.as_path(), e))?;
                linked += 1;
            }
            // Last, as in an update: `..data` appearing is the moment the set is complete.
            path.truncate(root);
            path.push(DATA_LINK);
            symlink(&new_dir, path.as_path())
                .map_err(|e| self.io("creating link", path.as_path(), e))
        });
        if written.is_err() {
            let links: Vec<PathBuf> = payload
                .top_level
                .iter()
                .take(linked)
                .map(|name| self.root.join(name))
                .collect();
            self.discard(&new_dir, &links);
        }
        written
    }

    /// Removes everything a writer puts into a root: `..data`, every `..` entry (payload
    /// directories, temporary links) and the top-level links into `..data/`. Anything else
    /// (somebody else's files) stays where it is.
    pub(crate) fn remove_all(&self) -> Result<(), VolumeError> {
        let entries = fs::read_dir(self.root).map_err(|e| self.io("listing", self.root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.io("listing", self.root, e))?;
            let path = entry.path();
            if entry.file_name().as_encoded_bytes().starts_with(b"..") {
                // Never follows a link, never crosses into another filesystem.
                super::dirs::remove_tree(&path)?;
            } else if fs::read_link(&path).is_ok_and(|t| t.starts_with(DATA_LINK)) {
                fs::remove_file(&path).map_err(|e| self.io("removing link", &path, e))?;
            }
        }
        Ok(())
    }

    /// The name `..data` points to, when it is a link to one of our payload directories.
    fn current_dir(&self) -> Result<Option<OsString>, VolumeError> {
        let link = self.root.join(DATA_LINK);
        match fs::read_link(&link) {
            // Only a bare `..`-name is ours; anything else is never followed nor deleted.
            Ok(name) if is_payload_dir_name(name.as_os_str()) => Ok(Some(name.into_os_string())),
            Ok(_) => Ok(None),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(None),
            // EINVAL: it exists but is not a link; the rename of the new link will replace it.
            Err(err) if err.kind() == ErrorKind::InvalidInput => Ok(None),
            Err(err) => Err(self.io("reading link", link, err)),
        }
    }

    /// True when the payload directory `dir` and the top-level links match `payload` exactly.
    fn holds(&self, dir: &OsStr, payload: &Payload<'_>) -> bool {
        let base = self.root.join(dir);
        let links_ok = payload.top_level.iter().all(|name| {
            fs::read_link(self.root.join(name)).is_ok_and(|t| t == Path::new(DATA_LINK).join(name))
        });
        // Any I/O error while comparing just means "write it again".
        links_ok
            && payload
                .files
                .iter()
                .all(|f| file_matches(&base, f, self.group))
            && count_files(&base) == Some(payload.files.len())
    }

    /// Removes every `..` entry except `..data` and the directory it names.
    fn remove_leftovers(&self, current: Option<&OsStr>) -> Result<(), VolumeError> {
        let entries = fs::read_dir(self.root).map_err(|e| self.io("listing", self.root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.io("listing", self.root, e))?;
            let name = entry.file_name();
            if !name.as_encoded_bytes().starts_with(b"..")
                || name == DATA_LINK
                || Some(name.as_os_str()) == current
            {
                continue;
            }
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| self.io("inspecting", &path, e))?;
            let removed = if kind.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| self.io("removing leftover", &path, e))?;
        }
        Ok(())
    }

    /// Creates a fresh, empty timestamped directory and returns its name.
    fn create_payload_dir(&self) -> Result<OsString, VolumeError> {
        let base = timestamp_name(SystemTime::now());
        let mut path = PathBuffer::new(self.root);
        let root = path.len();
        for attempt in 0..NAME_ATTEMPTS {
            let suffixed = (attempt > 0).then(|| format!("{base}_{attempt}"));
            path.truncate(root);
            path.push(suffixed.as_deref().unwrap_or(&base));
            match self.create_dir(path.as_path()) {
                Ok(()) => return Ok(suffixed.unwrap_or(base).into()),
                Err(err) if err.kind() == ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(self.io("creating directory", path.as_path(), err)),
            }
        }
        Err(self.io(
            "creating directory",
            self.root.join(base),
            ErrorKind::AlreadyExists.into(),
        ))
    }

    /// Writes every file of `payload` below `dir`, creating directories as needed.
    fn write_payload_dir(&self, dir: &OsStr, payload: &Payload<'_>) -> Result<(), VolumeError> {
        let mut path = PathBuffer::new(self.root);
        path.push(dir);
        let base = path.len();
        let mut made: HashSet<PathBuf> = HashSet::new();
        for file in &payload.files {
            path.truncate(base);
            // A `FilePath` has at least one segment, so the last one pushed names the file.
            let mut segments = file.path.segments().peekable();
            while let Some(segment) = segments.next() {
                path.push(segment);
                let is_dir = segments.peek().is_some();
                if is_dir && !made.contains(path.as_path()) {
                    self.create_dir(path.as_path())
                        .map_err(|e| self.io("creating directory", path.as_path(), e))?;
                    made.insert(path.as_path().to_path_buf());
                }
            }
            self.create_file(path.as_path(), file)
                .map_err(|e| self.io("writing", path.as_path(), e))?;
        }
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> std::io::Result<()> {
        DirBuilder::new().mode(self.dir_mode()).create(path)?;
        if let Some(gid) = self.group {
            nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(gid)))?;
        }
        // The layout promises exactly this mode, whatever the umask.
        super::modes::settle(path, self.dir_mode())
    }

    fn create_file(&self, path: &Path, file: &VolumeFile) -> std::io::Result<()> {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)?;
        out.write_all(file.contents.expose())?;
        if let Some(gid) = self.group {
            nix::unistd::fchown(&out, None, Some(nix::unistd::Gid::from_raw(gid)))?;
        }
        // On the open descriptor, after fchown: the umask must not weaken or alter the mode.
        super::modes::settle_file(&out, file.mode)
    }

    /// Makes sure every top-level name is a link `X -> ..data/X`. Returns the links it created,
    /// so that a failed swap can remove them again. A new link dangles until the swap, which a
    /// reader cannot tell from the name being absent.
    fn add_missing_links(&self, payload: &Payload<'_>) -> Result<Vec<PathBuf>, VolumeError> {
        let mut created = Vec::new();
        let result = payload.top_level.iter().try_for_each(|name| {
            let link = self.root.join(name);
            let wanted = Path::new(DATA_LINK).join(name);
            if fs::read_link(&link).is_ok_and(|t| t == wanted) {
                return Ok(());
            }
            self.replace_with_link(&wanted, LINK_TMP, &link)?;
            created.push(link);
            Ok(())
        });
        match result {
            Ok(()) => Ok(created),
            Err(err) => {
                self.remove_links(&created);
                Err(err)
            }
        }
    }

    /// The commit point: `..data` now names `new_dir`.
    fn swap_data_link(&self, new_dir: &OsStr) -> Result<(), VolumeError> {
        self.replace_with_link(Path::new(new_dir), DATA_TMP, &self.root.join(DATA_LINK))
    }

    /// Atomically makes `at` a link to `points_to`, via a temporary link named `tmp_name`.
    fn replace_with_link(
        &self,
        points_to: &Path,
        tmp_name: &str,
        at: &Path,
    ) -> Result<(), VolumeError> {
        let tmp = self.root.join(tmp_name);
        match fs::remove_file(&tmp) {
            Err(err) if err.kind() != ErrorKind::NotFound => {
                return Err(self.io("removing leftover", tmp, err));
            }
            _ => {}
        }
        symlink(points_to, &tmp).map_err(|e| self.io("creating link", &tmp, e))?;
        fs::rename(&tmp, at).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            self.io("renaming link into place", at, e)
        })
    }

    /// Removes top-level links of names that are no longer in `payload`. Only our own links
    /// (those pointing into `..data/`) are touched.
    fn remove_old_links(&self, payload: &Payload<'_>) -> Result<(), VolumeError> {
        let entries = fs::read_dir(self.root).map_err(|e| self.io("listing", self.root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.io("listing", self.root, e))?;
            let name = entry.file_name();
            let keep = name.as_encoded_bytes().starts_with(b"..")
                || name.to_str().is_some_and(|n| payload.top_level.contains(n));
            if keep {
                continue;
            }
            let path = entry.path();
            if fs::read_link(&path).is_ok_and(|t| t.starts_with(DATA_LINK)) {
                fs::remove_file(&path).map_err(|e| self.io("removing link", &path, e))?;
            }
        }
        Ok(())
    }

    /// Best-effort undo of a write that did not reach the swap.
    fn discard(&self, new_dir: &OsStr, links: &[PathBuf]) {
        self.remove_links(links);
        let dir = self.root.join(new_dir);
        if let Err(err) = fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %err, "removing unfinished payload");
        }
    }

    fn remove_links(&self, links: &[PathBuf]) {
        for link in links {
            if let Err(err) = fs::remove_file(link) {
                tracing::warn!(link = %link.display(), error = %err, "removing new link");
            }
        }
    }

    fn io(&self, op: &'static str, path: impl Into<PathBuf>, err: std::io::Error) -> VolumeError {
        VolumeError::io(op, path, self.root, err)
    }
}

/// A path built in one buffer that is truncated and extended again for every name below it: a
/// publish otherwise allocated a new path for each directory, file and link it made.
struct PathBuffer {
    bytes: Vec<u8>,
}

impl PathBuffer {
    /// A buffer holding `start`; room for a few names below it.
    // Inlined: out of line it would be a publish-path function missing from the code layout
    // list (agent/build.rs), as it was in a first version without the hint.
    #[inline]
    fn new(start: &Path) -> Self {
        let start = start.as_os_str().as_bytes();
        let mut bytes = Vec::with_capacity(start.len() + 96);
        bytes.extend_from_slice(start);
        Self { bytes }
    }

    /// Appends `/name` (no second slash after one that ends the buffer).
    fn push(&mut self, name: impl AsRef<OsStr>) {
        if self.bytes.last().is_some_and(|&b| b != b'/') {
            self.bytes.push(b'/');
        }
        self.bytes.extend_from_slice(name.as_ref().as_bytes());
    }

    /// The length to [`Self::truncate`] back to.
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn truncate(&mut self, len: usize) {
        self.bytes.truncate(len);
    }

    fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.bytes))
    }
}

/// True when `base/file.path` is a regular file with the same mode and bytes.
fn file_matches(base: &Path, file: &VolumeFile, group: Option<u32>) -> bool {
    let path = base.join(file.path.as_str());
    let Ok(meta) = fs::symlink_metadata(&path) else {
        return false;
    };
    if !meta.is_file()
        || meta.mode() & 0o7777 != file.mode
        || meta.len() != file.contents.len() as u64
        || group.is_some_and(|gid| meta.gid() != gid)
    {
        return false;
    }
    let Ok(mut reader) = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
    else {
        return false;
    };
    // The old bytes are as secret as the new ones: keep them in a zeroizing buffer.
    let mut old = Zeroizing::new(Vec::with_capacity(file.contents.len()));
    reader.read_to_end(&mut old).is_ok() && old.as_slice() == file.contents.expose()
}

/// Number of regular files below `dir`, or `None` if anything else (a link, a device, an
/// unreadable directory) is found.
fn count_files(dir: &Path) -> Option<usize> {
    let mut count = 0;
    for entry in fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let kind = entry.file_type().ok()?;
        if kind.is_file() {
            count += 1;
        } else if kind.is_dir() {
            count += count_files(&entry.path())?;
        } else {
            return None;
        }
    }
    Some(count)
}

/// A name our writer could have given a payload directory: one `..`-prefixed path component.
fn is_payload_dir_name(name: &OsStr) -> bool {
    let bytes = name.as_encoded_bytes();
    bytes.starts_with(b"..")
        && bytes.len() > 2
        && !bytes.contains(&b'/')
        && name != DATA_LINK
        && name != DATA_TMP
}

/// `..YYYY_MM_DD_HH_MM_SS.<nanoseconds>` in UTC, the naming kubelet's AtomicWriter uses.
fn timestamp_name(now: SystemTime) -> String {
    // A clock before 1970 or past jiff's range would be broken; the epoch still names a fresh
    // directory (collisions are retried with a suffix).
    let at = Timestamp::try_from(now).unwrap_or(Timestamp::UNIX_EPOCH);
    format!("..{}", at.strftime("%Y_%m_%d_%H_%M_%S.%9f"))
}

#[cfg(test)]
mod tests;
