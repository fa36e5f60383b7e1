//! Storage: multi-version, with a change log for watches; object normalisation.

use super::*;

/// Where an object lives; ordered like etcd keys: kind, then `namespace/name` (or `name`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) kind: usize,
    /// `namespace/name` for namespaced objects, `name` for cluster-scoped ones.
    pub(super) path: String,
    pub(super) namespace: String,
    pub(super) name: String,
}

impl Key {
    pub(super) fn new(kind: usize, namespace: &str, name: &str) -> Self {
        let path = if namespace.is_empty() {
            name.to_string()
        } else {
            format!("{namespace}/{name}")
        };
        Self {
            kind,
            path,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The smallest key of a kind.
    pub(super) fn first(kind: usize) -> Self {
        Self::new(kind, "", "")
    }
}

/// One version of an object; `None` is a deletion (tombstone).
pub(super) struct Revision {
    pub(super) rv: u64,
    pub(super) object: Option<Value>,
}

/// One write, as watchers see it.
pub(super) struct Change {
    pub(super) rv: u64,
    pub(super) key: Key,
    /// The state before the write (to decide ADDED/DELETED under a selector).
    pub(super) before: Option<Value>,
    /// The state after the write; for a deletion, the last state stamped with `rv`.
    pub(super) object: Value,
    pub(super) deleted: bool,
}

pub(super) struct Store {
    /// The latest resourceVersion issued (etcd's revision).
    pub(super) rv: u64,
    /// Versions at or below this are gone from history.
    pub(super) compacted: u64,
    pub(super) objects: BTreeMap<Key, Vec<Revision>>,
    pub(super) log: Vec<Change>,
    pub(super) serial: u64,
    pub(super) seed: u64,
    /// Service account uids by `(namespace, name)`, assigned on first use, so that a
    /// ServiceAccount object, its tokens and TokenReviews agree.
    pub(super) service_account_uids: HashMap<(String, String), String>,
    /// Namespaces being deleted: their contents are deleted, then they are.
    pub(super) terminating: std::collections::BTreeSet<String>,
}

impl Store {
    pub(super) fn new() -> Self {
        Self {
            rv: 1,
            compacted: 0,
            objects: BTreeMap::new(),
            log: Vec::new(),
            serial: 0,
            seed: RandomState::new().build_hasher().finish(),
            service_account_uids: HashMap::new(),
            terminating: Default::default(),
        }
    }

    /// The uid of service account `namespace/name`, fixed for the life of the server.
    pub(super) fn service_account_uid(&mut self, namespace: &str, name: &str) -> String {
        let key = (namespace.to_string(), name.to_string());
        if let Some(uid) = self.service_account_uids.get(&key) {
            return uid.clone();
        }
        let uid = self.new_uid();
        self.service_account_uids.insert(key, uid.clone());
        uid
    }

    /// Whether service account `namespace/name` exists as an object with this uid.
    pub(super) fn service_account_exists(&self, namespace: &str, name: &str, uid: &str) -> bool {
        let key = Key::new(SERVICE_ACCOUNT_KIND, namespace, name);
        self.current(&key)
            .is_some_and(|sa| meta_str(sa, "uid") == Some(uid))
    }

    pub(super) fn current(&self, key: &Key) -> Option<&Value> {
        self.objects
            .get(key)
            .and_then(|revisions| revisions.last())
            .and_then(|revision| revision.object.as_ref())
    }

    /// Every object of `kind` as it was at `rv`, in key order.
    pub(super) fn snapshot(&self, kind: usize, rv: u64) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects
            .range(Key::first(kind)..)
            .take_while(move |(key, _)| key.kind == kind)
            .filter_map(move |(key, revisions)| {
                let revision = revisions.iter().rev().find(|r| r.rv <= rv)?;
                revision.object.as_ref().map(|object| (key, object))
            })
    }

    /// Stores a new version (or a deletion) under a fresh resourceVersion.
    pub(super) fn write(&mut self, key: Key, object: Option<Value>) -> Value {
        let deleted = object.is_none();
        self.record(key, object, deleted)
    }

    /// Deletes `key`, with `last` as the state watchers see deleted (an update that removed
    /// the last finalizer of an object being deleted deletes it in the same write).
    pub(super) fn write_deletion(&mut self, key: Key, last: Value) -> Value {
        self.record(key, Some(last), true)
    }

    fn record(&mut self, key: Key, object: Option<Value>, deleted: bool) -> Value {
        self.rv += 1;
        let rv = self.rv;
        let before = self.current(&key).cloned();
        if deleted && key.kind == SERVICE_ACCOUNT_KIND {
            // A re-created account is a new one: its old tokens must not match it.
            let account = (key.namespace.clone(), key.name.clone());
            self.service_account_uids.remove(&account);
        }
        let mut stored = object.or_else(|| before.clone()).unwrap_or(Value::Null);
        set_meta(&mut stored, "resourceVersion", json!(rv.to_string()));
        let revision = Revision {
            rv,
            object: (!deleted).then(|| stored.clone()),
        };
        self.objects.entry(key.clone()).or_default().push(revision);
        self.log.push(Change {
            rv,
            key,
            before,
            object: stored.clone(),
            deleted,
        });
        stored
    }

    /// Writes `object` unless it equals the current version (a no-op keeps the resourceVersion).
    pub(super) fn commit(&mut self, key: Key, before: Option<&Value>, object: Value) -> Value {
        if let Some(before) = before {
            let mut unversioned = before.clone();
            remove_meta(&mut unversioned, "resourceVersion");
            if unversioned == object {
                return before.clone();
            }
        }
        if being_deleted(&object) && finalizers(&object).is_empty() {
            return self.write_deletion(key, object);
        }
        self.write(key, Some(object))
    }

    /// Deletes as the registry does: an object with finalizers is only marked
    /// (`deletionTimestamp`, `deletionGracePeriodSeconds: 0`) until its last finalizer is
    /// removed; marking it again changes nothing. A Namespace turns `Terminating` and goes once
    /// its contents are gone (see [`Self::finish_namespaces`]). Returns the object's state
    /// after the call.
    pub(super) fn delete_object(&mut self, key: Key) -> Option<Value> {
        let live = self.current(&key)?.clone();
        let is_namespace = key.kind == NAMESPACE_KIND;
        if being_deleted(&live) {
            return Some(live);
        }
        if !is_namespace && finalizers(&live).is_empty() {
            return Some(self.write(key, None));
        }
        let mut marked = live;
        set_meta(&mut marked, "deletionTimestamp", now());
        set_meta(&mut marked, "deletionGracePeriodSeconds", json!(0));
        if is_namespace {
            marked["status"] = json!({"phase": "Terminating"});
            self.terminating.insert(key.name.clone());
        }
        remove_meta(&mut marked, "resourceVersion");
        Some(self.write(key, Some(marked)))
    }

    /// The namespace controller's work, done at once: every object of a terminating namespace
    /// is deleted (finalizers holding some), and the namespace goes once none is left.
    pub(super) fn finish_namespaces(&mut self) {
        if self.terminating.is_empty() {
            return;
        }
        for namespace in self.terminating.clone() {
            let contents: Vec<(Key, bool)> = self
                .objects
                .iter()
                .filter(|(key, _)| key.namespace == namespace && KINDS[key.kind].namespaced)
                .filter_map(|(key, revisions)| {
                    let object = revisions.last()?.object.as_ref()?;
                    Some((key.clone(), being_deleted(object)))
                })
                .collect();
            let held = contents.iter().filter(|(_, marked)| *marked).count();
            let mut left = held;
            for (key, marked) in contents {
                if !marked && self.delete_object(key.clone()).is_some() {
                    left += usize::from(self.current(&key).is_some());
                }
            }
            if left == 0 {
                self.terminating.remove(&namespace);
                let key = Key::new(NAMESPACE_KIND, "", &namespace);
                if self.current(&key).is_some() {
                    self.write(key, None);
                }
            }
        }
    }

    /// What the garbage collector eventually does with background propagation, done at once and
    /// repeated until nothing is left to do: deletes every object all of whose owners (by
    /// `ownerReferences[].uid`) are gone, and drops the references to gone owners from objects
    /// that still have another. Returns the deleted objects' last states.
    pub(super) fn collect_garbage(&mut self) -> Vec<Value> {
        let mut deleted = Vec::new();
        loop {
            let live: Vec<(Key, Value)> = self
                .objects
                .iter()
                .filter_map(|(key, revisions)| {
                    let object = revisions.last()?.object.as_ref()?;
                    Some((key.clone(), object.clone()))
                })
                .collect();
            let uids: std::collections::HashSet<&str> = live
                .iter()
                .filter_map(|(_, o)| meta_str(o, "uid"))
                .collect();
            let mut work = Vec::new();
            for (key, object) in &live {
                if being_deleted(object) {
                    continue;
                }
                let Some(owners) = object
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .filter(|owners| !owners.is_empty())
                else {
                    continue;
                };
                let exists = |owner: &&Value| {
                    let uid = owner.get("uid").and_then(Value::as_str).unwrap_or("");
                    uids.contains(uid)
                };
                let alive: Vec<Value> = owners.iter().filter(exists).cloned().collect();
                if alive.len() == owners.len() {
                    continue;
                }
                let update = (!alive.is_empty()).then(|| {
                    let mut object = object.clone();
                    set_meta(&mut object, "ownerReferences", Value::Array(alive));
                    object
                });
                work.push((key.clone(), update));
            }
            if work.is_empty() {
                return deleted;
            }
            for (key, update) in work {
                match update {
                    Some(update) => {
                        self.write(key, Some(update));
                    }
                    None => {
                        let after = self.delete_object(key.clone());
                        if self.current(&key).is_none() {
                            deleted.extend(after);
                        }
                    }
                }
            }
        }
    }

    /// Drops history at or below `upto`, keeping the latest live version of every object.
    pub(super) fn compact(&mut self, upto: u64) {
        for revisions in self.objects.values_mut() {
            if let Some(i) = revisions.iter().rposition(|r| r.rv <= upto) {
                revisions.drain(..i);
                if revisions.first().is_some_and(|r| r.object.is_none()) {
                    revisions.remove(0);
                }
            }
        }
        self.objects.retain(|_, revisions| !revisions.is_empty());
        self.log.retain(|change| change.rv > upto);
        self.compacted = self.compacted.max(upto);
    }

    /// Changes after `rv`, or `None` when history no longer reaches back that far.
    pub(super) fn changes_after(&self, rv: u64) -> Option<&[Change]> {
        if rv < self.compacted {
            return None;
        }
        let start = self.log.partition_point(|change| change.rv <= rv);
        Some(&self.log[start..])
    }

    pub(super) fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(self.seed ^ self.serial);
        hasher.finish()
    }

    /// A random-looking version 4 UUID.
    pub(super) fn new_uid(&mut self) -> String {
        let a = self.next_serial();
        let b = self.next_serial();
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        )
    }

    /// `generateName` plus five random characters, from the real server's alphabet.
    pub(super) fn generate_name(&mut self, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut bits = self.next_serial();
        let mut name = prefix.to_string();
        for _ in 0..5 {
            name.push(char::from(
                ALPHABET[(bits % ALPHABET.len() as u64) as usize],
            ));
            bits /= ALPHABET.len() as u64;
        }
        name
    }

    /// Creating `name` of `kind` in `namespace` needs the namespace to exist and not be
    /// terminating (403 `Forbidden`, as the NamespaceLifecycle admission plugin answers).
    pub(super) fn require_namespace(
        &self,
        namespace: &str,
        kind: &Kind,
        name: &str,
    ) -> Result<(), ApiError> {
        let key = Key::new(NAMESPACE_KIND, "", namespace);
        match self.current(&key) {
            Some(ns) if being_deleted(ns) => {
                let message = format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace \
                     {namespace} because it is being terminated",
                    kind.qualified()
                );
                let mut details = kind.details(name);
                details["causes"] = json!([{
                    "reason": "NamespaceTerminating",
                    "message": format!("namespace {namespace} is being terminated"),
                    "field": "metadata.namespace",
                }]);
                Err(ApiError::new(403, "Forbidden", message).with_details(details))
            }
            Some(_) => Ok(()),
            None => Err(ApiError::not_found(&KINDS[NAMESPACE_KIND], namespace)),
        }
    }

    /// Test-side create-or-replace, with no authorisation and no status rules.
    pub(super) fn apply(&mut self, key: Key, object: Value) -> Result<Value, ApiError> {
        let before = self.current(&key).cloned();
        let object = self.prepare(&KINDS[key.kind], before.as_ref(), object)?;
        Ok(self.commit(key, before.as_ref(), object))
    }

    /// Fills the fields the server owns and normalises kind-specific ones.
    pub(super) fn prepare(
        &mut self,
        kind: &Kind,
        before: Option<&Value>,
        mut object: Value,
    ) -> Result<Value, ApiError> {
        ensure_metadata(&mut object)?;
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.kind);
        remove_meta(&mut object, "resourceVersion");
        let uid = match before.and_then(|b| b.pointer("/metadata/uid")) {
            Some(uid) => uid.clone(),
            None if kind.kind == "ServiceAccount" => {
                let namespace = meta_str(&object, "namespace")
                    .unwrap_or_default()
                    .to_string();
                let name = meta_str(&object, "name").unwrap_or_default().to_string();
                json!(self.service_account_uid(&namespace, &name))
            }
            None => json!(self.new_uid()),
        };
        set_meta(&mut object, "uid", uid);
        // Only a delete sets these; writes keep what the stored object has.
        for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            match before.and_then(|b| b.pointer(&format!("/metadata/{field}"))) {
                Some(kept) => set_meta(&mut object, field, kept.clone()),
                None => remove_meta(&mut object, field),
            }
        }
        let created = before.and_then(|b| b.pointer("/metadata/creationTimestamp"));
        set_meta(
            &mut object,
            "creationTimestamp",
            created.cloned().unwrap_or_else(now),
        );
        if kind.crd {
            let generation = generation(before, &object);
            set_meta(&mut object, "generation", json!(generation));
        }
        match (kind.group, kind.kind) {
            ("", "Secret") => normalise_secret(&mut object)?,
            ("", "Namespace") => normalise_namespace(&mut object),
            _ => {}
        }
        Ok(object)
    }
}

/// `metadata.generation`: 1 on create, +1 whenever anything but metadata and status changes.
pub(super) fn generation(before: Option<&Value>, object: &Value) -> u64 {
    let Some(before) = before else { return 1 };
    let previous = before
        .pointer("/metadata/generation")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    if spec_part(before) == spec_part(object) {
        previous
    } else {
        previous + 1
    }
}

pub(super) fn spec_part(object: &Value) -> Value {
    let mut spec = object.clone();
    if let Some(map) = spec.as_object_mut() {
        for field in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(field);
        }
    }
    spec
}

/// Secret `stringData` is write-only: the registry folds it into base64 `data`; `type`
/// defaults to `Opaque`.
pub(super) fn normalise_secret(secret: &mut Value) -> Result<(), ApiError> {
    let Some(map) = secret.as_object_mut() else {
        return Ok(());
    };
    if map
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        map.insert("type".to_string(), json!("Opaque"));
    }
    let string_data = map.remove("stringData");
    let data = map.entry("data").or_insert(Value::Null);
    if data.is_null() {
        *data = json!({});
    }
    let Some(data) = data.as_object_mut() else {
        return Err(ApiError::bad_request("Secret.data: expected an object"));
    };
    for (key, value) in data.iter() {
        let text = value.as_str().unwrap_or("\u{0}");
        if base64::engine::general_purpose::STANDARD
            .decode(text)
            .is_err()
        {
            return Err(ApiError::bad_request(format!(
                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in \
                 data[{key:?}]"
            )));
        }
    }
    if let Some(Value::Object(strings)) = string_data {
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default().to_string();
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(key, json!(encoded));
        }
    }
    if data.is_empty() {
        map.remove("data");
    }
    Ok(())
}

/// Largest total size of a Secret's decoded `data` (`MaxSecretSize`).
const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// The registry's validation of a write (after normalisation) that the fake models: Secrets'
/// keys, size, `type` and `immutable`.
pub(super) fn validate(
    kind: &Kind,
    before: Option<&Value>,
    object: &Value,
) -> Result<(), ApiError> {
    if let Some(before) = before.filter(|b| being_deleted(b)) {
        let old = finalizers(before);
        let new: Vec<&str> = finalizers(object)
            .into_iter()
            .filter(|f| !old.contains(f))
            .collect();
        if !new.is_empty() {
            let listed: Vec<String> = new.iter().map(|f| format!("{f:?}")).collect();
            let detail = format!(
                "no new finalizers can be added if the object is being deleted, found new \
                 finalizers []string{{{}}}",
                listed.join(", ")
            );
            let name = meta_str(object, "name").unwrap_or_default();
            let cause = Cause::forbidden("metadata.finalizers", &detail);
            return Err(ApiError::invalid(kind, name, vec![cause]));
        }
    }
    if (kind.group, kind.kind) != ("", "Secret") {
        return Ok(());
    }
    let mut causes = Vec::new();
    if let Some(before) = before {
        if before.get("type") != object.get("type") {
            let value = object.get("type").cloned().unwrap_or(json!(""));
            causes.push(Cause::invalid("type", &value, "field is immutable"));
        }
        let immutable = |secret: &Value| secret.get("immutable") == Some(&json!(true));
        if immutable(before) {
            const WHY: &str = "field is immutable when `immutable` is set";
            if !immutable(object) {
                causes.push(Cause::forbidden("immutable", WHY));
            }
            if before.get("data") != object.get("data") {
                causes.push(Cause::forbidden("data", WHY));
            }
        }
    }
    let data = object.get("data").and_then(Value::as_object);
    let mut size = 0;
    for (key, value) in data.into_iter().flatten() {
        let key_ok = !key.is_empty()
            && key.len() <= 253
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
            && key != "."
            && key != ".."
            && !key.starts_with("..");
        if !key_ok {
            let detail = "a valid config key must consist of alphanumeric characters, '-', '_' \
                          or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used \
                          for validation is '[-._a-zA-Z0-9]+')";
            causes.push(Cause::invalid(&format!("data[{key}]"), &json!(key), detail));
        }
        // Checked as base64 when normalised.
        let text = value.as_str().unwrap_or_default();
        size += base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_or(0, |bytes| bytes.len());
    }
    if size > MAX_SECRET_SIZE {
        causes.push(Cause::too_long("data", MAX_SECRET_SIZE));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = meta_str(object, "name").unwrap_or_default();
    Err(ApiError::invalid(kind, name, causes))
}

/// Namespaces are `Active` and carry the `kubernetes.io/metadata.name` label.
pub(super) fn normalise_namespace(namespace: &mut Value) {
    let name = namespace
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(meta) = namespace.get_mut("metadata").and_then(Value::as_object_mut) {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert("kubernetes.io/metadata.name".to_string(), name);
        }
    }
    if namespace.pointer("/status/phase").is_none() {
        namespace["status"] = json!({"phase": "Active"});
    }
    if namespace.pointer("/spec/finalizers").is_none() {
        namespace["spec"] = json!({"finalizers": ["kubernetes"]});
    }
}

pub(super) fn now() -> Value {
    let now = k8s_openapi::jiff::Timestamp::now();
    json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

pub(super) fn ensure_metadata(object: &mut Value) -> Result<(), ApiError> {
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if meta.is_null() {
        *meta = json!({});
    }
    if !meta.is_object() {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

pub(super) fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(field.to_string(), value);
    }
}

pub(super) fn remove_meta(object: &mut Value, field: &str) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(field);
    }
}

pub(super) fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
}

/// Whether the object has a `deletionTimestamp` (it is being deleted).
pub(super) fn being_deleted(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// `metadata.finalizers`.
pub(super) fn finalizers(object: &Value) -> Vec<&str> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}
