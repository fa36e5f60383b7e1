//! A reader for `/proc/self/mountinfo`: which filesystem is mounted where, from what source and
//! with which options. The volume code uses it to recognise its own tmpfs mounts (source
//! `latchkey`) and to refuse to touch anybody else's; tests use it to check mount options.
//!
//! Not for mounting or unmounting (see `tmpfs`), and not a general mount table library: it knows
//! the fields Latchkey needs and nothing more. The format is described in proc(5).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::error::VolumeError;

/// `target` as the kernel prints it in mountinfo: symlinks in its parents resolved. The target
/// itself is never a link (publish refuses those), so only the parent is canonicalised.
pub(crate) fn resolved(target: &Path) -> PathBuf {
    match (target.parent(), target.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or_else(|_| target.to_path_buf()),
        _ => target.to_path_buf(),
    }
}

/// Where the kernel exposes the mount table of the calling process's mount namespace.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Unique id of the mount.
    pub mount_id: u32,
    /// Id of the parent mount.
    pub parent_id: u32,
    /// The directory of the filesystem that forms the root of this mount (`/` unless a bind mount).
    pub root: PathBuf,
    /// Where it is mounted, relative to the process's root, unescaped.
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. `rw`, `nosuid`, `nodev`, `noexec`, `relatime`.
    pub mount_options: Vec<String>,
    /// Filesystem type, e.g. `tmpfs`.
    pub fstype: String,
    /// Filesystem-specific source, e.g. `latchkey` for our tmpfs mounts.
    pub source: String,
    /// Per-superblock options, e.g. `rw`, `size=8192k`, `mode=755`.
    pub super_options: Vec<String>,
}

impl MountEntry {
    /// True when the per-mount options contain `option` exactly (e.g. `"nosuid"`).
    pub fn has_mount_option(&self, option: &str) -> bool {
        self.mount_options.iter().any(|o| o == option)
    }

    /// The value of a `key=value` superblock option, e.g. `super_option("size")` -> `"8192k"`.
    pub fn super_option(&self, key: &str) -> Option<&str> {
        self.super_options
            .iter()
            .find_map(|o| o.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
    }
}

/// Parses a whole mountinfo text.
pub fn parse(text: &[u8]) -> Result<Vec<MountEntry>, VolumeError> {
    lines(text)
        .map(|(number, line)| parse_line(line, number))
        .collect()
}

/// Reads and parses `/proc/self/mountinfo`.
pub fn read() -> Result<Vec<MountEntry>, VolumeError> {
    parse(&read_raw()?)
}

/// The topmost mount whose mount point is exactly `path` (which should be absolute and free of
/// symlinks, as the kernel prints resolved paths), or `None` when `path` is not a mount point.
pub fn find(path: &Path) -> Result<Option<MountEntry>, VolumeError> {
    find_in(&read_raw()?, path)
}

/// Like [`find`], over a given mountinfo text.
pub fn find_in(text: &[u8], path: &Path) -> Result<Option<MountEntry>, VolumeError> {
    let wanted = path.as_os_str().as_bytes();
    let mut found = None;
    // Only lines whose mount point matches are parsed fully: a node with a thousand volumes has a
    // long mount table and this runs on every publish. Later lines are mounted later, so the last
    // match is the one on top.
    for (number, line) in lines(text) {
        let point = line.split(|b| *b == b' ').nth(4);
        if point.is_some_and(|p| unescape(p) == wanted) {
            found = Some(parse_line(line, number)?);
        }
    }
    Ok(found)
}

/// All mounts whose mount point is strictly below `path`.
pub fn below(path: &Path) -> Result<Vec<MountEntry>, VolumeError> {
    Ok(read()?
        .into_iter()
        .filter(|m| m.mount_point != path && m.mount_point.starts_with(path))
        .collect())
}

fn read_raw() -> Result<Vec<u8>, VolumeError> {
    std::fs::read(MOUNTINFO).map_err(|source| VolumeError::Io {
        op: "reading",
        path: PathBuf::from(MOUNTINFO),
        source,
    })
}

/// Non-empty lines with their 1-based numbers.
fn lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    text.split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(index, line)| (index + 1, line))
}

/// Parses one line:
/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`.
fn parse_line(line: &[u8], number: usize) -> Result<MountEntry, VolumeError> {
    let bad = |reason| VolumeError::MountInfo {
        line: number,
        reason,
    };
    let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
    // Zero or more optional fields sit between the mount options and a lone "-".
    let separator = fields
        .iter()
        .skip(6)
        .position(|f| *f == b"-")
        .map(|p| p + 6)
        .ok_or_else(|| bad("no '-' separator after the optional fields"))?;
    if fields.len() < separator + 4 {
        return Err(bad("fewer than 3 fields after the '-' separator"));
    }
    let number_field = |field: &[u8], what| {
        std::str::from_utf8(field)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .ok_or_else(|| bad(what))
    };
    Ok(MountEntry {
        mount_id: number_field(fields[0], "mount id is not a number")?,
        parent_id: number_field(fields[1], "parent id is not a number")?,
        root: path_field(fields[3]),
        mount_point: path_field(fields[4]),
        mount_options: options(fields[5]),
        fstype: text_field(fields[separator + 1]),
        source: text_field(fields[separator + 2]),
        super_options: options(fields[separator + 3]),
    })
}

fn path_field(field: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape(field)))
}

fn text_field(field: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

fn options(field: &[u8]) -> Vec<String> {
    text_field(field)
        .split(',')
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Undoes the kernel's escaping of space, tab, newline and backslash as `\ooo` octal; anything
/// that is not a backslash followed by three octal digits is kept as it is.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(digits) = field.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            // Three octal digits can encode up to 0o777; the kernel only emits bytes (<= 0o377).
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
25 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
40 25 0:39 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/db/mount rw,nosuid,nodev,noexec,relatime shared:20 - tmpfs latchkey rw,size=16392k,mode=755,inode64
41 25 0:40 / /mnt/with\\040space\\011tab rw,relatime - tmpfs other rw,size=1024k
42 25 0:41 /sub /mnt/bind rw,relatime shared:3 master:4 propagate_from:5 - ext4 /dev/sda1 rw
43 40 0:42 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/db/mount rw,relatime - tmpfs other rw
44 25 0:43 / /mnt/back\\134slash rw - tmpfs weird\\040source rw
";

    #[test]
    fn parses_every_field() {
        let entries = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(entries.len(), 7);
        let tmpfs = &entries[2];
        assert_eq!(tmpfs.mount_id, 40);
        assert_eq!(tmpfs.parent_id, 25);
        assert_eq!(tmpfs.root, Path::new("/"));
        assert_eq!(
            tmpfs.mount_point,
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/db/mount")
        );
        assert_eq!(tmpfs.fstype, "tmpfs");
        assert_eq!(tmpfs.source, "latchkey");
        for option in ["nosuid", "nodev", "noexec", "rw"] {
            assert!(tmpfs.has_mount_option(option), "{option}");
        }
        assert!(!tmpfs.has_mount_option("nosu"));
        assert_eq!(tmpfs.super_option("size"), Some("16392k"));
        assert_eq!(tmpfs.super_option("mode"), Some("755"));
        assert_eq!(tmpfs.super_option("siz"), None);
        assert_eq!(tmpfs.super_option("inode64"), None);
    }

    #[test]
    fn unescapes_octal_sequences() {
        let entries = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(entries[3].mount_point, Path::new("/mnt/with space\ttab"));
        assert_eq!(entries[6].mount_point, Path::new("/mnt/back\\slash"));
        assert_eq!(entries[6].source, "weird source");
        assert_eq!(unescape(b"a\\012b"), b"a\nb");
        // Not an escape: kept verbatim.
        assert_eq!(unescape(b"a\\9b\\"), b"a\\9b\\");
        assert_eq!(unescape(b"\\777"), b"\\777");
        assert_eq!(unescape(b"\\04"), b"\\04");
    }

    #[test]
    fn handles_any_number_of_optional_fields() {
        let entries = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(entries[1].fstype, "ext4");
        assert_eq!(entries[4].root, Path::new("/sub"));
        assert_eq!(entries[4].source, "/dev/sda1");
        assert_eq!(entries[3].fstype, "tmpfs");
        assert_eq!(entries[3].source, "other");
    }

    #[test]
    fn find_returns_the_topmost_mount() {
        let point = Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/db/mount");
        let top = find_in(SAMPLE.as_bytes(), point).unwrap().unwrap();
        assert_eq!(top.mount_id, 43);
        assert_eq!(top.source, "other");
        let spaced = find_in(SAMPLE.as_bytes(), Path::new("/mnt/with space\ttab")).unwrap();
        assert_eq!(spaced.unwrap().mount_id, 41);
        assert_eq!(find_in(SAMPLE.as_bytes(), Path::new("/mnt")).unwrap(), None);
        assert_eq!(
            find_in(SAMPLE.as_bytes(), Path::new("/mnt/with")).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_lines_are_errors_with_line_numbers() {
        let text =
            b"22 1 0:21 / /proc rw - proc proc rw\n23 1 0:22 / /x rw shared:1 tmpfs src rw\n";
        match parse(text) {
            Err(VolumeError::MountInfo { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
        match parse(b"x 1 0:21 / /proc rw - proc proc rw") {
            Err(VolumeError::MountInfo { line: 1, reason }) => {
                assert!(reason.contains("mount id"));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(b"22 1 0:21 / /proc rw - proc").is_err());
        assert_eq!(parse(b"").unwrap(), vec![]);
    }

    #[test]
    fn reads_the_real_table() {
        let entries = read().unwrap();
        let root = find(Path::new("/")).unwrap();
        assert!(root.is_some(), "{entries:?}");
        assert!(entries.iter().any(|e| e.mount_point == Path::new("/proc")));
    }
}
