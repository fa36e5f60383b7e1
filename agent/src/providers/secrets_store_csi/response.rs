//! The Mount response as entries: each returned file is one, named by its path. Paths pass the
//! agent's own file-path rules (relative, no `.`/`..`/empty segments, nothing starting with `..`),
//! since a provider is a program the agent does not trust with the volume's layout. Modes are
//! made safe ([`untrusted_file_mode`]: read and execute bits only) and ride beside the bytes,
//! so resolution can use them where the ExternalSecret sets no mode of its own.

use std::collections::BTreeMap;

use csi_proto::secrets_store::v1alpha1::{File, MountResponse, ObjectVersion};

use super::super::ProviderError;
use crate::secret::SecretBytes;
use crate::telemetry::escape::printable;
use crate::volume::{FilePath, untrusted_file_mode};

/// Longest part of a provider's error code that reaches an error.
const MAX_CODE_CHARS: usize = 100;

/// Most files one Mount may return: more is almost certainly a mistake.
pub const MAX_FILES: usize = super::super::MAX_FIND_RESULTS;

/// What one Mount returned: the files by path, and the object versions to send back next time.
pub struct Mounted {
    /// Entry name (the file's path) to contents.
    pub files: BTreeMap<String, SecretBytes>,
    /// The provider's object versions.
    pub versions: Vec<ObjectVersion>,
}

/// Checks and takes the response of provider `what`.
pub fn mounted(what: &str, response: MountResponse) -> Result<Mounted, ProviderError> {
    let MountResponse {
        object_version,
        error,
        files,
    } = response;
    if let Some(code) = error.map(|e| e.code).filter(|c| !c.is_empty()) {
        return Err(ProviderError::Unavailable(format!(
            "{what} answered with error code {:?}",
            printable(&code, MAX_CODE_CHARS)
        )));
    }
    if files.is_empty() && !object_version.is_empty() {
        return Err(ProviderError::Config(format!(
            "{what} wrote its files itself (it returned object versions but no files): Latchkey \
             never lets a provider write to disk and needs a provider that returns its files in \
             the Mount response (\"driver-written files\", secrets-store-csi-driver issue #551; \
             upgrade the provider)"
        )));
    }
    if files.len() > MAX_FILES {
        return Err(ProviderError::Unavailable(format!(
            "{what} returned {} files, more than {MAX_FILES}",
            files.len()
        )));
    }
    let mut out = BTreeMap::new();
    for File {
        path,
        mode,
        contents,
    } in files
    {
        let checked = FilePath::parse(&path).map_err(|e| {
            ProviderError::Unavailable(format!("{what} returned a file with an unusable path: {e}"))
        })?;
        let mode = file_mode(mode).ok_or_else(|| {
            ProviderError::Unavailable(format!(
                "{what} returned the file {} with an unusable mode {mode}",
                checked.as_str()
            ))
        })?;
        let name = checked.as_str().to_owned();
        let value = SecretBytes::new(contents).with_file_mode(mode);
        if out.insert(name, value).is_some() {
            return Err(ProviderError::Unavailable(format!(
                "{what} returned the file {} twice",
                checked.as_str()
            )));
        }
    }
    Ok(Mounted {
        files: out,
        versions: object_version,
    })
}

/// The mode of a returned file, made safe: `Some(None)` for 0, which is what a provider that
/// sets no mode sends (proto3 cannot tell it from an explicit 0, and a file nobody may read is
/// never what a provider means); `None` for a negative mode, which is refused.
fn file_mode(mode: i32) -> Option<Option<u32>> {
    let mode = u32::try_from(mode).ok()?;
    Some((mode != 0).then(|| untrusted_file_mode(mode)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::secrets_store::v1alpha1::Error;

    fn file(path: &str, contents: &str) -> File {
        File {
            path: path.into(),
            mode: 0o644,
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn response(files: Vec<File>) -> MountResponse {
        MountResponse {
            object_version: vec![ObjectVersion {
                id: "secret/db".into(),
                version: "1".into(),
            }],
            error: None,
            files,
        }
    }

    #[test]
    fn files_become_entries_and_hostile_paths_are_refused() {
        let m = mounted(
            "p",
            response(vec![file("db/password", "s3cret"), file("api", "k")]),
        )
        .unwrap();
        assert_eq!(m.files.keys().collect::<Vec<_>>(), ["api", "db/password"]);
        assert_eq!(m.versions.len(), 1);
        for bad in ["../x", "/abs", "a//b", "", "..data", "a/./b"] {
            let err = mounted(
                "secretsStoreCSI provider p",
                response(vec![file(bad, "s3cret")]),
            )
            .err()
            .unwrap()
            .to_string();
            assert!(
                err.contains("secretsStoreCSI provider p") && err.contains("unusable path"),
                "{err}"
            );
            assert!(!err.contains("s3cret"), "{err}");
        }
        let dup = mounted("p", response(vec![file("a", "1"), file("a", "2")]));
        assert!(dup.err().unwrap().to_string().contains("twice"));
    }

    #[test]
    fn modes_are_made_safe_and_ride_beside_the_bytes() {
        let with_mode = |path: &str, mode: i32| File {
            path: path.into(),
            mode,
            contents: b"v".to_vec(),
        };
        let m = mounted(
            "p",
            response(vec![
                with_mode("setuid", 0o4755),
                with_mode("private", 0o600),
                with_mode("unset", 0),
            ]),
        )
        .unwrap();
        let modes: Vec<_> = m
            .files
            .iter()
            .map(|(k, v)| (k.as_str(), v.file_mode()))
            .collect();
        assert_eq!(
            modes,
            [
                ("private", Some(0o400)),
                ("setuid", Some(0o555)),
                ("unset", None)
            ]
        );
        assert_eq!(m.files["private"].expose(), b"v");
        let err = mounted("p", response(vec![with_mode("neg", -1)]))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("file neg with an unusable mode -1"), "{err}");
    }

    #[test]
    fn provider_errors_and_providers_writing_files_themselves_are_refused() {
        let mut r = response(vec![file("a", "1")]);
        r.error = Some(Error {
            code: "KeyVaultAccessDenied\n".into(),
        });
        let err = mounted("p", r).err().unwrap().to_string();
        assert!(
            err.contains("KeyVaultAccessDenied") && !err.contains('\n'),
            "{err}"
        );
        let err = mounted("p", response(vec![])).err().unwrap().to_string();
        assert!(err.contains("wrote its files itself"), "{err}");
        // Nothing at all is an empty volume, not an error.
        let empty = MountResponse::default();
        assert!(mounted("p", empty).unwrap().files.is_empty());
    }
}
