//! Parsing of request paths, query parameters and selectors.

use super::*;

/// What a URL path addresses.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) kind: usize,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
}

impl Target {
    pub(super) fn kind(&self) -> &'static Kind {
        &KINDS[self.kind]
    }

    pub(super) fn key(&self) -> Result<Key, ApiError> {
        let name = self
            .name
            .as_deref()
            .ok_or_else(ApiError::method_not_allowed)?;
        Ok(Key::new(
            self.kind,
            self.namespace.as_deref().unwrap_or(""),
            name,
        ))
    }

    pub(super) fn attributes(&self, verb: &'static str) -> Attributes<'_> {
        // RBAC sees a Namespace's own name as the request's namespace.
        let namespace = match (self.kind, &self.name) {
            (NAMESPACE_KIND, Some(name)) => Some(name.as_str()),
            _ => self.namespace.as_deref(),
        };
        Attributes {
            verb,
            kind: self.kind(),
            subresource: self.subresource.as_deref(),
            namespace,
            name: self.name.as_deref(),
        }
    }
}

/// `/api/v1/...` and `/apis/GROUP/VERSION/...` into a [`Target`].
pub(super) fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::no_route()),
    };
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if kind_by_path(group, version, plural).is_some() => {
            (Some(ns.to_string()), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        _ => return Err(ApiError::no_route()),
    };
    let kind = kind_by_path(group, version, plural).ok_or_else(ApiError::no_route)?;
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(ApiError::no_route()),
    };
    // A namespaced kind may be listed across namespaces; a cluster kind is never in one.
    let scoped_right = if KINDS[kind].namespaced {
        namespace.is_some() || name.is_none()
    } else {
        namespace.is_none()
    };
    let sub_ok = match subresource.as_deref() {
        None => true,
        Some("status") => KINDS[kind].status_subresource,
        Some("token") => kind == SERVICE_ACCOUNT_KIND,
        Some(_) => false,
    };
    if !scoped_right || !sub_ok || namespace.as_deref() == Some("") {
        return Err(ApiError::no_route());
    }
    Ok(Target {
        kind,
        namespace,
        name,
        subresource,
    })
}

/// The representation an `Accept` header asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Representation {
    Full,
    /// `as=PartialObjectMetadata;g=meta.k8s.io;v=v1`: metadata of one object or watch event.
    Metadata,
    /// `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`: metadata of a list's items.
    MetadataList,
}

impl Representation {
    /// The first media type of `Accept` the fake can serve; 406 when it can serve none.
    pub(super) fn negotiate(headers: &HeaderMap) -> Result<Self, ApiError> {
        let Some(accept) = headers.get(header::ACCEPT) else {
            return Ok(Self::Full);
        };
        let accept = accept.to_str().map_err(|_| ApiError::not_acceptable())?;
        for media in accept.split(',') {
            let mut parts = media.split(';').map(str::trim);
            let essence = parts.next().unwrap_or("");
            if !matches!(essence, "application/json" | "application/*" | "*/*") {
                continue;
            }
            let params: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
            let meta_v1 = params.get("g") == Some(&"meta.k8s.io") && params.get("v") == Some(&"v1");
            match params.get("as") {
                None => return Ok(Self::Full),
                Some(&"PartialObjectMetadata") if meta_v1 => return Ok(Self::Metadata),
                Some(&"PartialObjectMetadataList") if meta_v1 => return Ok(Self::MetadataList),
                Some(_) => {}
            }
        }
        Err(ApiError::not_acceptable())
    }

    /// `object` as asked for: its `PartialObjectMetadata` keeps `metadata` only.
    pub(super) fn object(self, object: Value) -> Value {
        match self {
            Self::Full => object,
            _ => partial(&object),
        }
    }

    /// A list as asked for: a `PartialObjectMetadataList` of the items' metadata.
    pub(super) fn list(self, list: Value) -> Value {
        if self == Self::Full {
            return list;
        }
        let items: Vec<Value> = list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(partial)
            .collect();
        json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": list.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "items": items,
        })
    }
}

fn partial(object: &Value) -> Value {
    let metadata = object.get("metadata").cloned().unwrap_or_else(|| json!({}));
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
}

/// The query parameters the fake understands; others are ignored.
#[derive(Debug, Default)]
pub(super) struct Query {
    pub(super) watch: bool,
    pub(super) resource_version: Option<String>,
    pub(super) resource_version_match: Option<String>,
    pub(super) limit: Option<usize>,
    pub(super) continue_token: Option<String>,
    pub(super) label_selector: Option<String>,
    pub(super) field_selector: Option<String>,
    pub(super) timeout_seconds: Option<u64>,
    pub(super) bookmarks: bool,
    pub(super) send_initial_events: Option<bool>,
    pub(super) field_manager: Option<String>,
    /// `force`, kept as sent: the real server rejects it on anything but an apply.
    pub(super) force: Option<bool>,
}

impl Query {
    pub(super) fn parse(raw: &str) -> Result<Self, ApiError> {
        let mut query = Query::default();
        for (key, value) in query_pairs(raw)? {
            query.set(&key, value)?;
        }
        Ok(query)
    }

    pub(super) fn set(&mut self, key: &str, value: String) -> Result<(), ApiError> {
        match key {
            "watch" => self.watch = parse_bool(key, &value)?,
            "resourceVersion" => self.resource_version = Some(value).filter(|v| !v.is_empty()),
            "resourceVersionMatch" => self.resource_version_match = Some(value),
            "limit" => self.limit = Some(parse_number(key, &value)?),
            "continue" => self.continue_token = Some(value).filter(|v| !v.is_empty()),
            "labelSelector" => self.label_selector = Some(value),
            "fieldSelector" => self.field_selector = Some(value),
            "fieldManager" => self.field_manager = Some(value).filter(|v| !v.is_empty()),
            "force" => self.force = Some(parse_bool(key, &value)?),
            "timeoutSeconds" => self.timeout_seconds = Some(parse_number(key, &value)?),
            "allowWatchBookmarks" => self.bookmarks = parse_bool(key, &value)?,
            "sendInitialEvents" => self.send_initial_events = Some(parse_bool(key, &value)?),
            "dryRun" => {
                return Err(ApiError::bad_request(
                    "dryRun is not supported by the fake API server",
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

pub(super) fn parse_bool(key: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "{key}: invalid boolean value \"{value}\""
        ))),
    }
}

pub(super) fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ApiError> {
    value
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{key}: invalid value \"{value}\"")))
}

/// Decoded `key=value` pairs; empty segments (kube-rs starts with `&`) are skipped.
pub(super) fn query_pairs(raw: &str) -> Result<Vec<(String, String)>, ApiError> {
    raw.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match (percent_decode(key), percent_decode(value)) {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err(ApiError::bad_request(format!("malformed query: {pair}"))),
            }
        })
        .collect()
}

pub(super) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The RBAC verb of a request.
pub(super) fn verb_of(
    method: &Method,
    target: &Target,
    query: &Query,
) -> Result<&'static str, ApiError> {
    let named = target.name.is_some();
    match (target.subresource.as_deref(), method.as_str()) {
        (None, _) | (Some("status"), "GET" | "PUT" | "PATCH") => {}
        (Some("token"), "POST") => return Ok("create"),
        _ => return Err(ApiError::method_not_allowed()),
    }
    let verb = match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if query.watch => "watch",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        _ => return Err(ApiError::method_not_allowed()),
    };
    // Creating a namespaced object needs a namespace in the path.
    if verb == "create" && target.kind().namespaced && target.namespace.is_none() {
        return Err(ApiError::method_not_allowed());
    }
    Ok(verb)
}

// ---------------------------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
pub(super) enum LabelOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug)]
pub(super) struct LabelRequirement {
    pub(super) key: String,
    pub(super) op: LabelOp,
}

#[derive(Debug, Default)]
pub(super) struct LabelSelector(Vec<LabelRequirement>);

impl LabelSelector {
    pub(super) fn parse(text: &str) -> Result<Self, ApiError> {
        split_top_level(text)
            .into_iter()
            .map(str::trim)
            .filter(|term| !term.is_empty())
            .map(parse_requirement)
            .collect::<Result<Vec<_>, _>>()
            .map(LabelSelector)
    }

    pub(super) fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|req| match (&req.op, label(&req.key)) {
            (LabelOp::In(values), Some(v)) => values.iter().any(|x| x == v),
            (LabelOp::In(_), None) => false,
            (LabelOp::NotIn(values), Some(v)) => !values.iter().any(|x| x == v),
            (LabelOp::NotIn(_), None) => true,
            (LabelOp::Exists, found) => found.is_some(),
            (LabelOp::NotExists, found) => found.is_none(),
        })
    }
}

/// Splits on commas that are not inside `( )`.
pub(super) fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

pub(super) fn parse_requirement(term: &str) -> Result<LabelRequirement, ApiError> {
    let bad = || ApiError::bad_request(format!("unable to parse requirement: {term:?}"));
    let (key, op) = if let Some(key) = term.strip_prefix('!') {
        (key, LabelOp::NotExists)
    } else if let Some(open) = term.find('(') {
        let inner = term[open + 1..].strip_suffix(')').ok_or_else(bad)?;
        let values = inner.split(',').map(|v| v.trim().to_string()).collect();
        let (key, word) = term[..open]
            .trim()
            .split_once(char::is_whitespace)
            .ok_or_else(bad)?;
        match word.trim() {
            "in" => (key, LabelOp::In(values)),
            "notin" => (key, LabelOp::NotIn(values)),
            _ => return Err(bad()),
        }
    } else if let Some((key, value)) = term.split_once("!=") {
        (key, LabelOp::NotIn(vec![value.trim().to_string()]))
    } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        (key, LabelOp::In(vec![value.trim().to_string()]))
    } else {
        (term, LabelOp::Exists)
    };
    let key = key.trim();
    let key_ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if !key_ok {
        return Err(bad());
    }
    Ok(LabelRequirement {
        key: key.to_string(),
        op,
    })
}

/// `field=value`, `field==value`, `field!=value` terms, joined by commas.
#[derive(Debug, Default)]
pub(super) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub(super) fn parse(text: &str, kind: &Kind) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{text}'")));
            };
            let field = field.trim();
            let known = ["metadata.name", "metadata.namespace"].contains(&field)
                || kind.fields.contains(&field);
            if !known {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    pub(super) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

/// Which objects a list or watch returns.
pub(super) struct Filter {
    pub(super) kind: usize,
    pub(super) namespace: Option<String>,
    pub(super) labels: LabelSelector,
    pub(super) fields: FieldSelector,
}

impl Filter {
    pub(super) fn new(target: &Target, query: &Query) -> Result<Self, ApiError> {
        let labels = match &query.label_selector {
            Some(text) => LabelSelector::parse(text)?,
            None => LabelSelector::default(),
        };
        let fields = match &query.field_selector {
            Some(text) => FieldSelector::parse(text, target.kind())?,
            None => FieldSelector::default(),
        };
        Ok(Self {
            kind: target.kind,
            namespace: target.namespace.clone(),
            labels,
            fields,
        })
    }

    pub(super) fn in_scope(&self, key: &Key) -> bool {
        key.kind == self.kind
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
    }

    pub(super) fn matches(&self, key: &Key, object: &Value) -> bool {
        self.in_scope(key) && self.labels.matches(object) && self.fields.matches(object)
    }

    pub(super) fn selects_everything(&self) -> bool {
        self.labels.0.is_empty() && self.fields.0.is_empty()
    }
}
