//! The write side of `plugin-file` (`--writable`): PushSecret / DeleteSecret (latchkey.plugin.v1)
//! and ApplySecret / DeleteKeys (ESS), by writing files. Without `--writable` every write answers
//! UNIMPLEMENTED: the plugin is read-only.
//!
//! The secret `a/b` is `<dir>/a/b` as reads see it (a JSON object of strings for entries, the
//! bytes as they are for the one entry `value`); its metadata (Latchkey's mark
//! `managed-by: latchkey`, and any ESS metadata) is `<dir>/a/b@meta`, a JSON object of strings.
//! A file is replaced by a rename, so a call writes all of its entries or none. One write at a
//! time: a read-modify-write is never interleaved with another.

use std::collections::HashMap;
use std::path::Path;

use tonic::Status;

use super::{Data, Files, entries, modified};

/// The metadata key and value that mark a secret as Latchkey's.
const MARK: (&str, &str) = ("managed-by", "latchkey");

/// Metadata of one secret.
pub type Metadata = HashMap<String, String>;

impl Files {
    /// UNIMPLEMENTED unless `--writable`.
    pub fn writable(&self) -> Result<(), Status> {
        if !self.args.writable {
            return Err(Status::unimplemented(
                "plugin-file is read-only (no --writable)",
            ));
        }
        Ok(())
    }

    /// The metadata of `name` (empty when there is none).
    pub fn metadata(&self, name: &str) -> Metadata {
        std::fs::read(self.args.dir.join(format!("{name}@meta")))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn marked(&self, name: &str) -> bool {
        self.metadata(name).get(MARK.0).map(String::as_str) == Some(MARK.1)
    }

    /// latchkey.plugin.v1 PushSecret: `value` replaces the secret, else `data` is merged into
    /// it; `settings` are added to its metadata (or, `replace`, become all of it but the mark).
    /// Answers the version written (or the existing one, and true, when kept).
    pub async fn push(
        &self,
        name: &str,
        (data, value): (Data, Option<Vec<u8>>),
        (if_not_exists, adopt): (bool, bool),
        (settings, replace): (Metadata, bool),
    ) -> Result<(String, bool), Status> {
        let _one_at_a_time = self.writes.lock().await;
        let path = self.path(name)?;
        let exists = path.exists();
        if exists && if_not_exists {
            return Ok((modified(&path), true));
        }
        if exists && !self.marked(name) && !adopt {
            return Err(Status::already_exists(format!(
                "{name:?} exists and is not Latchkey's (no managed-by: latchkey)"
            )));
        }
        let bytes = match value {
            Some(value) => value,
            None => {
                let mut current = match exists {
                    true => entries(read(&path)?),
                    false => Data::new(),
                };
                current.extend(data);
                encode(current)?
            }
        };
        let mut metadata = if replace {
            Metadata::new()
        } else {
            self.metadata(name)
        };
        metadata.extend(settings);
        metadata.insert(MARK.0.into(), MARK.1.into());
        self.store(name, &bytes, &metadata)?;
        Ok((modified(&path), false))
    }

    /// latchkey.plugin.v1 DeleteSecret: `keys` (the secret too once empty), or (none) the whole
    /// secret; only from a marked secret.
    pub async fn delete(&self, name: &str, keys: &[String]) -> Result<(), Status> {
        let _one_at_a_time = self.writes.lock().await;
        let path = self.path(name)?;
        if !path.exists() {
            return Ok(());
        }
        if !self.marked(name) {
            return Err(Status::already_exists(format!(
                "{name:?} is not Latchkey's: nothing deleted"
            )));
        }
        if keys.is_empty() {
            return self.remove(name);
        }
        let mut current = entries(read(&path)?);
        for key in keys {
            current.remove(key);
        }
        match current.is_empty() {
            true => self.remove(name),
            false => self.store(name, &encode(current)?, &self.metadata(name)),
        }
    }

    /// ESS ApplySecret: the secret becomes `data` with `metadata` (Latchkey checked the mark).
    pub async fn apply(&self, name: &str, data: Data, metadata: &Metadata) -> Result<(), Status> {
        let _one_at_a_time = self.writes.lock().await;
        self.path(name)?;
        self.store(name, &encode(data)?, metadata)
    }

    /// ESS DeleteKeys: the keys of `data`, or (none) the whole secret; a secret left without
    /// keys goes, as Crossplane's plugins do.
    pub async fn delete_keys(&self, name: &str, keys: Vec<String>) -> Result<(), Status> {
        let _one_at_a_time = self.writes.lock().await;
        let path = self.path(name)?;
        if !path.exists() {
            return Ok(());
        }
        if keys.is_empty() {
            return self.remove(name);
        }
        let mut current = entries(read(&path)?);
        for key in &keys {
            current.remove(key);
        }
        if current.is_empty() {
            return self.remove(name);
        }
        self.store(name, &encode(current)?, &self.metadata(name))
    }

    /// Writes the value and the metadata of `name`, each replaced by a rename.
    fn store(&self, name: &str, bytes: &[u8], metadata: &Metadata) -> Result<(), Status> {
        let meta = serde_json::to_vec(metadata).map_err(|_| Status::internal("metadata"))?;
        replace(&self.args.dir.join(format!("{name}@meta")), &meta)?;
        replace(&self.path(name)?, bytes)
    }

    fn remove(&self, name: &str) -> Result<(), Status> {
        for path in [self.path(name)?, self.args.dir.join(format!("{name}@meta"))] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Status::internal(format!("cannot delete: {}", e.kind()))),
            }
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Status> {
    std::fs::read(path).map_err(|e| Status::internal(format!("cannot read: {}", e.kind())))
}

/// Entries as a file, the inverse of [`entries`]: the one entry `value` as its bytes, else a
/// JSON object of strings (an entry that is not UTF-8 text is refused, nothing written).
fn encode(mut data: Data) -> Result<Vec<u8>, Status> {
    if data.len() == 1
        && let Some(value) = data.remove("value")
    {
        return Ok(value);
    }
    let mut object = std::collections::BTreeMap::new();
    for (k, v) in data {
        let text = String::from_utf8(v)
            .map_err(|_| Status::invalid_argument(format!("entry {k:?} is not UTF-8 text")))?;
        object.insert(k, text);
    }
    serde_json::to_vec(&object).map_err(|_| Status::internal("encoding"))
}

/// `path` holds `bytes`, replaced at once (a temporary file renamed over it).
fn replace(path: &Path, bytes: &[u8]) -> Result<(), Status> {
    let failed = |e: std::io::Error| Status::internal(format!("cannot write: {}", e.kind()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push("@tmp");
    std::fs::write(&temporary, bytes).map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(failed)
}
