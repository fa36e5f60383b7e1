//! Entries -> files: `target.files.items` picks keys and paths, `defaultMode` and per-item `mode`
//! set permissions (default 0444: readable by any user of the pod, writable by none).
//!
//! A file's mode, first match wins: its item's `mode`, then `defaultMode` (the pod author's
//! choice always wins), then the mode the backend gave the value (only providers that return
//! files give one, already made safe), then 0444. The volume is read-only, so write bits are
//! dropped from the pod author's modes as from the backend's: `defaultMode: 0777` gives 0555.

use std::collections::BTreeMap;

use super::{Context, ResolveError};
use crate::api::external_secret::Target;
use crate::secret::SecretBytes;
use crate::volume::{DEFAULT_FILE_MODE, FilePath, VolumeFile, untrusted_file_mode};

/// Lays the entries out as files.
pub fn files(
    ctx: &Context,
    target: Option<&Target>,
    mut entries: BTreeMap<String, SecretBytes>,
) -> Result<Vec<VolumeFile>, ResolveError> {
    let fail = |reason: String| ResolveError::Files {
        ctx: ctx.boxed(),
        reason,
    };
    let layout = target.and_then(|t| t.files.as_ref());
    let default_mode = layout
        .and_then(|f| f.default_mode)
        .map(|m| mode(m).ok_or_else(|| fail(format!("target.files.defaultMode {m} is negative"))))
        .transpose()?;
    // The ExternalSecret's default, else the backend's mode for this value, else 0444.
    let fallback = |contents: &SecretBytes| {
        default_mode
            .or(contents.file_mode())
            .unwrap_or(DEFAULT_FILE_MODE)
    };
    let path = |p: &str| FilePath::parse(p).map_err(|e| fail(e.to_string()));
    let items = layout.map(|f| f.items.as_slice()).unwrap_or_default();
    if items.is_empty() {
        return entries
            .into_iter()
            .map(|(name, contents)| {
                Ok(VolumeFile {
                    path: path(&name)?,
                    mode: fallback(&contents),
                    contents,
                })
            })
            .collect();
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let contents = entries.remove(&item.key).ok_or_else(|| {
                fail(format!(
                    "target.files.items[{i}] names key \"{}\", which the ExternalSecret does not produce",
                    item.key
                ))
            })?;
            let mode = match item.mode {
                Some(m) => mode(m)
                    .ok_or_else(|| fail(format!("target.files.items[{i}].mode {m} is negative")))?,
                None => fallback(&contents),
            };
            Ok(VolumeFile { path: path(&item.path)?, contents, mode })
        })
        .collect()
}

/// A mode from the ExternalSecret (validated to 0..=0o777), under the same rule as a provider's:
/// the volume is mounted read-only, so `-rwxrwxrwx` would claim a write no one in the pod can do.
fn mode(m: i32) -> Option<u32> {
    u32::try_from(m).ok().map(untrusted_file_mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::external_secret::{FileItem, Files};

    fn entries() -> BTreeMap<String, SecretBytes> {
        BTreeMap::from([
            ("a".to_string(), SecretBytes::from("1")),
            ("b".into(), SecretBytes::from("2")),
        ])
    }

    #[test]
    fn every_entry_is_a_file_with_the_default_mode() {
        let f = files(&super::super::tests::ctx(), None, entries()).unwrap();
        let got: Vec<_> = f.iter().map(|f| (f.path.as_str(), f.mode)).collect();
        assert_eq!(got, [("a", 0o444), ("b", 0o444)]);
    }

    #[test]
    fn items_choose_keys_paths_and_modes() {
        let target = Target {
            files: Some(Files {
                default_mode: Some(0o440),
                items: vec![
                    FileItem {
                        key: "a".into(),
                        path: "db/url".into(),
                        mode: Some(0o400),
                    },
                    FileItem {
                        key: "b".into(),
                        path: "b.txt".into(),
                        mode: None,
                    },
                ],
            }),
            ..Default::default()
        };
        let f = files(&super::super::tests::ctx(), Some(&target), entries()).unwrap();
        let got: Vec<_> = f.iter().map(|f| (f.path.as_str(), f.mode)).collect();
        assert_eq!(got, [("db/url", 0o400), ("b.txt", 0o440)]);
    }

    #[test]
    fn user_set_modes_lose_their_write_bits() {
        let target = Target {
            files: Some(Files {
                default_mode: Some(0o777),
                items: vec![
                    FileItem {
                        key: "a".into(),
                        path: "a".into(),
                        mode: Some(0o640),
                    },
                    FileItem {
                        key: "b".into(),
                        path: "b".into(),
                        mode: None,
                    },
                ],
            }),
            ..Default::default()
        };
        let f = files(&super::super::tests::ctx(), Some(&target), entries()).unwrap();
        let got: Vec<_> = f.iter().map(|f| (f.path.as_str(), f.mode)).collect();
        assert_eq!(got, [("a", 0o440), ("b", 0o555)]);
        // Without items, defaultMode applies to every entry; write-only leaves nothing.
        let write_only = Target {
            files: Some(Files {
                default_mode: Some(0o222),
                items: vec![],
            }),
            ..Default::default()
        };
        let f = files(&super::super::tests::ctx(), Some(&write_only), entries()).unwrap();
        assert!(f.iter().all(|f| f.mode == 0), "{f:?}");
    }

    #[test]
    fn the_external_secret_modes_win_over_the_backend_mode() {
        let from_backend = || {
            BTreeMap::from([
                (
                    "a".to_string(),
                    SecretBytes::from("1").with_file_mode(Some(0o555)),
                ),
                (
                    "b".into(),
                    SecretBytes::from("2").with_file_mode(Some(0o400)),
                ),
                ("c".into(), SecretBytes::from("3")),
            ])
        };
        let modes = |target: Option<&Target>| {
            files(&super::super::tests::ctx(), target, from_backend())
                .unwrap()
                .iter()
                .map(|f| (f.path.as_str().to_owned(), f.mode))
                .collect::<Vec<_>>()
        };
        let got = |pairs: &[(&str, u32)]| {
            pairs
                .iter()
                .map(|(p, m)| (p.to_string(), *m))
                .collect::<Vec<_>>()
        };
        // No layout: the backend's modes, 0444 where it gave none.
        assert_eq!(
            modes(None),
            got(&[("a", 0o555), ("b", 0o400), ("c", 0o444)])
        );
        // An item's mode beats the backend's; an item without one keeps the backend's.
        let items = Target {
            files: Some(Files {
                default_mode: None,
                items: vec![
                    FileItem {
                        key: "a".into(),
                        path: "x".into(),
                        mode: Some(0o440),
                    },
                    FileItem {
                        key: "b".into(),
                        path: "y".into(),
                        mode: None,
                    },
                ],
            }),
            ..Default::default()
        };
        assert_eq!(modes(Some(&items)), got(&[("x", 0o440), ("y", 0o400)]));
        // defaultMode beats the backend's for every file.
        let default = Target {
            files: Some(Files {
                default_mode: Some(0o444),
                items: vec![],
            }),
            ..Default::default()
        };
        assert_eq!(
            modes(Some(&default)),
            got(&[("a", 0o444), ("b", 0o444), ("c", 0o444)])
        );
    }

    #[test]
    fn hostile_names_and_unknown_items_are_refused_with_context() {
        let mut e = entries();
        e.insert("../escape".into(), SecretBytes::from("x"));
        let err = files(&super::super::tests::ctx(), None, e)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("namespace \"shop\", ExternalSecret \"db\""),
            "{err}"
        );
        assert!(err.contains("escape"), "{err}");

        let target = Target {
            files: Some(Files {
                default_mode: None,
                items: vec![FileItem {
                    key: "zzz".into(),
                    path: "z".into(),
                    mode: None,
                }],
            }),
            ..Default::default()
        };
        let err = files(&super::super::tests::ctx(), Some(&target), entries()).unwrap_err();
        assert!(
            err.to_string().contains("items[0] names key \"zzz\""),
            "{err}"
        );
    }
}
