//! Exact modes for what volumes create, with as few system calls as possible. `mkdir(2)` and
//! `open(2)` apply the process umask to the mode they are given; an explicit `chmod` afterwards is
//! needed only when the umask could have cleared a requested bit (or for bits the umask does not
//! cover). With the usual umask (0022) and the modes volumes use (0755/0750 directories, 0444 and
//! tighter files) it never is, which spares a warm publish five system calls.
//!
//! This holds only while nothing changes the process umask after it is first read here: Latchkey
//! never does (the CSI socket is bound without it, see `csi::server::bind`), and a process that
//! embeds this library must not either.
//!
//! Not for choosing modes (the writer and `dirs` do that).

use std::fs::{self, File, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::OnceLock;

/// Gives `path`, just created with `mode`, exactly that mode: `chmod` only when the umask could
/// have changed it.
pub(crate) fn settle(path: &Path, mode: u32) -> io::Result<()> {
    if needs_chmod(mode) {
        fs::set_permissions(path, Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// [`settle`] for a file just created with `mode` and still open (`fchmod`, after any `fchown`,
/// which may clear set-id bits).
pub(crate) fn settle_file(file: &File, mode: u32) -> io::Result<()> {
    if needs_chmod(mode) {
        file.set_permissions(Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Whether something just created with `mode` may have fewer bits than `mode` asks for, so that
/// its mode must be set explicitly. Always true when the umask cannot be read.
fn needs_chmod(mode: u32) -> bool {
    needs_chmod_under(process_umask(), mode)
}

fn needs_chmod_under(umask: Option<u32>, mode: u32) -> bool {
    match umask {
        // Set-id and sticky bits: mkdir ignores some, inheritance adds others; always set them.
        Some(mask) => mode & !0o777 != 0 || mode & mask != 0,
        None => true,
    }
}

/// The umask of this process, read once from `/proc/self/status` (Linux 4.7 and later). Reading
/// it with `umask(2)` would change it for a moment, which is the very thing to avoid.
fn process_umask() -> Option<u32> {
    static UMASK: OnceLock<Option<u32>> = OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| parse_umask(&status))
    })
}

/// The `Umask:` line of a `/proc/<pid>/status` text.
fn parse_umask(status: &str) -> Option<u32> {
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix("Umask:"))?
        .trim();
    u32::from_str_radix(value, 8).ok().filter(|m| *m <= 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_umask_line_is_read_as_octal() {
        let status = "Name:\tlatchkey\nUmask:\t0022\nState:\tR (running)\n";
        assert_eq!(parse_umask(status), Some(0o022));
        assert_eq!(parse_umask("Umask:\t0777\n"), Some(0o777));
        assert_eq!(parse_umask("Name:\tx\n"), None);
        assert_eq!(parse_umask("Umask:\t9\n"), None);
        assert_eq!(parse_umask("Umask:\t01000\n"), None);
    }

    #[test]
    fn a_mode_is_set_explicitly_whenever_the_umask_could_have_cleared_a_bit() {
        let usual = Some(0o022);
        for mode in [0o755, 0o750, 0o444, 0o440, 0o400, 0o555, 0o500] {
            assert!(!needs_chmod_under(usual, mode), "{mode:o}");
        }
        // Write bits for group or others are what 0022 clears.
        assert!(needs_chmod_under(usual, 0o664));
        assert!(needs_chmod_under(usual, 0o777));
        // A strict umask clears read bits too.
        assert!(needs_chmod_under(Some(0o077), 0o444));
        assert!(needs_chmod_under(Some(0o027), 0o755));
        assert!(!needs_chmod_under(Some(0o027), 0o750));
        // Bits beyond the permissions are always set explicitly.
        assert!(needs_chmod_under(Some(0), 0o2750));
        assert!(needs_chmod_under(Some(0), 0o1755));
        // Unknown umask: always.
        assert!(needs_chmod_under(None, 0o400));
        assert!(!needs_chmod_under(Some(0), 0o777));
    }

    #[test]
    fn this_process_umask_is_readable() {
        // The tests run on Linux with /proc mounted: the fast path must be reachable here.
        assert!(process_umask().is_some());
    }
}
