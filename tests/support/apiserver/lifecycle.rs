//! Deletion as the registry and the namespace controller carry it out: finalizers,
//! `deletionTimestamp`, and namespace termination.

use super::*;

impl Store {
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
}

/// A write may not add a finalizer to an object being deleted (422, the registry's message).
pub(super) fn no_new_finalizers(
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
    Ok(())
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
