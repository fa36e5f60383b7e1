//! Field ownership (`metadata.managedFields`) and server-side apply, modelled at the level of
//! map leaves: a path of object keys down to a value that is not a non-empty object. Lists are
//! atomic (one leaf), `metadata.ownerReferences` included, where the real server merges it by
//! uid. The real server's `"."` markers for maps an Update created are not recorded.

use std::collections::BTreeSet;

use super::*;

/// Object keys from the root down to one leaf.
type FieldPath = Vec<String>;
type FieldSet = BTreeSet<FieldPath>;

/// Metadata fields the real server never tracks (its `stripSet`, with `apiVersion` and `kind`).
const UNTRACKED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "clusterName",
    "generation",
    "managedFields",
    "resourceVersion",
];

/// The identity of a `managedFields` entry, as the real server keys them (the apiVersion of an
/// Update entry too, but every kind here has one version).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Manager {
    name: String,
    /// `Apply` or `Update`.
    operation: &'static str,
    /// `""` or `"status"`.
    subresource: String,
}

impl Manager {
    /// How conflict messages name it: `"kubectl-edit" using v1`.
    fn describe(&self, api_version: &str) -> String {
        let mut text = serde_json::to_string(&self.name).unwrap_or_default();
        if !self.subresource.is_empty() {
            text.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == "Update" {
            text.push_str(&format!(" using {api_version}"));
        }
        text
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    api_version: String,
    time: Option<Value>,
    fields: FieldSet,
}

#[derive(Debug, Default)]
struct Managers(BTreeMap<Manager, Entry>);

impl Managers {
    /// The entries of `metadata.managedFields`; malformed ones are skipped.
    fn decode(object: &Value) -> Self {
        let mut managers = BTreeMap::new();
        let entries = object
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array);
        for entry in entries.into_iter().flatten() {
            let text = |field: &str| entry.get(field).and_then(Value::as_str).unwrap_or("");
            let operation = match text("operation") {
                "Apply" => "Apply",
                "Update" => "Update",
                _ => continue,
            };
            if text("fieldsType") != "FieldsV1" {
                continue;
            }
            let mut fields = FieldSet::new();
            if let Some(tree) = entry.get("fieldsV1") {
                decode_fields(tree, &mut Vec::new(), &mut fields);
            }
            let manager = Manager {
                name: text("manager").to_string(),
                operation,
                subresource: text("subresource").to_string(),
            };
            let entry = Entry {
                api_version: text("apiVersion").to_string(),
                time: entry.get("time").cloned(),
                fields,
            };
            managers.insert(manager, entry);
        }
        Self(managers)
    }

    /// Drops emptied entries and writes the rest to `metadata.managedFields`, ordered as the
    /// real server orders them (operation, time, manager), or removes it when none is left.
    fn encode_into(mut self, object: &mut Value) {
        self.0.retain(|_, entry| !entry.fields.is_empty());
        let mut entries: Vec<(&Manager, &Entry)> = self.0.iter().collect();
        fn time(entry: &Entry) -> &str {
            entry.time.as_ref().and_then(Value::as_str).unwrap_or("")
        }
        entries.sort_by(|(m1, e1), (m2, e2)| {
            (m1.operation, time(e1), &m1.name, &m1.subresource).cmp(&(
                m2.operation,
                time(e2),
                &m2.name,
                &m2.subresource,
            ))
        });
        let encoded: Vec<Value> = entries
            .into_iter()
            .map(|(manager, entry)| {
                let mut encoded = json!({
                    "operation": manager.operation,
                    "apiVersion": entry.api_version,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": encode_fields(&entry.fields),
                });
                // The real server omits empty strings (`omitempty`) and a missing time.
                if !manager.name.is_empty() {
                    encoded["manager"] = json!(manager.name);
                }
                if !manager.subresource.is_empty() {
                    encoded["subresource"] = json!(manager.subresource);
                }
                if let Some(time) = &entry.time {
                    encoded["time"] = time.clone();
                }
                encoded
            })
            .collect();
        if encoded.is_empty() {
            remove_meta(object, "managedFields");
        } else {
            set_meta(object, "managedFields", Value::Array(encoded));
        }
    }

    /// Takes `fields` away from every entry: another writer changed or removed them.
    fn release(&mut self, fields: &FieldSet, except: Option<&Manager>) {
        for (manager, entry) in self.0.iter_mut() {
            if Some(manager) != except {
                entry.fields.retain(|path| !fields.contains(path));
            }
        }
    }
}

/// `{"f:data": {"f:x": {}}}` into paths; `"."` marks a map that is itself a member, and list
/// item keys (`k:`, `v:`, `i:`) make the whole list one member, as lists are atomic here.
fn decode_fields(tree: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    let Some(map) = tree.as_object() else { return };
    if map.is_empty() && !path.is_empty() {
        out.insert(path.clone());
    }
    for (key, child) in map {
        if let Some(name) = key.strip_prefix("f:") {
            path.push(name.to_string());
            decode_fields(child, path, out);
            path.pop();
        } else if !path.is_empty() {
            out.insert(path.clone());
        }
    }
}

fn encode_fields(fields: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    fn render(node: &Node) -> Value {
        let mut map: Map<String, Value> = node
            .children
            .iter()
            .map(|(name, child)| (format!("f:{name}"), render(child)))
            .collect();
        if node.member && !map.is_empty() {
            map.insert(".".to_string(), json!({}));
        }
        Value::Object(map)
    }
    let mut root = Node::default();
    for path in fields {
        let mut node = &mut root;
        for name in path {
            node = node.children.entry(name.clone()).or_default();
        }
        node.member = true;
    }
    render(&root)
}

/// Which part of an object a write may change: the status subresource only its `status`, the
/// main resource of a kind with a status subresource everything but `status`.
#[derive(Clone, Copy)]
pub(super) struct Reach {
    pub(super) status_only: bool,
    pub(super) status_excluded: bool,
}

impl Reach {
    pub(super) fn of(kind: &Kind, subresource: Option<&str>) -> Self {
        let status_only = subresource == Some("status");
        Self {
            status_only,
            status_excluded: !status_only && kind.status_subresource,
        }
    }

    fn tracks(&self, path: &[String]) -> bool {
        let untracked = match path {
            [] => true,
            [first, ..] if first == "apiVersion" || first == "kind" => true,
            [meta] if meta == "metadata" => true,
            [meta, field, ..] if meta == "metadata" => UNTRACKED_METADATA.contains(&field.as_str()),
            _ => false,
        };
        let is_status = path.first().is_some_and(|p| p == "status");
        if untracked {
            false
        } else if self.status_only {
            is_status
        } else {
            !(is_status && self.status_excluded)
        }
    }

    fn subresource(&self) -> String {
        if self.status_only { "status" } else { "" }.to_string()
    }
}

/// Every tracked leaf of `object` with its value.
fn leaves(object: &Value, reach: Reach) -> BTreeMap<FieldPath, &Value> {
    fn walk<'a>(value: &'a Value, path: &mut FieldPath, out: &mut BTreeMap<FieldPath, &'a Value>) {
        match value.as_object() {
            Some(map) if !map.is_empty() => {
                for (key, child) in map {
                    path.push(key.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone(), value);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(object, &mut Vec::new(), &mut out);
    out.retain(|path, _| reach.tracks(path));
    out
}

/// What a write did to the tracked fields.
struct Diff {
    /// Added or given another value.
    changed: FieldSet,
    removed: FieldSet,
}

fn diff(before: &Value, after: &Value, reach: Reach) -> Diff {
    let old = leaves(before, reach);
    let new = leaves(after, reach);
    let changed = new
        .iter()
        .filter(|(path, value)| old.get(*path) != Some(*value))
        .map(|(path, _)| path.clone())
        .collect();
    let removed = old
        .keys()
        .filter(|p| !new.contains_key(*p))
        .cloned()
        .collect();
    Diff { changed, removed }
}

/// `.data.password`, as conflict messages print a path.
fn dotted(path: &FieldPath) -> String {
    path.iter().map(|name| format!(".{name}")).collect()
}

/// Records a non-apply write (create, update, merge patch) of `after` over `before` by
/// `manager`: it takes every field it changed from the other managers, who also lose the fields
/// it removed. The managedFields the client sent are kept when it sent any.
pub(super) fn record_update(
    before: Option<&Value>,
    after: &mut Value,
    manager: &str,
    kind: &Kind,
    subresource: Option<&str>,
) {
    let reach = Reach::of(kind, subresource);
    let sent = Managers::decode(after);
    let mut managers = match before {
        Some(before) if sent.0.is_empty() || reach.status_only => Managers::decode(before),
        _ => sent,
    };
    let empty = json!({});
    let diff = diff(before.unwrap_or(&empty), after, reach);
    managers.release(&diff.changed, None);
    managers.release(&diff.removed, None);
    if !diff.changed.is_empty() {
        let key = Manager {
            name: manager.to_string(),
            operation: "Update",
            subresource: reach.subresource(),
        };
        let entry = managers.0.entry(key).or_insert_with(|| Entry {
            api_version: kind.api_version(),
            time: None,
            fields: FieldSet::new(),
        });
        entry.fields.extend(diff.changed);
        entry.time = Some(now());
    }
    managers.encode_into(after);
}

/// Server-side apply of `config` by `manager` to `live` (absent: a create). Returns the new
/// object, with its managedFields, or the conflicts with other managers as a 409.
pub(super) fn apply(
    live: Option<&Value>,
    config: &Value,
    manager: &str,
    kind: &Kind,
    subresource: Option<&str>,
    force: bool,
) -> Result<Value, ApiError> {
    let reach = Reach::of(kind, subresource);
    let config = without_nulls(config);
    let mut before = match live {
        Some(live) => live.clone(),
        None => {
            let metadata: Map<String, Value> = ["name", "namespace"]
                .into_iter()
                .filter_map(|f| Some((f.to_string(), config.get("metadata")?.get(f)?.clone())))
                .collect();
            json!({"apiVersion": kind.api_version(), "kind": kind.kind, "metadata": metadata})
        }
    };
    let mut managers = Managers::decode(&before);
    remove_meta(&mut before, "managedFields");
    let applied = leaves(&config, reach);
    let mut merged = before.clone();
    for (path, value) in &applied {
        set_leaf(&mut merged, path, value);
    }
    let applied: FieldSet = applied.into_keys().collect();
    let key = Manager {
        name: manager.to_string(),
        operation: "Apply",
        subresource: reach.subresource(),
    };
    let previous = managers
        .0
        .get(&key)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut kept: FieldSet = applied.clone();
    for (other, entry) in &managers.0 {
        if *other != key {
            kept.extend(entry.fields.iter().cloned());
        }
    }
    for path in previous.difference(&kept) {
        prune(&mut merged, path, &kept);
    }

    let diff = diff(&before, &merged, reach);
    let mut conflicts = Vec::new();
    for (other, entry) in &managers.0 {
        if *other == key {
            continue;
        }
        for path in entry.fields.intersection(&diff.changed) {
            conflicts.push((other.describe(&entry.api_version), dotted(path)));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(ApiError::apply_conflict(&conflicts));
    }
    managers.release(&diff.changed, Some(&key));
    managers.release(&diff.removed, Some(&key));
    let changed = !diff.changed.is_empty() || !diff.removed.is_empty();
    let entry = managers.0.entry(key).or_insert_with(|| Entry {
        api_version: kind.api_version(),
        time: None,
        fields: FieldSet::new(),
    });
    if changed || entry.fields != applied || entry.time.is_none() {
        entry.time = Some(now());
    }
    entry.fields = applied;
    entry.api_version = kind.api_version();
    managers.encode_into(&mut merged);
    Ok(merged)
}

/// `value` without null map entries: a null in an apply configuration sets nothing.
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Sets the leaf at `path` to `value`, creating the maps on the way; an empty map merges into
/// an existing one as nothing.
fn set_leaf(object: &mut Value, path: &[String], value: &Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for name in parents {
        if !node.is_object() {
            *node = json!({});
        }
        let Some(map) = node.as_object_mut() else {
            return;
        };
        node = map.entry(name.clone()).or_insert_with(|| json!({}));
    }
    if !node.is_object() {
        *node = json!({});
    }
    let Some(map) = node.as_object_mut() else {
        return;
    };
    let keeps_map =
        value.as_object().is_some_and(Map::is_empty) && map.get(last).is_some_and(Value::is_object);
    if !keeps_map {
        map.insert(last.clone(), value.clone());
    }
}

/// Removes the leaf at `path`, then the maps its removal emptied, unless a field someone still
/// owns is one of them.
fn prune(object: &mut Value, path: &FieldPath, kept: &FieldSet) {
    if kept.iter().any(|k| k.starts_with(path)) {
        return;
    }
    fn remove(value: &mut Value, path: &[String], depth: usize, full: &FieldPath, kept: &FieldSet) {
        let Some(map) = value.as_object_mut() else {
            return;
        };
        let Some(name) = path.first() else { return };
        if path.len() == 1 {
            map.remove(name);
            return;
        }
        if let Some(child) = map.get_mut(name) {
            remove(child, &path[1..], depth + 1, full, kept);
            let emptied = child.as_object().is_some_and(Map::is_empty);
            if emptied && !kept.contains(&full[..=depth].to_vec()) {
                map.remove(name);
            }
        }
    }
    remove(object, path, 0, path, kept);
}
