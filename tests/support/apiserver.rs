//! An in-process fake Kubernetes API server for the end-to-end tests (no real one can run here).
//!
//! It serves plain HTTP/1.1 on `127.0.0.1:<random port>` and answers what kube-rs sends for the
//! kinds Latchkey uses: `latchkey.dev/v1alpha1` ExternalSecrets, SecretStores (namespaced) and
//! ClusterSecretStores; `generators.latchkey.dev/v1alpha1` GeneratorStates; `v1` Namespaces,
//! Secrets, ServiceAccounts and Events; `events.k8s.io/v1` Events; `coordination.k8s.io/v1`
//! Leases. The code is split by concern under `apiserver/`: kinds, storage, deletion lifecycle,
//! requests, handlers, managed fields, watches, auth.
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
//!   resourceVersion), JSON merge patch, server-side apply and delete, plus the `status`
//!   subresource of the CRDs and Namespaces; a write that changes nothing (no-op) is not
//!   written: same resourceVersion, no watch event;
//! - server-side apply (`application/apply-patch+yaml`, a JSON body; `fieldManager` required,
//!   else 422 as the real server answers; `force`): creates an absent object (201), merges the
//!   configuration into the object, removes the fields its manager applied before and omits now
//!   unless another manager owns them too, and refuses to change a field another manager owns
//!   (409 `Conflict`, `Apply failed with 1 conflict: conflict with "kubectl-edit" using v1:
//!   .data.password`) unless forced, which takes the field over. `metadata.managedFields` is kept
//!   in the wire format (`Apply` and `Update` entries, `FieldsV1`, `subresource: status`); other
//!   writes record an `Update` entry for their manager (`fieldManager`, else the User-Agent up
//!   to its first `/`, empty for kube-rs, which sends none) owning what they changed. Ownership
//!   is per map leaf: lists are atomic, `metadata.ownerReferences` too (the real server merges
//!   it by uid), and Update entries lack the real `"."` markers of the maps they created;
//! - label selectors (`k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`), field
//!   selectors on `metadata.name`/`metadata.namespace` (and a few per-kind fields); an object
//!   that stops matching a watch's selector is sent as DELETED, one that starts matching as ADDED;
//! - metadata-only answers for `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;
//!   v=v1` (get, writes, watch events) and `as=PartialObjectMetadataList` (lists), as
//!   `Api<PartialObjectMeta<K>>` asks: `meta.k8s.io/v1` objects with `metadata` only; the other
//!   combinations, and `as=Table`, are 406;
//! - server-owned fields: uid, creationTimestamp, resourceVersion, generation (CRDs); Secret
//!   `stringData` folded into base64 `data` and `type` defaulted to `Opaque`; Namespaces get
//!   phase `Active` and the `kubernetes.io/metadata.name` label; creating in a missing namespace
//!   is a 404; `ownerReferences` are stored as given;
//! - Secret validation (422 `Invalid`, real messages): `data` keys, total decoded size at most
//!   1 MiB, `type` immutable, and with `immutable: true` neither `data` nor `immutable` may
//!   change;
//! - authentication by bearer token (unknown or missing token: 401; a token bound to audiences
//!   that exclude [`API_AUDIENCE`]: 401) and a small RBAC-like rule table (anything not
//!   allowed: 403 with the real message shape); errors are `Status` JSON;
//! - TokenReview (`POST /apis/authentication.k8s.io/v1/tokenreviews`, verb `create` on
//!   `tokenreviews` in `authentication.k8s.io`): the registered and minted tokens' identities
//!   with username, uid (see [`FakeApiServer::service_account_uid`]), groups and audiences, as
//!   Vault's and OpenBao's kubernetes auth method call it;
//! - TokenRequest (`POST .../serviceaccounts/NAME/token`, verb `create` on
//!   `serviceaccounts/token`): 404 without the ServiceAccount, 422 under 600 seconds, defaults
//!   of 3600 seconds and the API's own audience; the token is an ES256 JWT with the claims of an
//!   unbound service account token (`kubernetes.io.serviceaccount.uid` is the object's uid), so
//!   OpenBao's kubernetes auth accepts it; it authenticates here for its audiences until it
//!   expires (see [`FakeApiServer::advance_token_clock`]) or its ServiceAccount is deleted.
//!   [`FakeApiServer::token_requests`] lists what was minted.
//!
//! Test-side controls: [`FakeApiServer::apply`]/[`FakeApiServer::delete`] (no authorisation,
//! no validation), [`FakeApiServer::compact`], [`FakeApiServer::close_watches`],
//! [`FakeApiServer::fail_next`] (real-shaped 429 with `Retry-After`, 500, 503, 409, 422, ...;
//! note that kube-rs' default client itself retries 429, 503 and 504),
//! [`FakeApiServer::delay_next`] (a request held before it is served) and
//! [`FakeApiServer::collect_garbage`]: garbage collection never runs by itself. Deletes honour
//! DeleteOptions `preconditions` (uid, resourceVersion: 409 `Conflict`); other DeleteOptions
//! (propagationPolicy, gracePeriodSeconds, dryRun) are ignored.
//!
//! Finalizers as the registry handles them: deleting an object with `metadata.finalizers`
//! only sets `deletionTimestamp` (and `deletionGracePeriodSeconds: 0`) and answers 200 with the
//! object; deleting it again changes nothing; the write that removes its last finalizer deletes
//! it (one DELETED event carrying that last state); adding a finalizer to it is a 422
//! (`no new finalizers can be added if the object is being deleted`); clients cannot set or
//! clear the deletion fields. The garbage collector ([`FakeApiServer::collect_garbage`]) marks
//! such dependents the same way. Deleting a Namespace makes it `Terminating` (creating in it:
//! 403 `Forbidden`, cause `NamespaceTerminating`); the namespace controller's work is done at
//! once after every write: its objects are deleted (finalizers holding some), and the
//! Namespace goes once none is left.
//!
//! Discovery of one group version (`GET /apis/GROUP/VERSION`, an `APIResourceList` of its
//! installed kinds) and CRDs that are not installed (the provider kinds until
//! [`FakeApiServer::install`], or after [`FakeApiServer::uninstall`]: their paths
//! and a group with nothing installed are Go's plain-text `404 page not found`), for the
//! provider kinds a cluster installs only when it uses them.
//!
//! What it does not do: TLS, other discovery (`/api`, `/apis`, `/version`), OpenAPI schema or CEL
//! validation of CRD objects and validation of other kinds beyond the above, strategic-merge and
//! JSON patches (415), YAML apply bodies other than JSON, `dryRun`, `fieldValidation`,
//! deletecollection, graceful and foreground deletion, the cap of ten Update entries in
//! managedFields, Table responses, periodic bookmarks, TokenRequests bound to objects
//! (`boundObjectRef`: 400), impersonation, other authentication/authorization reviews, and
//! signature checks (a token is known by its exact text). The history kept for watches grows
//! until `compact()` is called.

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

mod auth;
mod errors;
mod fields;
mod handlers;
mod kinds;
mod lifecycle;
mod request;
mod store;
mod watches;

use auth::*;
use errors::*;
use handlers::*;
use kinds::*;
use lifecycle::*;
use request::*;
use store::*;
use watches::*;

/// Namespace of the node agent's service account (as in `daemonset/base/rbac.yaml`).
pub const AGENT_NAMESPACE: &str = "latchkey";
/// Name of the node agent's service account (as in `daemonset/base/rbac.yaml`).
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

/// One token a TokenRequest minted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequestRecord {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account's name.
    pub service_account: String,
    /// The token's audiences (the API server's own when the request named none).
    pub audiences: Vec<String>,
    /// Its lifetime, as requested or defaulted (3600).
    pub expiration_seconds: i64,
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

    /// A new bearer token for `openbao/openbao`, which may create TokenReviews: what an
    /// OpenBao kubernetes auth mount is configured with to check the tokens it is shown.
    pub fn token_reviewer(&self) -> String {
        let reviewer = format!("reviewer-{}", super::openbao::random_hex(16));
        let openbao = Identity::service_account("openbao", "openbao");
        self.add_identity(&reviewer, openbao.clone());
        self.allow(
            openbao,
            "create",
            "authentication.k8s.io",
            "tokenreviews",
            None,
        );
        reviewer
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

    /// The uid of service account `namespace/name` (random), as a TokenReview reports it, as
    /// its tokens' `kubernetes.io.serviceaccount.uid` claim must carry it and as its
    /// ServiceAccount object gets it; a new one once that object is deleted.
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

    /// Grants `who` every rule of the ClusterRoles and Roles in the deploy file `path` (from the
    /// repository root): cluster-wide for a ClusterRole, in its namespace for a Role, so a test
    /// fails when the deploy files lack a permission the process uses. Returns the grants made.
    pub fn allow_roles_of(&self, who: Identity, path: &str) -> usize {
        use serde::Deserialize as _;
        let file = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut granted = 0;
        for doc in serde_norway::Deserializer::from_str(&text) {
            let doc = serde_json::to_value(serde_norway::Value::deserialize(doc).unwrap()).unwrap();
            if !matches!(doc["kind"].as_str(), Some("ClusterRole" | "Role")) {
                continue;
            }
            let namespace = doc["metadata"]["namespace"].as_str();
            for rule in doc["rules"].as_array().unwrap() {
                let list = |field: &str| -> Vec<String> {
                    rule[field]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_string())
                        .collect()
                };
                for group in list("apiGroups") {
                    for resource in list("resources") {
                        for verb in list("verbs") {
                            self.allow(who.clone(), &verb, &group, &resource, namespace);
                            granted += 1;
                        }
                    }
                }
            }
        }
        granted
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

    /// The DESIGN's permissions, as `daemonset/base/rbac.yaml` grants them: the agent may
    /// get/list/watch Latchkey objects and Namespaces cluster-wide, create/patch core Events,
    /// and get Secrets and ConfigMaps only in its own namespace; every service account may get the Secrets of
    /// its own namespace (the Role a user grants pods for the `kubernetes` provider).
    pub fn allow_defaults(&self) {
        self.allow_agent_defaults();
        self.allow_in_own_namespace(Subject::AnyServiceAccount, "get", "", "secrets");
    }

    /// The agent's part of [`Self::allow_defaults`] only: no service account may read a Secret
    /// unless the test grants it.
    pub fn allow_agent_defaults(&self) {
        self.allow_agent_provider_reads();
        for verb in ["get", "list", "watch"] {
            for resource in ["externalsecrets", "secretstores", "clustersecretstores"] {
                self.allow(Identity::Agent, verb, "latchkey.dev", resource, None);
            }
            self.allow(Identity::Agent, verb, "", "namespaces", None);
        }
        self.allow(Identity::Agent, "create", "", "events", None);
        self.allow(Identity::Agent, "patch", "", "events", None);
        self.allow(Identity::Agent, "get", "", "secrets", Some(AGENT_NAMESPACE));
        self.allow(
            Identity::Agent,
            "get",
            "",
            "configmaps",
            Some(AGENT_NAMESPACE),
        );
    }

    /// The agent's get/list/watch of every provider kind in both groups, as
    /// `daemonset/base/rbac.yaml` grants them.
    pub fn allow_agent_provider_reads(&self) {
        for verb in ["get", "list", "watch"] {
            for group in ["providers.latchkey.dev", "cluster.providers.latchkey.dev"] {
                for resource in [
                    "aws",
                    "vaults",
                    "kubernetes",
                    "fakes",
                    "plugins",
                    "secretsstorecsiproviders",
                ] {
                    self.allow(Identity::Agent, verb, group, resource, None);
                }
            }
        }
    }

    /// Installs the CRD of a provider kind (none is installed at start).
    pub fn install(&self, api_version: &str, kind: &str) {
        let kind = kind_by_type(api_version, kind);
        lock(&self.shared.uninstalled).retain(|k| *k != kind);
    }

    /// Removes the CRD of a kind, as its deletion does: every object of the kind is deleted
    /// first (watchers see each go), then its paths are 404 (the real server's `404 page not
    /// found`, a body that is no Status), discovery leaves it out and its open watches end.
    /// For the provider kinds, which a cluster installs only when it uses them. Not modelled:
    /// the CRD's `Terminating` phase while objects with finalizers wait (provider objects carry
    /// none; here such objects are left marked for deletion and become unreachable).
    pub fn uninstall(&self, api_version: &str, kind: &str) {
        let kind = kind_by_type(api_version, kind);
        assert!(KINDS[kind].crd, "only a CRD can be uninstalled");
        self.shared.mutate(|store| {
            let rv = store.rv;
            let keys: Vec<Key> = store.snapshot(kind, rv).map(|(k, _)| k.clone()).collect();
            for key in keys {
                store.delete_object(key);
            }
        });
        lock(&self.shared.uninstalled).push(kind);
        // Wakes the watches, which end once they have sent the deletions.
        self.shared.changed.send_modify(|_| {});
    }

    /// Creates or replaces an object (test setup: no authorisation, no validation, status,
    /// ownerReferences and managedFields kept as given, so a test can seed another manager's
    /// fields): sets uid/creationTimestamp (kept on replace), bumps the resourceVersion and
    /// notifies watchers, unless nothing changed. Returns the stored object.
    pub fn apply(&self, object: Value) -> Value {
        let (kind, namespace, name) = identify(&object);
        let key = Key::new(kind, &namespace, &name);
        self.shared
            .mutate(|store| store.apply(key, object))
            .unwrap_or_else(|e| panic!("apply {namespace}/{name}: {}", e.message))
    }

    /// Deletes an object as a client's delete does (finalizers and namespace termination
    /// included), notifying watchers; returns its state after the call.
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
        self.shared.mutate(|store| store.delete_object(key))
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

    /// Does now what the garbage collector eventually does (background propagation), with
    /// watch events: deletes every object whose `ownerReferences` all name uids that no
    /// longer exist, drops such references from objects that keep another owner, and repeats
    /// until nothing changes. Returns the deleted objects. Nothing is collected unless called.
    pub fn collect_garbage(&self) -> Vec<Value> {
        self.shared.mutate(Store::collect_garbage)
    }

    /// Makes the next `times` requests whose method is `method` (`"*"`: any) and whose path and
    /// query contain `path_contains` fail with `code`, as the real server words that failure
    /// (429 `TooManyRequests` with `Retry-After: 1`, 500 `InternalError`, 503
    /// `ServiceUnavailable`, 409 `Conflict`, 422 `Invalid`, ...). Requests are still recorded;
    /// failures queued for the same requests are used in the order given.
    pub fn fail_next(&self, method: &str, path_contains: &str, code: u16, times: usize) {
        if times == 0 {
            return;
        }
        lock(&self.shared.faults).push(Fault {
            method: method.to_ascii_uppercase(),
            path_contains: path_contains.to_string(),
            code,
            remaining: times,
        });
    }

    /// Holds the next `times` requests whose method is `method` (`"*"`: any) and whose path and
    /// query contain `path_contains` for `delay` before serving them, as a slow network or a
    /// busy server would: requests held together read the store after the delay, so clients
    /// that checked at the same moment act on the same (possibly stale) answer.
    pub fn delay_next(&self, method: &str, path_contains: &str, delay: Duration, times: usize) {
        if times == 0 {
            return;
        }
        lock(&self.shared.delays).push(Delay {
            method: method.to_ascii_uppercase(),
            path_contains: path_contains.to_string(),
            delay,
            remaining: times,
        });
    }

    /// Every token minted by a TokenRequest so far, in order.
    pub fn token_requests(&self) -> Vec<TokenRequestRecord> {
        lock(&self.shared.auth).token_requests.clone()
    }

    /// Moves the clock minted tokens are issued and expire by forward (API calls and
    /// TokenReviews then see tokens past their expiry as invalid); objects' timestamps keep
    /// real time.
    pub fn advance_token_clock(&self, by: Duration) {
        lock(&self.shared.auth).clock_offset += by;
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
    /// Failures to inject, see [`FakeApiServer::fail_next`].
    faults: Mutex<Vec<Fault>>,
    /// Delays to inject, see [`FakeApiServer::delay_next`].
    delays: Mutex<Vec<Delay>>,
    /// Kinds whose CRD is not installed, see [`FakeApiServer::uninstall`].
    uninstalled: Mutex<Vec<usize>>,
}

/// Delays queued for matching requests.
struct Delay {
    method: String,
    path_contains: String,
    delay: Duration,
    remaining: usize,
}

/// Failures queued for matching requests.
struct Fault {
    method: String,
    path_contains: String,
    code: u16,
    remaining: usize,
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
            auth: Mutex::new(Auth::new()),
            requests: Mutex::new(Vec::new()),
            changed: watch::Sender::new(0),
            closed: watch::Sender::new(0),
            open_watches: AtomicUsize::new(0),
            faults: Mutex::new(Vec::new()),
            delays: Mutex::new(Vec::new()),
            // A cluster installs only the provider kinds it uses: none until a test installs
            // them.
            uninstalled: Mutex::new(
                KINDS
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| k.group.ends_with("providers.latchkey.dev"))
                    .map(|(i, _)| i)
                    .collect(),
            ),
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
        store.finish_namespaces();
        let rv = store.rv;
        self.changed.send_if_modified(|latest| {
            let modified = *latest != rv;
            *latest = rv;
            modified
        });
        out
    }

    fn authorize(&self, who: &Identity, request: &Attributes<'_>) -> Result<(), ApiError> {
        let auth = lock(&self.auth);
        if auth.rules.iter().any(|rule| rule.permits(who, request)) {
            Ok(())
        } else {
            Err(ApiError::forbidden(who, request))
        }
    }

    /// The code of the first queued failure this request matches, used up by one.
    fn take_fault(&self, parts: &Parts) -> Option<u16> {
        let target = match parts.uri.query() {
            Some(query) => format!("{}?{query}", parts.uri.path()),
            None => parts.uri.path().to_string(),
        };
        let mut faults = lock(&self.faults);
        let method = parts.method.as_str();
        let index = faults.iter().position(|f| {
            (f.method == "*" || f.method == method) && target.contains(&f.path_contains)
        })?;
        let fault = &mut faults[index];
        fault.remaining -= 1;
        let code = fault.code;
        if fault.remaining == 0 {
            faults.remove(index);
        }
        Some(code)
    }

    /// How long this request is held, used up by one.
    fn take_delay(&self, parts: &Parts) -> Option<Duration> {
        let target = match parts.uri.query() {
            Some(query) => format!("{}?{query}", parts.uri.path()),
            None => parts.uri.path().to_string(),
        };
        let mut delays = lock(&self.delays);
        let method = parts.method.as_str();
        let index = delays.iter().position(|d| {
            (d.method == "*" || d.method == method) && target.contains(&d.path_contains)
        })?;
        let delay = &mut delays[index];
        delay.remaining -= 1;
        let held = delay.delay;
        if delay.remaining == 0 {
            delays.remove(index);
        }
        Some(held)
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
