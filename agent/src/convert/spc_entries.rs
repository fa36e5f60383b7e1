//! The files of a SecretProviderClass as the provider converters read them: an [`Entry`] per
//! object, grouped per store, with its file name and mode checked against Latchkey's rules.

use super::fields::Fields;
use super::notes::{Notes, quoted};
use crate::api::RemoteRef;
use crate::api::store::StoreProvider;

/// One file of the class: its name in the volume and where its value comes from.
#[derive(Debug, Clone)]
pub struct Entry {
    /// File name in the volume (`secretKey`).
    pub secret_key: String,
    /// The remote value.
    pub remote_ref: RemoteRef,
    /// File mode from `filePermission`, if any.
    pub mode: Option<i32>,
    /// Where the entry was defined, for notes.
    pub path: String,
}

/// The entries one store serves (AWS: all of them; Vault: those of one KV mount).
#[derive(Debug)]
pub struct Group {
    /// Appended to the class name for every group but the first (`db-kv`).
    pub suffix: String,
    /// The store's provider block.
    pub provider: StoreProvider,
    /// The files.
    pub entries: Vec<Entry>,
}

/// Parses a CSI `filePermission` (octal text such as `0640`).
pub fn file_mode(text: &str) -> Option<i32> {
    let digits = text.trim_start_matches("0o");
    i32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| (0..=0o777).contains(m))
}

/// Reads an object's `filePermission`; notes (and ignores) one that is not an octal mode.
pub fn read_mode(f: &mut Fields<'_>, notes: &mut Notes) -> Option<i32> {
    let path = f.at("filePermission");
    let text = f.string("filePermission", notes)?;
    let mode = file_mode(&text);
    if mode.is_none() {
        notes.warn(
            path,
            format!(
                "{} is not an octal file mode (e.g. 0640); not carried over",
                quoted(&text)
            ),
        );
    }
    mode
}

/// Checks an entry's file name against Latchkey's rules; notes a name that breaks them.
pub fn file_name_ok(path: &str, name: &str, notes: &mut Notes) -> bool {
    let ok = crate::api::rules::FILE_PATH.is_match(name)
        && name.chars().count() <= crate::api::rules::MAX_SECRET_KEY_LEN;
    if !ok {
        notes.warn(
            path,
            format!(
                "file name {} {}; object not carried over",
                quoted(name),
                crate::api::rules::FILE_PATH.message
            ),
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_modes_are_octal() {
        assert_eq!(file_mode("0640"), Some(0o640));
        assert_eq!(file_mode("644"), Some(0o644));
        assert_eq!(file_mode("0999"), None);
        assert_eq!(file_mode("1777"), None);
    }
}
