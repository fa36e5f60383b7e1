//! Request dispatch and the verbs: get, list, create, update, patch, apply, delete (finalizers
//! and namespace termination in [`Store::delete_object`]).

use super::*;

pub(super) async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let identity = shared.authenticate(&parts.headers);
    shared.record(&parts, identity.clone());
    if let Some(code) = shared.take_fault(&parts) {
        let target = parse_path(parts.uri.path()).ok();
        return ApiError::injected(code, target.as_ref()).into_response();
    }
    if let Some(delay) = shared.take_delay(&parts) {
        tokio::time::sleep(delay).await;
    }
    match serve(&shared, identity, &parts, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Authenticates, authorises and dispatches one request.
pub(super) async fn serve(
    shared: &Arc<Shared>,
    identity: Option<Identity>,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = identity.ok_or_else(ApiError::unauthorized)?;
    if parts.uri.path().trim_end_matches('/') == TOKEN_REVIEWS_PATH {
        return token_review(shared, &identity, parts, body).await;
    }
    // Discovery of one group version: every authenticated client may read it
    // (system:discovery).
    if let ["apis", group, version] = parts
        .uri
        .path()
        .trim_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        let uninstalled = lock(&shared.uninstalled).clone();
        return discovery(group, version, |k| !uninstalled.contains(&k))
            .map(|list| json_response(StatusCode::OK, &list))
            .ok_or_else(ApiError::page_not_found);
    }
    let target = parse_path(parts.uri.path())?;
    if lock(&shared.uninstalled).contains(&target.kind) {
        return Err(ApiError::page_not_found());
    }
    let query = Query::parse(parts.uri.query().unwrap_or(""))?;
    let verb = verb_of(&parts.method, &target, &query)?;
    shared.authorize(&identity, &target.attributes(verb))?;
    let representation = Representation::negotiate(&parts.headers)?;
    let listing = verb == "list";
    if representation != Representation::Full
        && listing != (representation == Representation::MetadataList)
    {
        return Err(ApiError::not_acceptable());
    }
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
    let manager = field_manager(&query, &parts.headers);
    let respond =
        |code: StatusCode, object: Value| json_response(code, &representation.object(object));
    let ok = |object: Value| respond(StatusCode::OK, object);
    match verb {
        "get" => get(shared, &target).map(ok),
        "list" => list(shared, &target, &query)
            .map(|list| json_response(StatusCode::OK, &representation.list(list))),
        "watch" => start_watch(shared, &target, &query, representation),
        "create" if target.subresource.is_some() => token_request(shared, &target, &body)
            .map(|answer| json_response(StatusCode::CREATED, &answer)),
        "create" => {
            create(shared, &target, &manager, &body).map(|o| respond(StatusCode::CREATED, o))
        }
        "update" => update(shared, &target, &manager, parse_json(&body)?).map(ok),
        "patch" => {
            let (object, created) =
                patch(shared, &target, &query, &manager, &parts.headers, &body)?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(respond(code, object))
        }
        _ => delete(shared, &target, &body).map(ok),
    }
}

/// The field manager a write is recorded for: `fieldManager`, else what the real server
/// derives from the User-Agent (up to its first `/`; kube-rs sends none, so it is empty).
fn field_manager(query: &Query, headers: &HeaderMap) -> String {
    if let Some(manager) = &query.field_manager {
        return manager.clone();
    }
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let prefix = agent.split('/').next().unwrap_or("");
    prefix
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect()
}

pub(super) fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

pub(super) fn get(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    let key = target.key()?;
    let store = lock(&shared.store);
    store
        .current(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(target.kind(), &key.name))
}

// --- list -------------------------------------------------------------------------------------

pub(super) fn list(shared: &Shared, target: &Target, query: &Query) -> Result<Value, ApiError> {
    let kind = target.kind();
    let filter = Filter::new(target, query)?;
    let store = lock(&shared.store);
    let (rv, after) = list_start(&store, query)?;
    let mut items: Vec<(&Key, &Value)> = store
        .snapshot(target.kind, rv)
        .filter(|(key, object)| filter.matches(key, object))
        .filter(|(key, _)| after.as_ref().is_none_or(|start| key.path > *start))
        .collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = query.limit.filter(|&l| l > 0 && items.len() > l) {
        metadata["continue"] = json!(encode_continue(rv, items[limit - 1].0));
        if filter.selects_everything() {
            metadata["remainingItemCount"] = json!(items.len() - limit);
        }
        items.truncate(limit);
    }
    let items: Vec<Value> = items.into_iter().map(|(_, o)| list_item(kind, o)).collect();
    Ok(json!({
        "kind": format!("{}List", kind.kind),
        "apiVersion": kind.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

/// Built-in kinds are listed without `apiVersion`/`kind` on each item, custom ones with.
pub(super) fn list_item(kind: &Kind, object: &Value) -> Value {
    let mut item = object.clone();
    if !kind.crd
        && let Some(map) = item.as_object_mut()
    {
        map.remove("apiVersion");
        map.remove("kind");
    }
    item
}

/// The revision a list reads at, and the key path a `continue` token resumes after.
pub(super) fn list_start(store: &Store, query: &Query) -> Result<(u64, Option<String>), ApiError> {
    if let Some(token) = &query.continue_token {
        let (rv, after) = decode_continue(token)?;
        if rv < store.compacted {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list \
                 result. You can start a new list without the continue parameter.",
            ));
        }
        return Ok((rv, Some(after)));
    }
    Ok((list_revision(store, query)?, None))
}

/// `resourceVersion` + `resourceVersionMatch` semantics for lists.
pub(super) fn list_revision(store: &Store, query: &Query) -> Result<u64, ApiError> {
    let matching = query.resource_version_match.as_deref();
    let requested = match query.resource_version.as_deref() {
        None if matching.is_some() => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        None => return Ok(store.rv),
        Some(text) => parse_number::<u64>("resourceVersion", text)?,
    };
    let exact = match matching {
        Some("Exact") if requested == 0 => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
        Some("Exact") => true,
        Some("NotOlderThan") => false,
        None => requested != 0 && query.limit.is_some_and(|l| l > 0),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: unsupported value \"{other}\""
            )));
        }
    };
    if requested > store.rv {
        return Err(ApiError::new(
            504,
            "Timeout",
            format!(
                "Too large resource version: {requested}, current: {}",
                store.rv
            ),
        )
        .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge",
            "message": "Too large resource version"}], "retryAfterSeconds": 1})));
    }
    if !exact {
        return Ok(store.rv);
    }
    if requested < store.compacted {
        return Err(ApiError::expired(
            "The resourceVersion for the provided list is too old.",
        ));
    }
    Ok(requested)
}

/// An opaque token like the real one: base64url JSON with the revision and the last key.
pub(super) fn encode_continue(rv: u64, last: &Key) -> String {
    let start = format!("{}\u{0}", last.path);
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

pub(super) fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let token: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = token.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = token.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let start = start.strip_suffix('\u{0}').ok_or_else(bad)?;
    Ok((rv, start.to_string()))
}

// --- writes -----------------------------------------------------------------------------------

pub(super) fn create(
    shared: &Shared,
    target: &Target,
    manager: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let object = parse_json(body)?;
    shared.mutate(|store| create_in(store, target, manager, object))
}

pub(super) fn create_in(
    store: &mut Store,
    target: &Target,
    manager: &str,
    mut object: Value,
) -> Result<Value, ApiError> {
    let kind = target.kind();
    check_body(kind, target, &mut object)?;
    let name = match meta_str(&object, "name") {
        Some(name) => name.to_string(),
        None => match meta_str(&object, "generateName").map(str::to_string) {
            Some(prefix) => store.generate_name(&prefix),
            None => {
                let cause = Cause::required("metadata.name", "name or generateName is required");
                return Err(ApiError::invalid(kind, "", vec![cause]));
            }
        },
    };
    set_meta(&mut object, "name", json!(name));
    validate_name(kind, &name)?;
    if meta_str(&object, "resourceVersion").is_some() {
        return Err(ApiError::new(
            500,
            "InternalError",
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if let Some(namespace) = &target.namespace {
        store.require_namespace(namespace, kind, &name)?;
    }
    let key = Key::new(
        target.kind,
        target.namespace.as_deref().unwrap_or(""),
        &name,
    );
    if store.current(&key).is_some() {
        return Err(ApiError::already_exists(kind, &name));
    }
    if kind.status_subresource
        && let Some(map) = object.as_object_mut()
    {
        map.remove("status");
    }
    let mut object = store.prepare(kind, None, object)?;
    fields::record_update(None, &mut object, manager, kind, None);
    validate(kind, None, &object)?;
    Ok(store.write(key, Some(object)))
}

/// Checks `apiVersion`, `kind` and `metadata.namespace` against the URL and fills them in.
pub(super) fn check_body(kind: &Kind, target: &Target, object: &mut Value) -> Result<(), ApiError> {
    ensure_metadata(object)?;
    let expected = kind.api_version();
    for (field, want) in [("apiVersion", expected.as_str()), ("kind", kind.kind)] {
        match object.get(field).and_then(Value::as_str) {
            Some(got) if !got.is_empty() && got != want => {
                return Err(ApiError::bad_request(format!(
                    "the {field} of the provided object ({got}) does not match the {field} \
                     expected by the request ({want})"
                )));
            }
            _ => {}
        }
    }
    let body_namespace = meta_str(object, "namespace").map(str::to_string);
    match (&target.namespace, body_namespace) {
        (Some(url), Some(body)) if *url != body => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (Some(url), _) => {
            set_meta(object, "namespace", json!(url));
            Ok(())
        }
        (None, _) => {
            remove_meta(object, "namespace");
            Ok(())
        }
    }
}

/// DNS-1123 subdomain names; DNS-1123 labels for Namespaces.
pub(super) fn validate_name(kind: &Kind, name: &str) -> Result<(), ApiError> {
    let part_ok = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    let (ok, what, max) = if kind.kind == "Namespace" {
        (part_ok(name), "a lowercase RFC 1123 label", 63)
    } else {
        (
            name.split('.').all(part_ok),
            "a lowercase RFC 1123 subdomain",
            253,
        )
    };
    if ok && name.len() <= max {
        return Ok(());
    }
    let detail = format!(
        "{what} must consist of lower case alphanumeric characters, '-' or '.', and must start \
         and end with an alphanumeric character (at most {max} characters)"
    );
    let cause = Cause::invalid("metadata.name", &json!(name), &detail);
    Err(ApiError::invalid(kind, name, vec![cause]))
}

pub(super) fn update(
    shared: &Shared,
    target: &Target,
    manager: &str,
    object: Value,
) -> Result<Value, ApiError> {
    shared.mutate(|store| {
        let key = target.key()?;
        let before = store
            .current(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target.kind(), &key.name))?;
        replace(store, target, manager, (key, before), object)
    })
}

/// PUT semantics against the current version `before` of `key`.
pub(super) fn replace(
    store: &mut Store,
    target: &Target,
    manager: &str,
    (key, before): (Key, Value),
    mut object: Value,
) -> Result<Value, ApiError> {
    let kind = target.kind();
    check_body(kind, target, &mut object)?;
    match meta_str(&object, "name") {
        Some(name) if name == key.name => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({})",
                other.unwrap_or(""),
                key.name
            )));
        }
    }
    let sent_rv = meta_str(&object, "resourceVersion");
    if sent_rv.is_some() && sent_rv != meta_str(&before, "resourceVersion") {
        return Err(ApiError::conflict(kind, &key.name));
    }
    let object = if target.subresource.is_some() {
        with_status(before.clone(), object.get("status"))
    } else if kind.status_subresource {
        with_status(object, before.get("status"))
    } else {
        object
    };
    let mut object = store.prepare(kind, Some(&before), object)?;
    let subresource = target.subresource.as_deref();
    fields::record_update(Some(&before), &mut object, manager, kind, subresource);
    validate(kind, Some(&before), &object)?;
    Ok(store.commit(key, Some(&before), object))
}

/// `object` with its `status` replaced by `status` (removed when `None`).
pub(super) fn with_status(mut object: Value, status: Option<&Value>) -> Value {
    if let Some(map) = object.as_object_mut() {
        match status {
            Some(status) => map.insert("status".to_string(), status.clone()),
            None => map.remove("status"),
        };
    }
    object
}

/// A JSON merge patch, or a server-side apply; `true` when the apply created the object.
pub(super) fn patch(
    shared: &Shared,
    target: &Target,
    query: &Query,
    manager: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Value, bool), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let apply = content_type.starts_with("application/apply-patch+yaml");
    if !apply && !content_type.starts_with("application/merge-patch+json") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    // Checked before the object is looked up, as the real server does.
    let options = |cause| ApiError::invalid_of("meta.k8s.io", "PatchOptions", "", vec![cause]);
    if apply && query.field_manager.is_none() {
        let cause = Cause::required("fieldManager", "is required for apply patch");
        return Err(options(cause));
    }
    if !apply && query.force.is_some() {
        let cause = Cause::forbidden("force", "may not be specified for non-apply patch");
        return Err(options(cause));
    }
    // A JSON body is YAML too; the fake parses no other YAML.
    let patch = parse_json(body)?;
    let force = query.force == Some(true);
    shared.mutate(|store| {
        if apply {
            return apply_in(store, target, manager, force, patch);
        }
        let key = target.key()?;
        let before = store
            .current(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target.kind(), &key.name))?;
        let mut object = before.clone();
        merge_patch(&mut object, &patch);
        let replaced = replace(store, target, manager, (key, before), object)?;
        Ok((replaced, false))
    })
}

/// Server-side apply of `config` (creating the object when it is absent: `true`).
fn apply_in(
    store: &mut Store,
    target: &Target,
    manager: &str,
    force: bool,
    mut config: Value,
) -> Result<(Value, bool), ApiError> {
    let kind = target.kind();
    let key = target.key()?;
    for (field, shown) in [("kind", "Kind"), ("apiVersion", "apiVersion")] {
        if config
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "Object '{shown}' is missing in '{config}'"
            )));
        }
    }
    check_body(kind, target, &mut config)?;
    let sent_fields = config.pointer("/metadata/managedFields");
    if sent_fields.is_some_and(|f| !f.is_null() && *f != json!([])) {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    match meta_str(&config, "name") {
        None => set_meta(&mut config, "name", json!(key.name)),
        Some(name) if name == key.name => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({other}) does not match the name on the URL ({})",
                key.name
            )));
        }
    }
    let live = store.current(&key).cloned();
    let sent_rv = meta_str(&config, "resourceVersion");
    if sent_rv.is_some() && sent_rv != live.as_ref().and_then(|l| meta_str(l, "resourceVersion")) {
        return Err(ApiError::conflict(kind, &key.name));
    }
    remove_meta(&mut config, "resourceVersion");
    if live.is_none() {
        if target.subresource.is_some() {
            return Err(ApiError::not_found(kind, &key.name));
        }
        if let Some(namespace) = &target.namespace {
            store.require_namespace(namespace, kind, &key.name)?;
        }
        validate_name(kind, &key.name)?;
    }
    let subresource = target.subresource.as_deref();
    let merged = fields::apply(live.as_ref(), &config, manager, kind, subresource, force)?;
    let object = store.prepare(kind, live.as_ref(), merged)?;
    validate(kind, live.as_ref(), &object)?;
    Ok(match live {
        None => (store.write(key, Some(object)), true),
        Some(live) => (store.commit(key, Some(&live), object), false),
    })
}

/// RFC 7386 JSON merge patch.
pub(super) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Deletes, honouring the DeleteOptions' `preconditions` (uid, resourceVersion) as the real
/// server does: 409 Conflict when the object is not the one the client checked.
pub(super) fn delete(shared: &Shared, target: &Target, body: &[u8]) -> Result<Value, ApiError> {
    let key = target.key()?;
    let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the DeleteOptions are not valid JSON: {e}"))
        })?
    };
    let preconditions = options.get("preconditions").cloned().unwrap_or(Value::Null);
    shared.mutate(|store| {
        let Some(live) = store.current(&key) else {
            return Err(ApiError::not_found(target.kind(), &key.name));
        };
        for (field, shown) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if let Some(want) = preconditions.get(field).and_then(Value::as_str) {
                let have = meta_str(live, field).unwrap_or("");
                if want != have {
                    let message = format!(
                        "Precondition failed: {shown} in precondition: {want}, {shown} in \
                         object meta: {have}"
                    );
                    return Err(ApiError::new(409, "Conflict", message)
                        .with_details(target.kind().details(&key.name)));
                }
            }
        }
        // Present: checked above.
        Ok(store.delete_object(key).unwrap_or(Value::Null))
    })
}
