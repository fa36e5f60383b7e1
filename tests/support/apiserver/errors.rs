//! Failed requests as `Status` objects shaped like the real server's.

use super::*;

/// A failed request, rendered as a `Status` body.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) code: u16,
    pub(super) reason: &'static str,
    pub(super) message: String,
    pub(super) details: Option<Value>,
    /// Sent as a `Retry-After` header too, as the real server does for 429s.
    pub(super) retry_after: Option<u64>,
    /// Answered as Go's mux does for a path nothing serves: `404 page not found`, plain text.
    pub(super) plain: bool,
}

/// One cause of an `Invalid` status: a field and what is wrong with it (a Go `field.Error`).
#[derive(Debug)]
pub(super) struct Cause {
    reason: &'static str,
    field: String,
    /// `Invalid value: "x": detail`, `Forbidden: detail`, ...
    body: String,
}

impl Cause {
    pub(super) fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        let value = serde_json::to_string(value).unwrap_or_default();
        Self::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {value}: {detail}"),
        )
    }

    pub(super) fn required(field: &str, detail: &str) -> Self {
        let body = match detail {
            "" => "Required value".to_string(),
            detail => format!("Required value: {detail}"),
        };
        Self::new("FieldValueRequired", field, body)
    }

    pub(super) fn forbidden(field: &str, detail: &str) -> Self {
        Self::new("FieldValueForbidden", field, format!("Forbidden: {detail}"))
    }

    pub(super) fn too_long(field: &str, max: usize) -> Self {
        let body = format!("Too long: must have at most {max} bytes");
        Self::new("FieldValueTooLong", field, body)
    }

    fn new(reason: &'static str, field: &str, body: String) -> Self {
        Self {
            reason,
            field: field.to_string(),
            body,
        }
    }
}

impl ApiError {
    pub(super) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
            plain: false,
        }
    }

    /// A path no API serves (a group or a CRD that is not installed).
    pub(super) fn page_not_found() -> Self {
        Self {
            plain: true,
            ..Self::new(404, "NotFound", "404 page not found")
        }
    }

    pub(super) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(super) fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }

    pub(super) fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if self.plain {
            let mut response = Response::new(Body::from(format!("{}\n", self.message)));
            *response.status_mut() = code;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return response;
        }
        let mut response = json_response(code, &self.status());
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }

    pub(super) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub(super) fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub(super) fn not_found(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", kind.qualified());
        Self::new(404, "NotFound", message).with_details(kind.details(name))
    }

    pub(super) fn already_exists(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", kind.qualified());
        Self::new(409, "AlreadyExists", message).with_details(kind.details(name))
    }

    pub(super) fn conflict(kind: &Kind, name: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again",
            kind.qualified()
        );
        Self::new(409, "Conflict", message).with_details(kind.details(name))
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(super) fn invalid(kind: &Kind, name: &str, causes: Vec<Cause>) -> Self {
        Self::invalid_of(kind.group, kind.kind, name, causes)
    }

    /// `Kind.group "name" is invalid: field: problem`, or `[...]` around several causes.
    pub(super) fn invalid_of(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let group_kind = match group {
            "" => kind.to_string(),
            group => format!("{kind}.{group}"),
        };
        let problems: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.body))
            .collect();
        let problems = match problems.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let message = format!("{group_kind} \"{name}\" is invalid: {problems}");
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.body, "field": c.field}))
            .collect();
        let mut details = json!({"name": name, "kind": kind, "causes": causes});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        Self::new(422, "Invalid", message).with_details(details)
    }

    /// A server-side apply that would change fields other managers own (without `force`).
    pub(super) fn apply_conflict(conflicts: &[(String, String)]) -> Self {
        let message = match conflicts {
            [(manager, path)] => {
                format!("Apply failed with 1 conflict: conflict with {manager}: {path}")
            }
            _ => {
                let mut managers: Vec<&String> = conflicts.iter().map(|(m, _)| m).collect();
                managers.sort();
                managers.dedup();
                let mut lines = Vec::new();
                for manager in managers {
                    lines.push(format!("conflicts with {manager}:"));
                    lines.extend(
                        conflicts
                            .iter()
                            .filter(|(m, _)| m == manager)
                            .map(|(_, path)| format!("- {path}")),
                    );
                }
                format!(
                    "Apply failed with {} conflicts: {}",
                    conflicts.len(),
                    lines.join("\n")
                )
            }
        };
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, path)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager}"),
                       "field": path})
            })
            .collect();
        Self::new(409, "Conflict", message).with_details(json!({"causes": causes}))
    }

    pub(super) fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, \
             application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, \
             application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
    }

    pub(super) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types \
                 include: application/merge-patch+json, application/apply-patch+yaml (the fake \
                 API server supports no other patch type, not {content_type:?})"
            ),
        )
    }

    /// The failure [`FakeApiServer::fail_next`] injects, shaped as the real server sends it.
    pub(super) fn injected(code: u16, target: Option<&Target>) -> Self {
        const WHY: &str = "injected by the fake API server";
        let named = target.and_then(|t| Some((t.kind(), t.name.as_deref()?)));
        match (code, named) {
            (409, Some((kind, name))) => Self::conflict(kind, name),
            (404, Some((kind, name))) => Self::not_found(kind, name),
            (422, Some((kind, name))) => {
                Self::invalid(kind, name, vec![Cause::forbidden("metadata", WHY)])
            }
            (422, None) => {
                Self::invalid_of("", "Unknown", "", vec![Cause::forbidden("metadata", WHY)])
            }
            (429, _) => {
                let mut error = Self::new(
                    429,
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                )
                .with_details(json!({"retryAfterSeconds": 1}));
                error.retry_after = Some(1);
                error
            }
            (500, _) => Self::new(
                500,
                "InternalError",
                format!("Internal error occurred: {WHY}"),
            )
            .with_details(json!({"causes": [{"message": WHY}]})),
            (503, _) => Self::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            (504, _) => Self::new(
                504,
                "Timeout",
                "Timeout: request did not complete within requested timeout - context deadline \
                 exceeded",
            ),
            (code, _) => {
                let reason = match code {
                    400 => "BadRequest",
                    401 => "Unauthorized",
                    403 => "Forbidden",
                    404 => "NotFound",
                    405 => "MethodNotAllowed",
                    406 => "NotAcceptable",
                    409 => "Conflict",
                    410 => "Expired",
                    415 => "UnsupportedMediaType",
                    _ => "Unknown",
                };
                Self::new(code, reason, WHY)
            }
        }
    }

    pub(super) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(super) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub(super) fn forbidden(who: &Identity, request: &Attributes<'_>) -> Self {
        let kind = request.kind;
        let object = match request.name {
            Some(name) => format!("{} \"{name}\"", kind.qualified()),
            None => kind.qualified(),
        };
        let scope = match request.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let message = format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            who.username(),
            request.verb,
            request.resource(),
            kind.group
        );
        Self::new(403, "Forbidden", message).with_details(kind.details(request.name.unwrap_or("")))
    }
}

pub(super) fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
