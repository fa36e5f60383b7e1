//! Authentication (bearer tokens), the RBAC-like rule table, TokenReview and TokenRequest.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};

use super::*;

#[derive(Clone, Debug)]
pub(super) enum Scope {
    /// Every namespace and cluster-scoped objects.
    Cluster,
    Namespace(String),
    /// The requesting service account's own namespace.
    OwnNamespace,
}

#[derive(Debug)]
pub(super) struct Rule {
    pub(super) subject: Subject,
    pub(super) verb: String,
    pub(super) group: String,
    pub(super) resource: String,
    pub(super) scope: Scope,
}

pub(super) struct Auth {
    pub(super) tokens: HashMap<String, Identity>,
    /// The audiences of tokens bound to some; a token absent here is good for any.
    pub(super) audiences: HashMap<String, Vec<String>>,
    pub(super) rules: Vec<Rule>,
    /// Tokens minted by TokenRequests.
    pub(super) minted: HashMap<String, Minted>,
    pub(super) token_requests: Vec<TokenRequestRecord>,
    /// How far [`FakeApiServer::advance_token_clock`] moved the clock tokens live by.
    pub(super) clock_offset: Duration,
    /// Signs minted tokens (ES256), so that they are real JWTs.
    signer: EcdsaKeyPair,
}

impl Auth {
    pub(super) fn new() -> Self {
        let rng = SystemRandom::new();
        let alg = &ECDSA_P256_SHA256_FIXED_SIGNING;
        // A fresh P-256 key cannot fail to generate or parse: a true invariant.
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("generate a P-256 key");
        let signer =
            EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("parse a fresh P-256 key");
        Self {
            tokens: HashMap::new(),
            audiences: HashMap::new(),
            rules: Vec::new(),
            minted: HashMap::new(),
            token_requests: Vec::new(),
            clock_offset: Duration::ZERO,
            signer,
        }
    }

    /// Now on the token clock, in Unix seconds.
    fn token_now(&self) -> u64 {
        let now = std::time::SystemTime::now() + self.clock_offset;
        now.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// A token a TokenRequest minted: valid until `expires` while its service account exists.
#[derive(Clone)]
pub(super) struct Minted {
    namespace: String,
    name: String,
    uid: String,
    audiences: Vec<String>,
    /// Unix seconds, on the token clock.
    expires: u64,
}

/// Who a token is, and for which audiences (`None`: any), or why it is not valid.
type Authenticated = Result<(Identity, Option<Vec<String>>), String>;

impl Shared {
    /// The identity of the request's bearer token, if it may call the API.
    pub(super) fn authenticate(&self, headers: &HeaderMap) -> Option<Identity> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        match self.token_identity(token.trim()) {
            Ok((identity, None)) => Some(identity),
            Ok((identity, Some(audiences))) => audiences
                .iter()
                .any(|a| a == API_AUDIENCE)
                .then_some(identity),
            Err(_) => None,
        }
    }

    /// What the authenticator makes of `token`: a registered one, or a minted one that has not
    /// expired and whose service account still exists.
    pub(super) fn token_identity(&self, token: &str) -> Authenticated {
        let minted = {
            let auth = lock(&self.auth);
            if let Some(identity) = auth.tokens.get(token) {
                return Ok((identity.clone(), auth.audiences.get(token).cloned()));
            }
            let minted = auth.minted.get(token).cloned();
            minted.map(|m| (auth.token_now() >= m.expires, m))
        };
        let Some((expired, minted)) = minted else {
            return Err("token is not valid".to_string());
        };
        if expired {
            return Err("service account token has expired".to_string());
        }
        let exists =
            lock(&self.store).service_account_exists(&minted.namespace, &minted.name, &minted.uid);
        if !exists {
            return Err(format!("serviceaccounts \"{}\" not found", minted.name));
        }
        let identity = service_account_identity(&minted.namespace, &minted.name);
        Ok((identity, Some(minted.audiences)))
    }

    /// The uid of a service account identity; `None` for users.
    pub(super) fn uid_of(&self, identity: &Identity) -> Option<String> {
        let (namespace, name) = match identity {
            Identity::Agent => (AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT),
            Identity::ServiceAccount { namespace, name } => (namespace.as_str(), name.as_str()),
            Identity::User(_) => return None,
        };
        Some(lock(&self.store).service_account_uid(namespace, name))
    }
}

/// The identity of service account `namespace/name` (the agent's own is [`Identity::Agent`]).
fn service_account_identity(namespace: &str, name: &str) -> Identity {
    if (namespace, name) == (AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT) {
        Identity::Agent
    } else {
        Identity::service_account(namespace, name)
    }
}

/// What is asked, in RBAC terms.
pub(super) struct Attributes<'a> {
    pub(super) verb: &'static str,
    pub(super) kind: &'static Kind,
    pub(super) subresource: Option<&'a str>,
    pub(super) namespace: Option<&'a str>,
    pub(super) name: Option<&'a str>,
}

impl Attributes<'_> {
    /// `secrets`, or `externalsecrets/status` for a subresource.
    pub(super) fn resource(&self) -> String {
        match self.subresource {
            Some(sub) => format!("{}/{sub}", self.kind.plural),
            None => self.kind.plural.to_string(),
        }
    }
}

impl Rule {
    pub(super) fn permits(&self, who: &Identity, request: &Attributes<'_>) -> bool {
        let wild = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        self.subject_matches(who)
            && wild(&self.verb, request.verb)
            && wild(&self.group, request.kind.group)
            && wild(&self.resource, &request.resource())
            && match &self.scope {
                Scope::Cluster => true,
                Scope::Namespace(ns) => request.namespace == Some(ns.as_str()),
                Scope::OwnNamespace => {
                    who.namespace().is_some() && request.namespace == who.namespace()
                }
            }
    }

    pub(super) fn subject_matches(&self, who: &Identity) -> bool {
        match &self.subject {
            Subject::Is(identity) => identity == who,
            Subject::AnyServiceAccount => !matches!(who, Identity::User(_)),
            Subject::Anyone => true,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TokenReview
// ---------------------------------------------------------------------------------------------

pub(super) const TOKEN_REVIEWS_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// `authentication.k8s.io/v1` TokenReviews: create-only, never stored.
pub(super) static TOKEN_REVIEW_KIND: Kind = Kind {
    group: "authentication.k8s.io",
    version: "v1",
    plural: "tokenreviews",
    kind: "TokenReview",
    namespaced: false,
    crd: false,
    status_subresource: false,
    fields: &[],
};

/// Reviews `spec.token` for a caller allowed to `create` `tokenreviews`; 201 with the review.
pub(super) async fn token_review(
    shared: &Shared,
    identity: &Identity,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    if parts.method != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    let attributes = Attributes {
        verb: "create",
        kind: &TOKEN_REVIEW_KIND,
        subresource: None,
        namespace: None,
        name: None,
    };
    shared.authorize(identity, &attributes)?;
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
    let review = parse_json(&body)?;
    let kind = &TOKEN_REVIEW_KIND;
    let wrong_type = |field: &str, want: &str| {
        let found = review.get(field).and_then(Value::as_str).unwrap_or(want);
        found != want
    };
    if wrong_type("apiVersion", &kind.api_version()) || wrong_type("kind", kind.kind) {
        return Err(ApiError::bad_request(format!(
            "the body of the request was in an unknown format: expected {} {}",
            kind.api_version(),
            kind.kind
        )));
    }
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("");
    if token.is_empty() {
        return Err(ApiError::invalid(
            kind,
            "",
            vec![Cause::required("spec.token", "")],
        ));
    }
    let requested = audiences_of(review.pointer("/spec/audiences"))?;
    let status = review_status(shared, token, &requested);
    let mut spec = json!({"token": token});
    if !requested.is_empty() {
        spec["audiences"] = json!(requested);
    }
    let answer = json!({
        "kind": kind.kind,
        "apiVersion": kind.api_version(),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    });
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// The `status` of a review of `token` for `requested` audiences (the API's own when empty).
pub(super) fn review_status(shared: &Shared, token: &str, requested: &[String]) -> Value {
    let wanted: Vec<String> = if requested.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        requested.to_vec()
    };
    let failed = |error: String| json!({"authenticated": false, "user": {}, "error": format!("[invalid bearer token, {error}]")});
    let (identity, bound) = match shared.token_identity(token) {
        Ok(found) => found,
        Err(error) => return failed(error),
    };
    let audiences = match bound {
        None => wanted,
        Some(bound) => {
            let shared_audiences: Vec<String> = wanted
                .iter()
                .filter(|a| bound.contains(a))
                .cloned()
                .collect();
            if shared_audiences.is_empty() {
                return failed(format!(
                    "token audiences {bound:?} is invalid for the target audiences {wanted:?}"
                ));
            }
            shared_audiences
        }
    };
    let mut user = json!({"username": identity.username()});
    let mut groups = Vec::new();
    if let Some(namespace) = identity.namespace() {
        groups.push("system:serviceaccounts".to_string());
        groups.push(format!("system:serviceaccounts:{namespace}"));
        user["uid"] = json!(shared.uid_of(&identity));
    }
    groups.push("system:authenticated".to_string());
    user["groups"] = json!(groups);
    json!({"authenticated": true, "user": user, "audiences": audiences})
}

// ---------------------------------------------------------------------------------------------
// TokenRequest
// ---------------------------------------------------------------------------------------------

/// The issuer of minted tokens (a kubeadm cluster's).
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// `spec.expirationSeconds` when none is asked for.
const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// `authentication.k8s.io/v1` TokenRequests (for messages; never stored).
static TOKEN_REQUEST_KIND: Kind = Kind {
    group: "authentication.k8s.io",
    version: "v1",
    plural: "tokenrequests",
    kind: "TokenRequest",
    namespaced: true,
    crd: false,
    status_subresource: false,
    fields: &[],
};

/// `POST .../serviceaccounts/NAME/token` (already authorised): mints a token for the service
/// account, answered as the real server does (201, spec echoed with defaults, the token and its
/// expiry in `status`).
pub(super) fn token_request(
    shared: &Shared,
    target: &Target,
    body: &[u8],
) -> Result<Value, ApiError> {
    let key = target.key()?;
    let request = parse_json(body)?;
    let kind = &TOKEN_REQUEST_KIND;
    for (field, want) in [
        ("apiVersion", kind.api_version()),
        ("kind", kind.kind.to_string()),
    ] {
        match request.get(field).and_then(Value::as_str) {
            Some(got) if !got.is_empty() && got != want => {
                return Err(ApiError::bad_request(format!(
                    "the {field} of the provided object ({got}) does not match the {field} \
                     expected by the request ({want})"
                )));
            }
            _ => {}
        }
    }
    for (field, want) in [("name", &key.name), ("namespace", &key.namespace)] {
        match request
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
        {
            Some(got) if !got.is_empty() && got != want => {
                let detail = format!("must match the service account {field} if specified");
                let cause = Cause::invalid(&format!("metadata.{field}"), &json!(got), &detail);
                return Err(ApiError::invalid(kind, &key.name, vec![cause]));
            }
            _ => {}
        }
    }
    let uid = {
        let store = lock(&shared.store);
        let account = store.current(&key);
        let uid = account
            .and_then(|sa| meta_str(sa, "uid"))
            .map(str::to_string);
        uid.ok_or_else(|| ApiError::not_found(target.kind(), &key.name))?
    };
    let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
    let audiences = audiences_of(spec.get("audiences"))?;
    let audiences = if audiences.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        audiences
    };
    let seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_TOKEN_SECONDS,
        Some(value) => value
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds: expected an integer"))?,
    };
    let too_short = seconds < 600;
    if too_short || seconds > 1 << 32 {
        let detail = if too_short {
            "may not specify a duration less than 10 minutes"
        } else {
            "may not specify a duration larger than 2^32 seconds"
        };
        let cause = Cause::invalid("spec.expirationSeconds", &json!(seconds), detail);
        return Err(ApiError::invalid(kind, "", vec![cause]));
    }
    if spec.get("boundObjectRef").is_some_and(|b| !b.is_null()) {
        return Err(ApiError::bad_request(
            "spec.boundObjectRef is not supported by the fake API server (it serves no Pods)",
        ));
    }

    let jti = lock(&shared.store).new_uid();
    let mut auth = lock(&shared.auth);
    let now = auth.token_now();
    let expires = now + seconds.unsigned_abs();
    let claims = json!({
        "aud": audiences,
        "exp": expires,
        "iat": now,
        "iss": ISSUER,
        "jti": jti,
        "kubernetes.io": {
            "namespace": key.namespace,
            "serviceaccount": {"name": key.name, "uid": uid},
        },
        "nbf": now,
        "sub": format!("system:serviceaccount:{}:{}", key.namespace, key.name),
    });
    let token = sign(&auth.signer, &claims)?;
    auth.minted.insert(
        token.clone(),
        Minted {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid,
            audiences: audiences.clone(),
            expires,
        },
    );
    auth.token_requests.push(TokenRequestRecord {
        namespace: key.namespace.clone(),
        service_account: key.name.clone(),
        audiences: audiences.clone(),
        expiration_seconds: seconds,
    });
    Ok(json!({
        "kind": kind.kind,
        "apiVersion": kind.api_version(),
        "metadata": {"name": key.name, "namespace": key.namespace, "creationTimestamp": rfc3339(now)},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": null},
        "status": {"token": token, "expirationTimestamp": rfc3339(expires)},
    }))
}

/// A compact JWS (ES256) of `claims`.
fn sign(signer: &EcdsaKeyPair, claims: &Value) -> Result<String, ApiError> {
    let encode = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
    let header = json!({"alg": "ES256", "kid": "fake-apiserver"});
    let input = format!("{}.{}", encode(&header), encode(claims));
    let signature = signer
        .sign(&SystemRandom::new(), input.as_bytes())
        .map_err(|_| ApiError::new(500, "InternalError", "signing the token failed"))?;
    Ok(format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(signature.as_ref())
    ))
}

fn rfc3339(unix_seconds: u64) -> String {
    let seconds = i64::try_from(unix_seconds).unwrap_or(i64::MAX);
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `spec.audiences` of a TokenReview or TokenRequest: absent or null is none.
fn audiences_of(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .map(|a| a.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_request("spec.audiences: expected strings")),
        Some(_) => Err(ApiError::bad_request("spec.audiences: expected a list")),
    }
}
