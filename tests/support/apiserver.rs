//! An in-process fake Kubernetes API server for the end-to-end tests (no real one can run here).
//!
//! It serves plain HTTP/1.1 on `127.0.0.1:<random port>` and answers what kube-rs sends for the
//! kinds Latchkey uses: `latchkey.dev/v1alpha1` ExternalSecrets, SecretStores (namespaced) and
//! ClusterSecretStores; `v1` Namespaces, Secrets and Events; `events.k8s.io/v1` Events.
//!
//! What it does, the way the real server does it:
//! - one global, monotonically increasing resourceVersion (an etcd revision) shared by all kinds,
//!   multi-version storage (so paginated lists are consistent snapshots), and compaction: a watch
//!   or `continue` token older than the compacted revision gets `410 Gone` (reason `Expired`);
//! - verbs get, list (`limit`/`continue` pagination, `resourceVersion` + `resourceVersionMatch`),
//!   watch (newline-delimited JSON events on a chunked response: synthetic ADDED events for
//!   `resourceVersion` unset or `0`, then ADDED/MODIFIED/DELETED; a too-old resourceVersion is
//!   an HTTP 200 stream with one ERROR event; BOOKMARK when the `timeoutSeconds` deadline ends
//!   the stream and, with `sendInitialEvents=true`, after the initial events), create (201,
//!   409 AlreadyExists, `generateName`), update (PUT, 409 Conflict on a stale
//!   resourceVersion), JSON merge patch and delete, plus the `status` subresource of the CRDs;
//! - label selectors (`k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`), field
//!   selectors on `metadata.name`/`metadata.namespace` (and a few per-kind fields); an object
//!   that stops matching a watch's selector is sent as DELETED, one that starts matching as ADDED;
//! - server-owned fields: uid, creationTimestamp, resourceVersion, generation (CRDs); Secret
//!   `stringData` folded into base64 `data`; Namespaces get phase `Active` and the
//!   `kubernetes.io/metadata.name` label; creating in a missing namespace is a 404;
//! - authentication by bearer token (unknown or missing token: 401; a token bound to audiences
//!   that exclude [`API_AUDIENCE`]: 401) and a small RBAC-like rule table (anything not
//!   allowed: 403 with the real message shape); errors are `Status` JSON;
//! - TokenReview (`POST /apis/authentication.k8s.io/v1/tokenreviews`, verb `create` on
//!   `tokenreviews` in `authentication.k8s.io`): the registered tokens' identities with
//!   username, uid (one per service account, see [`FakeApiServer::service_account_uid`]),
//!   groups and audiences, as Vault's and OpenBao's kubernetes auth method call it.
//!
//! What it does not do: TLS, discovery (`/api`, `/apis`, `/version`), OpenAPI schema or CEL
//! validation of CRD objects, strategic-merge, JSON and server-side-apply patches (415),
//! `dryRun`, deletecollection, finalizers and graceful deletion, namespace termination (deleting
//! a Namespace does not delete its contents), Table/PartialObjectMetadata responses, periodic
//! bookmarks, TokenRequest, impersonation, other authentication/authorization reviews, and
//! signature checks on JWT-looking tokens (a TokenReview trusts the registered tokens). The
//! history kept for watches grows until `compact()` is called.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot, watch};

/// Namespace of the node agent's service account (as in `daemonset/rbac.yaml`).
pub const AGENT_NAMESPACE: &str = "latchkey";
/// Name of the node agent's service account (as in `daemonset/rbac.yaml`).
pub const AGENT_SERVICE_ACCOUNT: &str = "latchkey-node";

/// The API server's own audience: what a token must be for to call the API, and what a
/// TokenReview with no `spec.audiences` checks against.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;
/// The `closed` generation that means the server is gone: no watch may start any more.
const STOPPED: u64 = u64::MAX;
/// Watch duration when the client sends no `timeoutSeconds` (the real server's minimum).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

// ---------------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------------

/// Who a bearer token authenticates as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The node agent: service account `latchkey/latchkey-node`.
    Agent,
    /// A pod's (or any) service account.
    ServiceAccount { namespace: String, name: String },
    /// Any other user, e.g. an administrator used for test setup through the API.
    User(String),
}

impl Identity {
    /// A service account identity.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Identity::ServiceAccount {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The username the real server would authorise (`system:serviceaccount:ns:name`).
    pub fn username(&self) -> String {
        match self {
            Identity::Agent => {
                format!("system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}")
            }
            Identity::ServiceAccount { namespace, name } => {
                format!("system:serviceaccount:{namespace}:{name}")
            }
            Identity::User(name) => name.clone(),
        }
    }

    /// The namespace of a service account identity.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Identity::Agent => Some(AGENT_NAMESPACE),
            Identity::ServiceAccount { namespace, .. } => Some(namespace),
            Identity::User(_) => None,
        }
    }
}

/// Whom a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// Exactly this identity.
    Is(Identity),
    /// Every service account (the agent included).
    AnyServiceAccount,
    /// Every authenticated identity.
    Anyone,
}

impl From<Identity> for Subject {
    fn from(identity: Identity) -> Self {
        Subject::Is(identity)
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The URL path, e.g. `/api/v1/namespaces/shop/secrets/db`.
    pub path: String,
    /// The raw (percent-encoded) query string, empty when there is none.
    pub query: String,
    /// Who the bearer token authenticated as; `None` when it did not.
    pub identity: Option<Identity>,
}

impl RecordedRequest {
    /// The decoded value of a query parameter.
    pub fn param(&self, key: &str) -> Option<String> {
        query_pairs(&self.query)
            .ok()?
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// A watch request (`?watch=true`).
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch").as_deref(), Some("true" | "1"))
    }

    /// A list request: a GET of a collection that is not a watch.
    pub fn is_list_of(&self, collection_path: &str) -> bool {
        self.method == "GET" && self.path == collection_path && !self.is_watch()
    }
}

/// The fake server; stops (and ends every open watch) when dropped.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl FakeApiServer {
    /// Starts a server on a free loopback port, with no identities and no rules.
    pub async fn start() -> Self {
        // The test process builds kube clients too: pick rustls' provider as the agent does.
        latchkey::tls::install_crypto_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake API server");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared::new());
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let (shutdown, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            addr,
            shared,
            shutdown: Some(shutdown),
        }
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (cluster, user with `token`, context) pointing at this server.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        // JSON string literals are valid YAML double-quoted scalars.
        let token = serde_json::to_string(token).unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: fake-user\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  \
             context:\n    cluster: fake\n    user: fake-user\n    namespace: default\n\
             current-context: fake\n",
            self.url()
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (for the agent's `KUBECONFIG`).
    pub fn kubeconfig(&self, path: &Path, token: &str) {
        std::fs::write(path, self.kubeconfig_yaml(token)).expect("write kubeconfig");
    }

    /// A kube-rs client configured from the kubeconfig for `token`, as the agent builds one.
    pub async fn client(&self, token: &str) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml(token))
            .expect("parse kubeconfig");
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .expect("kubeconfig to config");
        kube::Client::try_from(config).expect("kube client")
    }

    /// Makes `token` authenticate as `identity`, for any audience (API calls and every
    /// TokenReview).
    pub fn add_identity(&self, token: &str, identity: Identity) {
        let mut auth = lock(&self.shared.auth);
        auth.tokens.insert(token.to_string(), identity);
        auth.audiences.remove(token);
    }

    /// Makes `token` authenticate as `identity` for these audiences only, as a projected token
    /// does: it calls the API only when they include [`API_AUDIENCE`], and a TokenReview
    /// authenticates it only for audiences it shares with the review's `spec.audiences`.
    pub fn add_identity_for_audiences(&self, token: &str, identity: Identity, audiences: &[&str]) {
        let mut auth = lock(&self.shared.auth);
        auth.tokens.insert(token.to_string(), identity);
        let audiences = audiences.iter().map(|a| a.to_string()).collect();
        auth.audiences.insert(token.to_string(), audiences);
    }

    /// The uid of service account `namespace/name` (random, fixed for this server), as a
    /// TokenReview reports it and as its tokens' `kubernetes.io.serviceaccount.uid` claim must
    /// carry it.
    pub fn service_account_uid(&self, namespace: &str, name: &str) -> String {
        self.shared
            .uid_of(&Identity::service_account(namespace, name))
            .unwrap_or_default()
    }

    /// Allows `verb` on `resource` (`secrets`, `externalsecrets/status`, `*`) of API `group`
    /// (`""` for core, `*`) in `namespace`, or everywhere (cluster scope) when `None`.
    pub fn allow(
        &self,
        subject: impl Into<Subject>,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) {
        let scope = namespace.map_or(Scope::Cluster, |ns| Scope::Namespace(ns.to_string()));
        self.add_rule(subject.into(), verb, group, resource, scope);
    }

    /// Allows `verb` on `resource` in the requester's own (service account) namespace only.
    pub fn allow_in_own_namespace(
        &self,
        subject: impl Into<Subject>,
        verb: &str,
        group: &str,
        resource: &str,
    ) {
        self.add_rule(subject.into(), verb, group, resource, Scope::OwnNamespace);
    }

    /// The DESIGN's permissions, as `daemonset/rbac.yaml` grants them: the agent may
    /// get/list/watch Latchkey objects and Namespaces cluster-wide, create/patch core Events,
    /// and get Secrets only in its own namespace; every service account may get the Secrets of
    /// its own namespace (the Role a user grants pods for the `kubernetes` provider).
    pub fn allow_defaults(&self) {
        for verb in ["get", "list", "watch"] {
            for resource in ["externalsecrets", "secretstores", "clustersecretstores"] {
                self.allow(Identity::Agent, verb, "latchkey.dev", resource, None);
            }
            self.allow(Identity::Agent, verb, "", "namespaces", None);
        }
        self.allow(Identity::Agent, "create", "", "events", None);
        self.allow(Identity::Agent, "patch", "", "events", None);
        self.allow(Identity::Agent, "get", "", "secrets", Some(AGENT_NAMESPACE));
        self.allow_in_own_namespace(Subject::AnyServiceAccount, "get", "", "secrets");
    }

    /// Creates or replaces an object (test setup, no authorisation, status kept as given):
    /// sets uid/creationTimestamp (kept on replace), bumps the resourceVersion and notifies
    /// watchers, unless nothing changed. Returns the stored object.
    pub fn apply(&self, object: Value) -> Value {
        let (kind, namespace, name) = identify(&object);
        let key = Key::new(kind, &namespace, &name);
        self.shared
            .mutate(|store| store.apply(key, object))
            .unwrap_or_else(|e| panic!("apply {namespace}/{name}: {}", e.message))
    }

    /// Deletes an object (test setup), notifying watchers; returns its last state.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let key = Key::new(
            kind_by_type(api_version, kind),
            namespace.unwrap_or(""),
            name,
        );
        self.shared.mutate(|store| {
            store.current(&key)?;
            Some(store.write(key, None))
        })
    }

    /// The current state of an object.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let key = Key::new(
            kind_by_type(api_version, kind),
            namespace.unwrap_or(""),
            name,
        );
        lock(&self.shared.store).current(&key).cloned()
    }

    /// Every current object of a kind, in key (namespace, name) order.
    pub fn objects(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let kind = kind_by_type(api_version, kind);
        let store = lock(&self.shared.store);
        let rv = store.rv;
        store.snapshot(kind, rv).map(|(_, o)| o.clone()).collect()
    }

    /// Every current Event, `v1` ones first, then `events.k8s.io/v1` ones.
    pub fn events(&self) -> Vec<Value> {
        let mut events = self.objects("v1", "Event");
        events.extend(self.objects("events.k8s.io/v1", "Event"));
        events
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv
    }

    /// Makes every resourceVersion issued so far "too old", as if writes to other kinds had
    /// happened and etcd had been compacted, then ends every open watch (as an API server
    /// restart does): a client that re-watches from its last resourceVersion gets 410 Gone and
    /// must list again.
    pub fn compact(&self) {
        self.shared.mutate(|store| {
            // Under the store lock, so that no watch streams a step past the compaction.
            self.shared.close_watches();
            store.rv += 1;
            let upto = store.rv;
            store.compact(upto);
        });
    }

    /// Ends every open watch stream cleanly (as a watch timeout or API server restart does).
    pub fn close_watches(&self) {
        self.shared.close_watches();
    }

    /// How many watch streams are open now (to wait until a client is watching).
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    fn add_rule(&self, subject: Subject, verb: &str, group: &str, resource: &str, scope: Scope) {
        lock(&self.shared.auth).rules.push(Rule {
            subject,
            verb: verb.to_string(),
            group: group.to_string(),
            resource: resource.to_string(),
            scope,
        });
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shared.closed.send_replace(STOPPED);
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The kinds served
// ---------------------------------------------------------------------------------------------

/// One served resource type.
#[derive(Debug)]
struct Kind {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    /// A custom resource: tracks `generation`; list items keep `apiVersion`/`kind`.
    crd: bool,
    /// Has a `status` subresource: writes to the main resource ignore `.status`.
    status_subresource: bool,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    fields: &'static [&'static str],
}

/// Index of `v1` Namespaces in [`KINDS`].
const NAMESPACE_KIND: usize = 0;

const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        crd: false,
        status_subresource: true,
        fields: &["status.phase"],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &["type"],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[
            "involvedObject.apiVersion",
            "involvedObject.fieldPath",
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.resourceVersion",
            "involvedObject.uid",
            "reason",
            "reportingComponent",
            "type",
        ],
    },
    Kind {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        crd: false,
        status_subresource: false,
        fields: &[
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "reason",
            "type",
        ],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "externalsecrets",
        kind: "ExternalSecret",
        namespaced: true,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "secretstores",
        kind: "SecretStore",
        namespaced: true,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
    Kind {
        group: "latchkey.dev",
        version: "v1alpha1",
        plural: "clustersecretstores",
        kind: "ClusterSecretStore",
        namespaced: false,
        crd: true,
        status_subresource: true,
        fields: &[],
    },
];

impl Kind {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The group-qualified resource used in messages: `secrets`, `externalsecrets.latchkey.dev`.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `details` of a Status about one object of this kind.
    fn details(&self, name: &str) -> Value {
        let mut details = json!({"name": name, "kind": self.plural});
        if !self.group.is_empty() {
            details["group"] = json!(self.group);
        }
        details
    }
}

fn kind_by_path(group: &str, version: &str, plural: &str) -> Option<usize> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.plural == plural)
}

/// The kind of a Rust-side call; panics on a kind the fake does not serve (test setup error).
fn kind_by_type(api_version: &str, kind: &str) -> usize {
    KINDS
        .iter()
        .position(|k| k.api_version() == api_version && k.kind == kind)
        .unwrap_or_else(|| panic!("the fake API server does not serve {api_version} {kind}"))
}

/// Kind, namespace and name of an object handed to [`FakeApiServer::apply`].
fn identify(object: &Value) -> (usize, String, String) {
    let field = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let kind = kind_by_type(&field(object.get("apiVersion")), &field(object.get("kind")));
    let name = field(object.pointer("/metadata/name"));
    let namespace = field(object.pointer("/metadata/namespace"));
    assert!(!name.is_empty(), "apply: metadata.name is required");
    assert_eq!(
        KINDS[kind].namespaced,
        !namespace.is_empty(),
        "apply {name}: metadata.namespace must be set exactly for namespaced kinds"
    );
    (kind, namespace, name)
}

// ---------------------------------------------------------------------------------------------
// Errors as Status objects
// ---------------------------------------------------------------------------------------------

/// A failed request, rendered as a `Status` body.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn status(&self) -> Value {
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

    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.status())
    }

    fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    fn not_found(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", kind.qualified());
        Self::new(404, "NotFound", message).with_details(kind.details(name))
    }

    fn already_exists(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", kind.qualified());
        Self::new(409, "AlreadyExists", message).with_details(kind.details(name))
    }

    fn conflict(kind: &Kind, name: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again",
            kind.qualified()
        );
        Self::new(409, "Conflict", message).with_details(kind.details(name))
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn invalid(kind: &Kind, name: &str, field: &str, problem: &str) -> Self {
        let cause = format!("{field}: {problem}");
        let message = format!("{} \"{name}\" is invalid: {cause}", kind.kind);
        let mut details = json!({"name": name, "kind": kind.kind, "causes": [
            {"reason": "FieldValueInvalid", "message": problem, "field": field}
        ]});
        if !kind.group.is_empty() {
            details["group"] = json!(kind.group);
        }
        Self::new(422, "Invalid", message).with_details(details)
    }

    fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    fn forbidden(who: &Identity, request: &Attributes<'_>) -> Self {
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

fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

// ---------------------------------------------------------------------------------------------
// Storage: multi-version, with a change log for watches
// ---------------------------------------------------------------------------------------------

/// Where an object lives; ordered like etcd keys: kind, then `namespace/name` (or `name`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    kind: usize,
    /// `namespace/name` for namespaced objects, `name` for cluster-scoped ones.
    path: String,
    namespace: String,
    name: String,
}

impl Key {
    fn new(kind: usize, namespace: &str, name: &str) -> Self {
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
    fn first(kind: usize) -> Self {
        Self::new(kind, "", "")
    }
}

/// One version of an object; `None` is a deletion (tombstone).
struct Revision {
    rv: u64,
    object: Option<Value>,
}

/// One write, as watchers see it.
struct Change {
    rv: u64,
    key: Key,
    /// The state before the write (to decide ADDED/DELETED under a selector).
    before: Option<Value>,
    /// The state after the write; for a deletion, the last state stamped with `rv`.
    object: Value,
    deleted: bool,
}

struct Store {
    /// The latest resourceVersion issued (etcd's revision).
    rv: u64,
    /// Versions at or below this are gone from history.
    compacted: u64,
    objects: BTreeMap<Key, Vec<Revision>>,
    log: Vec<Change>,
    serial: u64,
    seed: u64,
}

impl Store {
    fn new() -> Self {
        Self {
            rv: 1,
            compacted: 0,
            objects: BTreeMap::new(),
            log: Vec::new(),
            serial: 0,
            seed: RandomState::new().build_hasher().finish(),
        }
    }

    fn current(&self, key: &Key) -> Option<&Value> {
        self.objects
            .get(key)
            .and_then(|revisions| revisions.last())
            .and_then(|revision| revision.object.as_ref())
    }

    /// Every object of `kind` as it was at `rv`, in key order.
    fn snapshot(&self, kind: usize, rv: u64) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects
            .range(Key::first(kind)..)
            .take_while(move |(key, _)| key.kind == kind)
            .filter_map(move |(key, revisions)| {
                let revision = revisions.iter().rev().find(|r| r.rv <= rv)?;
                revision.object.as_ref().map(|object| (key, object))
            })
    }

    /// Stores a new version (or a deletion) under a fresh resourceVersion.
    fn write(&mut self, key: Key, object: Option<Value>) -> Value {
        self.rv += 1;
        let rv = self.rv;
        let before = self.current(&key).cloned();
        let deleted = object.is_none();
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
    fn commit(&mut self, key: Key, before: Option<&Value>, object: Value) -> Value {
        if let Some(before) = before {
            let mut unversioned = before.clone();
            remove_meta(&mut unversioned, "resourceVersion");
            if unversioned == object {
                return before.clone();
            }
        }
        self.write(key, Some(object))
    }

    /// Drops history at or below `upto`, keeping the latest live version of every object.
    fn compact(&mut self, upto: u64) {
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
    fn changes_after(&self, rv: u64) -> Option<&[Change]> {
        if rv < self.compacted {
            return None;
        }
        let start = self.log.partition_point(|change| change.rv <= rv);
        Some(&self.log[start..])
    }

    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(self.seed ^ self.serial);
        hasher.finish()
    }

    /// A random-looking version 4 UUID.
    fn new_uid(&mut self) -> String {
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
    fn generate_name(&mut self, prefix: &str) -> String {
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

    fn require_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        let key = Key::new(NAMESPACE_KIND, "", namespace);
        match self.current(&key) {
            Some(_) => Ok(()),
            None => Err(ApiError::not_found(&KINDS[NAMESPACE_KIND], namespace)),
        }
    }

    /// Test-side create-or-replace, with no authorisation and no status rules.
    fn apply(&mut self, key: Key, object: Value) -> Result<Value, ApiError> {
        let before = self.current(&key).cloned();
        let object = self.prepare(&KINDS[key.kind], before.as_ref(), object)?;
        Ok(self.commit(key, before.as_ref(), object))
    }

    /// Fills the fields the server owns and normalises kind-specific ones.
    fn prepare(
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
            None => json!(self.new_uid()),
        };
        set_meta(&mut object, "uid", uid);
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
            ("", "Secret") => fold_string_data(&mut object)?,
            ("", "Namespace") => normalise_namespace(&mut object),
            _ => {}
        }
        Ok(object)
    }
}

/// `metadata.generation`: 1 on create, +1 whenever anything but metadata and status changes.
fn generation(before: Option<&Value>, object: &Value) -> u64 {
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

fn spec_part(object: &Value) -> Value {
    let mut spec = object.clone();
    if let Some(map) = spec.as_object_mut() {
        for field in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(field);
        }
    }
    spec
}

/// Secret `stringData` is write-only: the registry folds it into base64 `data`.
fn fold_string_data(secret: &mut Value) -> Result<(), ApiError> {
    let Some(map) = secret.as_object_mut() else {
        return Ok(());
    };
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

/// Namespaces are `Active` and carry the `kubernetes.io/metadata.name` label.
fn normalise_namespace(namespace: &mut Value) {
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

fn now() -> Value {
    let now = k8s_openapi::jiff::Timestamp::now();
    json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn ensure_metadata(object: &mut Value) -> Result<(), ApiError> {
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

fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(field.to_string(), value);
    }
}

fn remove_meta(object: &mut Value, field: &str) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(field);
    }
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
}

// ---------------------------------------------------------------------------------------------
// Authentication and authorisation
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Scope {
    /// Every namespace and cluster-scoped objects.
    Cluster,
    Namespace(String),
    /// The requesting service account's own namespace.
    OwnNamespace,
}

#[derive(Debug)]
struct Rule {
    subject: Subject,
    verb: String,
    group: String,
    resource: String,
    scope: Scope,
}

#[derive(Default)]
struct Auth {
    tokens: HashMap<String, Identity>,
    /// The audiences of tokens bound to some; a token absent here is good for any.
    audiences: HashMap<String, Vec<String>>,
    /// Service account uids by username, assigned on first use.
    uids: HashMap<String, String>,
    rules: Vec<Rule>,
}

/// What is asked, in RBAC terms.
struct Attributes<'a> {
    verb: &'static str,
    kind: &'static Kind,
    subresource: Option<&'a str>,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

impl Attributes<'_> {
    /// `secrets`, or `externalsecrets/status` for a subresource.
    fn resource(&self) -> String {
        match self.subresource {
            Some(sub) => format!("{}/{sub}", self.kind.plural),
            None => self.kind.plural.to_string(),
        }
    }
}

impl Rule {
    fn permits(&self, who: &Identity, request: &Attributes<'_>) -> bool {
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

    fn subject_matches(&self, who: &Identity) -> bool {
        match &self.subject {
            Subject::Is(identity) => identity == who,
            Subject::AnyServiceAccount => !matches!(who, Identity::User(_)),
            Subject::Anyone => true,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Request parsing
// ---------------------------------------------------------------------------------------------

/// What a URL path addresses.
#[derive(Debug)]
struct Target {
    kind: usize,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn kind(&self) -> &'static Kind {
        &KINDS[self.kind]
    }

    fn key(&self) -> Result<Key, ApiError> {
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

    fn attributes(&self, verb: &'static str) -> Attributes<'_> {
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
fn parse_path(path: &str) -> Result<Target, ApiError> {
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
    let sub_ok = subresource.is_none()
        || (subresource.as_deref() == Some("status") && KINDS[kind].status_subresource);
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

/// The query parameters the fake understands; others are ignored.
#[derive(Debug, Default)]
struct Query {
    watch: bool,
    resource_version: Option<String>,
    resource_version_match: Option<String>,
    limit: Option<usize>,
    continue_token: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    timeout_seconds: Option<u64>,
    bookmarks: bool,
    send_initial_events: Option<bool>,
}

impl Query {
    fn parse(raw: &str) -> Result<Self, ApiError> {
        let mut query = Query::default();
        for (key, value) in query_pairs(raw)? {
            query.set(&key, value)?;
        }
        Ok(query)
    }

    fn set(&mut self, key: &str, value: String) -> Result<(), ApiError> {
        match key {
            "watch" => self.watch = parse_bool(key, &value)?,
            "resourceVersion" => self.resource_version = Some(value).filter(|v| !v.is_empty()),
            "resourceVersionMatch" => self.resource_version_match = Some(value),
            "limit" => self.limit = Some(parse_number(key, &value)?),
            "continue" => self.continue_token = Some(value).filter(|v| !v.is_empty()),
            "labelSelector" => self.label_selector = Some(value),
            "fieldSelector" => self.field_selector = Some(value),
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

fn parse_bool(key: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "{key}: invalid boolean value \"{value}\""
        ))),
    }
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ApiError> {
    value
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{key}: invalid value \"{value}\"")))
}

/// Decoded `key=value` pairs; empty segments (kube-rs starts with `&`) are skipped.
fn query_pairs(raw: &str) -> Result<Vec<(String, String)>, ApiError> {
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

fn percent_decode(text: &str) -> Option<String> {
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
fn verb_of(method: &Method, target: &Target, query: &Query) -> Result<&'static str, ApiError> {
    let named = target.name.is_some();
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
    let status_verb = matches!(verb, "get" | "update" | "patch");
    if target.subresource.is_some() && !status_verb {
        return Err(ApiError::method_not_allowed());
    }
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
enum LabelOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

#[derive(Debug, Default)]
struct LabelSelector(Vec<LabelRequirement>);

impl LabelSelector {
    fn parse(text: &str) -> Result<Self, ApiError> {
        split_top_level(text)
            .into_iter()
            .map(str::trim)
            .filter(|term| !term.is_empty())
            .map(parse_requirement)
            .collect::<Result<Vec<_>, _>>()
            .map(LabelSelector)
    }

    fn matches(&self, object: &Value) -> bool {
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
fn split_top_level(text: &str) -> Vec<&str> {
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

fn parse_requirement(term: &str) -> Result<LabelRequirement, ApiError> {
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
struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    fn parse(text: &str, kind: &Kind) -> Result<Self, ApiError> {
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

    fn matches(&self, object: &Value) -> bool {
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
struct Filter {
    kind: usize,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn new(target: &Target, query: &Query) -> Result<Self, ApiError> {
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

    fn in_scope(&self, key: &Key) -> bool {
        key.kind == self.kind
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
    }

    fn matches(&self, key: &Key, object: &Value) -> bool {
        self.in_scope(key) && self.labels.matches(object) && self.fields.matches(object)
    }

    fn selects_everything(&self) -> bool {
        self.labels.0.is_empty() && self.fields.0.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------
// The server: shared state and request handling
// ---------------------------------------------------------------------------------------------

struct Shared {
    store: Mutex<Store>,
    auth: Mutex<Auth>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// The latest resourceVersion, to wake watchers.
    changed: watch::Sender<u64>,
    /// Bumped to end every open watch; [`STOPPED`] once the server is dropped.
    closed: watch::Sender<u64>,
    /// Number of watch streams being served.
    open_watches: AtomicUsize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn new() -> Self {
        Self {
            store: Mutex::new(Store::new()),
            auth: Mutex::new(Auth::default()),
            requests: Mutex::new(Vec::new()),
            changed: watch::Sender::new(0),
            closed: watch::Sender::new(0),
            open_watches: AtomicUsize::new(0),
        }
    }

    fn close_watches(&self) {
        self.closed
            .send_modify(|generation| *generation = generation.saturating_add(1));
    }

    /// Runs a write against the store, then wakes the watchers.
    fn mutate<T>(&self, write: impl FnOnce(&mut Store) -> T) -> T {
        let mut store = lock(&self.store);
        let out = write(&mut store);
        let rv = store.rv;
        self.changed.send_if_modified(|latest| {
            let modified = *latest != rv;
            *latest = rv;
            modified
        });
        out
    }

    fn authenticate(&self, headers: &HeaderMap) -> Option<Identity> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let auth = lock(&self.auth);
        let token = token.trim();
        if let Some(audiences) = auth.audiences.get(token)
            && !audiences.iter().any(|a| a == API_AUDIENCE)
        {
            return None;
        }
        auth.tokens.get(token).cloned()
    }

    /// The uid of a service account identity, assigned on first use; `None` for users.
    fn uid_of(&self, identity: &Identity) -> Option<String> {
        identity.namespace()?;
        let username = identity.username();
        if let Some(uid) = lock(&self.auth).uids.get(&username) {
            return Some(uid.clone());
        }
        let fresh = lock(&self.store).new_uid();
        let mut auth = lock(&self.auth);
        Some(auth.uids.entry(username).or_insert(fresh).clone())
    }

    fn authorize(&self, who: &Identity, request: &Attributes<'_>) -> Result<(), ApiError> {
        let auth = lock(&self.auth);
        if auth.rules.iter().any(|rule| rule.permits(who, request)) {
            Ok(())
        } else {
            Err(ApiError::forbidden(who, request))
        }
    }

    fn record(&self, parts: &Parts, identity: Option<Identity>) {
        lock(&self.requests).push(RecordedRequest {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            identity,
        });
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let identity = shared.authenticate(&parts.headers);
    shared.record(&parts, identity.clone());
    match serve(&shared, identity, &parts, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Authenticates, authorises and dispatches one request.
async fn serve(
    shared: &Arc<Shared>,
    identity: Option<Identity>,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = identity.ok_or_else(ApiError::unauthorized)?;
    if parts.uri.path().trim_end_matches('/') == TOKEN_REVIEWS_PATH {
        return token_review(shared, &identity, parts, body).await;
    }
    let target = parse_path(parts.uri.path())?;
    let query = Query::parse(parts.uri.query().unwrap_or(""))?;
    let verb = verb_of(&parts.method, &target, &query)?;
    shared.authorize(&identity, &target.attributes(verb))?;
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
    let ok = |object: Value| json_response(StatusCode::OK, &object);
    match verb {
        "get" => get(shared, &target).map(ok),
        "list" => list(shared, &target, &query).map(ok),
        "watch" => start_watch(shared, &target, &query),
        "create" => {
            create(shared, &target, &body).map(|object| json_response(StatusCode::CREATED, &object))
        }
        "update" => update(shared, &target, parse_json(&body)?).map(ok),
        "patch" => patch(shared, &target, &parts.headers, &body).map(ok),
        _ => delete(shared, &target).map(ok),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

fn get(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    let key = target.key()?;
    let store = lock(&shared.store);
    store
        .current(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(target.kind(), &key.name))
}

// --- list -------------------------------------------------------------------------------------

fn list(shared: &Shared, target: &Target, query: &Query) -> Result<Value, ApiError> {
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
fn list_item(kind: &Kind, object: &Value) -> Value {
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
fn list_start(store: &Store, query: &Query) -> Result<(u64, Option<String>), ApiError> {
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
fn list_revision(store: &Store, query: &Query) -> Result<u64, ApiError> {
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
fn encode_continue(rv: u64, last: &Key) -> String {
    let start = format!("{}\u{0}", last.path);
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
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

fn create(shared: &Shared, target: &Target, body: &[u8]) -> Result<Value, ApiError> {
    let object = parse_json(body)?;
    shared.mutate(|store| create_in(store, target, object))
}

fn create_in(store: &mut Store, target: &Target, mut object: Value) -> Result<Value, ApiError> {
    let kind = target.kind();
    check_body(kind, target, &mut object)?;
    let name = match meta_str(&object, "name") {
        Some(name) => name.to_string(),
        None => match meta_str(&object, "generateName").map(str::to_string) {
            Some(prefix) => store.generate_name(&prefix),
            None => {
                let problem = "Required value: name or generateName is required";
                return Err(ApiError::invalid(kind, "", "metadata.name", problem));
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
        store.require_namespace(namespace)?;
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
    let object = store.prepare(kind, None, object)?;
    Ok(store.write(key, Some(object)))
}

/// Checks `apiVersion`, `kind` and `metadata.namespace` against the URL and fills them in.
fn check_body(kind: &Kind, target: &Target, object: &mut Value) -> Result<(), ApiError> {
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
fn validate_name(kind: &Kind, name: &str) -> Result<(), ApiError> {
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
    let problem = format!(
        "Invalid value: \"{name}\": {what} must consist of lower case alphanumeric characters, \
         '-' or '.', and must start and end with an alphanumeric character (at most {max} \
         characters)"
    );
    Err(ApiError::invalid(kind, name, "metadata.name", &problem))
}

fn update(shared: &Shared, target: &Target, object: Value) -> Result<Value, ApiError> {
    shared.mutate(|store| {
        let key = target.key()?;
        let before = store
            .current(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target.kind(), &key.name))?;
        replace(store, target, key, before, object)
    })
}

/// PUT semantics against the current version `before`.
fn replace(
    store: &mut Store,
    target: &Target,
    key: Key,
    before: Value,
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
    let object = store.prepare(kind, Some(&before), object)?;
    Ok(store.commit(key, Some(&before), object))
}

/// `object` with its `status` replaced by `status` (removed when `None`).
fn with_status(mut object: Value, status: Option<&Value>) -> Value {
    if let Some(map) = object.as_object_mut() {
        match status {
            Some(status) => map.insert("status".to_string(), status.clone()),
            None => map.remove("status"),
        };
    }
    object
}

fn patch(
    shared: &Shared,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/merge-patch+json") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types \
                 include: application/merge-patch+json (the fake API server supports only JSON \
                 merge patches, not {content_type:?})"
            ),
        ));
    }
    let patch = parse_json(body)?;
    shared.mutate(|store| {
        let key = target.key()?;
        let before = store
            .current(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(target.kind(), &key.name))?;
        let mut object = before.clone();
        merge_patch(&mut object, &patch);
        replace(store, target, key, before, object)
    })
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
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

fn delete(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    let key = target.key()?;
    shared.mutate(|store| {
        if store.current(&key).is_none() {
            return Err(ApiError::not_found(target.kind(), &key.name));
        }
        Ok(store.write(key, None))
    })
}

// --- watch ------------------------------------------------------------------------------------

type Chunk = Result<Bytes, std::io::Error>;

/// A watch request, resolved.
struct WatchSpec {
    filter: Filter,
    /// `None`: start now, with synthetic ADDED events for the current objects.
    after: Option<u64>,
    initial_events: bool,
    initial_end_bookmark: bool,
    bookmarks: bool,
    timeout: Duration,
}

impl WatchSpec {
    fn new(target: &Target, query: &Query) -> Result<Self, ApiError> {
        let after = match query.resource_version.as_deref() {
            None | Some("0") => None,
            Some(text) => Some(parse_number::<u64>("resourceVersion", text)?),
        };
        let send_initial = query.send_initial_events;
        if send_initial == Some(true)
            && (!query.bookmarks || query.resource_version_match.as_deref() != Some("NotOlderThan"))
        {
            return Err(ApiError::bad_request(
                "sendInitialEvents requires allowWatchBookmarks=true and \
                 resourceVersionMatch=NotOlderThan",
            ));
        }
        let timeout = query
            .timeout_seconds
            .filter(|&s| s > 0)
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
        Ok(Self {
            filter: Filter::new(target, query)?,
            after,
            initial_events: after.is_none() && send_initial != Some(false),
            initial_end_bookmark: send_initial == Some(true),
            bookmarks: query.bookmarks,
            timeout,
        })
    }

    fn kind(&self) -> &'static Kind {
        &KINDS[self.filter.kind]
    }
}

fn start_watch(shared: &Arc<Shared>, target: &Target, query: &Query) -> Result<Response, ApiError> {
    let spec = WatchSpec::new(target, query)?;
    // Subscribed before answering, so a `close_watches` after this point ends the watch.
    let mut closed = shared.closed.subscribe();
    if *closed.borrow_and_update() == STOPPED {
        return Err(ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is shutting down",
        ));
    }
    let (tx, rx) = mpsc::channel::<Chunk>(64);
    tokio::spawn(run_watch(OpenWatch::new(shared), spec, closed, tx));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Counts a watch as open for as long as it is served.
struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Streams one watch until its timeout, `close_watches`, server drop or client disconnect.
async fn run_watch(
    watch: OpenWatch,
    spec: WatchSpec,
    mut closed: watch::Receiver<u64>,
    tx: mpsc::Sender<Chunk>,
) {
    let shared = &watch.0;
    let mut changed = shared.changed.subscribe();
    let deadline = tokio::time::sleep(spec.timeout);
    tokio::pin!(deadline);
    let (lines, start) = initial_events(shared, &spec);
    let (true, Some(mut last)) = (send_all(&tx, lines).await, start) else {
        return;
    };
    loop {
        changed.borrow_and_update();
        let (lines, now) = watch_step(shared, &spec, &closed, last);
        if !send_all(&tx, lines).await {
            return;
        }
        let Some(now) = now else { return };
        last = now;
        tokio::select! {
            result = changed.changed() => if result.is_err() { return },
            _ = closed.changed() => return,
            () = &mut deadline => {
                if spec.bookmarks {
                    let _ = tx.send(Ok(bookmark_line(spec.kind(), last, false))).await;
                }
                return;
            }
            () = tx.closed() => return,
        }
    }
}

/// Sends every line; `false` when the client has gone.
async fn send_all(tx: &mpsc::Sender<Chunk>, lines: Vec<Bytes>) -> bool {
    for line in lines {
        if tx.send(Ok(line)).await.is_err() {
            return false;
        }
    }
    true
}

/// The events a watch starts with and the revision it continues after (`None`: it ends).
fn initial_events(shared: &Shared, spec: &WatchSpec) -> (Vec<Bytes>, Option<u64>) {
    let store = lock(&shared.store);
    let rv = match spec.after {
        Some(after) if after < store.compacted => {
            return (vec![too_old_line(after, store.compacted)], None);
        }
        Some(after) => return (Vec::new(), Some(after)),
        None => store.rv,
    };
    let mut lines = Vec::new();
    if spec.initial_events {
        lines = store
            .snapshot(spec.filter.kind, rv)
            .filter(|(key, object)| spec.filter.matches(key, object))
            .map(|(_, object)| event_line("ADDED", object))
            .collect();
    }
    if spec.initial_end_bookmark {
        lines.push(bookmark_line(spec.kind(), rv, true));
    }
    (lines, Some(rv))
}

/// Events after `last` and the revision they bring the watch to (`None`: the watch ends,
/// because history is gone or the watch was closed).
/// A closed watch sends nothing more.
fn watch_step(
    shared: &Shared,
    spec: &WatchSpec,
    closed: &watch::Receiver<u64>,
    last: u64,
) -> (Vec<Bytes>, Option<u64>) {
    let store = lock(&shared.store);
    if closed.has_changed().unwrap_or(true) {
        return (Vec::new(), None);
    }
    let Some(changes) = store.changes_after(last) else {
        return (vec![too_old_line(last, store.compacted)], None);
    };
    let lines = changes
        .iter()
        .filter_map(|change| watch_event(&spec.filter, change))
        .collect();
    (lines, Some(store.rv))
}

/// A change as this watch sees it: an object entering its selector is ADDED, one leaving it
/// is DELETED (with its new state), as the real watch cache does.
fn watch_event(filter: &Filter, change: &Change) -> Option<Bytes> {
    if !filter.in_scope(&change.key) {
        return None;
    }
    let was = change
        .before
        .as_ref()
        .is_some_and(|before| filter.matches(&change.key, before));
    let is = !change.deleted && filter.matches(&change.key, &change.object);
    let kind = match (was, is) {
        (false, true) => "ADDED",
        (true, true) => "MODIFIED",
        (true, false) => "DELETED",
        (false, false) => return None,
    };
    Some(event_line(kind, &change.object))
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn too_old_line(rv: u64, compacted: u64) -> Bytes {
    let error = ApiError::expired(format!("too old resource version: {rv} ({compacted})"));
    event_line("ERROR", &error.status())
}

fn bookmark_line(kind: &Kind, rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object = json!({"kind": kind.kind, "apiVersion": kind.api_version(), "metadata": metadata});
    event_line("BOOKMARK", &object)
}

// ---------------------------------------------------------------------------------------------
// TokenReview
// ---------------------------------------------------------------------------------------------

const TOKEN_REVIEWS_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// `authentication.k8s.io/v1` TokenReviews: create-only, never stored.
static TOKEN_REVIEW_KIND: Kind = Kind {
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
async fn token_review(
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
        return Err(ApiError::invalid(kind, "", "spec.token", "Required value"));
    }
    let requested: Vec<String> = match review.pointer("/spec/audiences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|a| a.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_request("spec.audiences: expected strings"))?,
        Some(_) => return Err(ApiError::bad_request("spec.audiences: expected a list")),
    };
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
fn review_status(shared: &Shared, token: &str, requested: &[String]) -> Value {
    let wanted: Vec<String> = if requested.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        requested.to_vec()
    };
    let (identity, bound) = {
        let auth = lock(&shared.auth);
        (
            auth.tokens.get(token).cloned(),
            auth.audiences.get(token).cloned(),
        )
    };
    let failed = |error: String| json!({"authenticated": false, "user": {}, "error": error});
    let Some(identity) = identity else {
        return failed("[invalid bearer token, token is not valid]".to_string());
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
                    "[invalid bearer token, token audiences {bound:?} is invalid for the target \
                     audiences {wanted:?}]"
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
