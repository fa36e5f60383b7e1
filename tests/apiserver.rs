//! Self-tests of the fake Kubernetes API server (`tests/support/apiserver.rs`), driven by the
//! real kube-rs client the agent uses: typed get/create/replace/patch and their error statuses,
//! authorisation per token, watchers and reflectors (including 410 recovery), resourceVersions,
//! pagination, selectors, events and request recording; server-side apply and managedFields,
//! garbage collection, Secret validation, Leases and ServiceAccounts, TokenRequest,
//! metadata-only responses and injected failures. Every wait is bounded.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Event as CoreEvent, Namespace, ObjectReference, Secret, ServiceAccount,
};
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::core::{PartialObjectMeta, Status};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use latchkey::api::{ClusterSecretStore, ExternalSecret, SecretStore};
use serde_json::{Value, json};
use support::apiserver::{
    AGENT_NAMESPACE, API_AUDIENCE, FakeApiServer, Identity, RecordedRequest, TokenRequestRecord,
};
use tokio_stream::{Stream, StreamExt};

const ADMIN: &str = "admin-token";
const AGENT: &str = "agent-token";
/// JWT-looking, like a projected service-account token (signatures are not checked).
const POD: &str =
    "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6c2hvcDp3ZWIifQ.c2ln";
/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(2);
const ES_PATH: &str = "/apis/latchkey.dev/v1alpha1/externalsecrets";

// --- helpers ----------------------------------------------------------------------------------

/// A server with an admin, the agent and pod `shop/web`, the default rules and three namespaces.
async fn server() -> FakeApiServer {
    let server = FakeApiServer::start().await;
    server.add_identity(ADMIN, Identity::User("admin".into()));
    server.add_identity(AGENT, Identity::Agent);
    server.add_identity(POD, Identity::service_account("shop", "web"));
    server.allow(Identity::User("admin".into()), "*", "*", "*", None);
    server.allow_defaults();
    for name in [AGENT_NAMESPACE, "other", "shop"] {
        server.apply(namespace(name, json!({})));
    }
    server
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "labels": labels}})
}

fn secret(namespace: &str, name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": namespace},
           "stringData": {"value": value}})
}

fn external_secret(namespace: &str, name: &str, refresh: &str) -> Value {
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"secretStoreRef": {"name": "store"}, "refreshInterval": refresh}})
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("typed object")
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The `Status` of a failed call.
fn status<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error status, got {other:?}"),
    }
}

/// A background task aborted when the test ends.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Drives a stream in the background.
fn drain<S: Stream + Send + 'static>(stream: S) -> Task {
    Task(tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        while stream.next().await.is_some() {}
    }))
}

/// Forwards a watcher's events, described as short strings, to a channel.
fn watch_events<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Task, tokio::sync::mpsc::UnboundedReceiver<String>)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = Box::pin(watcher(api, config));
        while let Some(event) = stream.next().await {
            if tx.send(describe(event)).is_err() {
                return;
            }
        }
    });
    (Task(task), rx)
}

fn describe<K: Resource>(event: Result<watcher::Event<K>, watcher::Error>) -> String {
    match event {
        Ok(watcher::Event::Init) => "init".into(),
        Ok(watcher::Event::InitApply(o)) => {
            format!("init-apply {}", o.meta().name.clone().unwrap_or_default())
        }
        Ok(watcher::Event::InitDone) => "init-done".into(),
        Ok(watcher::Event::Apply(o)) => {
            format!("apply {}", o.meta().name.clone().unwrap_or_default())
        }
        Ok(watcher::Event::Delete(o)) => {
            format!("delete {}", o.meta().name.clone().unwrap_or_default())
        }
        Err(watcher::Error::WatchError(status)) => format!("error {}", status.code),
        Err(other) => format!("error {other}"),
    }
}

async fn expect_events(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, expected: &[&str]) {
    for want in expected {
        let got = within(want, rx.recv()).await.expect("watcher running");
        assert_eq!(got, *want);
    }
}

type EventStream<K> = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<K>>> + Send>>;

async fn open_watch<K>(api: &Api<K>, params: &WatchParams, rv: u64) -> EventStream<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    Box::pin(
        api.watch(params, &rv.to_string())
            .await
            .expect("watch starts"),
    )
}

async fn next_event<K>(stream: &mut EventStream<K>) -> Option<WatchEvent<K>> {
    within("a watch event", stream.next())
        .await
        .map(|event| event.expect("watch event decodes"))
}

fn names<K: Resource>(objects: &[K]) -> Vec<String> {
    objects
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

fn rv_of<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .expect("numeric resourceVersion")
}

fn lists_of(requests: &[RecordedRequest], path: &str) -> usize {
    requests.iter().filter(|r| r.is_list_of(path)).count()
}

fn watches_of(requests: &[RecordedRequest], path: &str) -> usize {
    requests
        .iter()
        .filter(|r| r.path == path && r.is_watch())
        .count()
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// `metadata.managedFields` as (manager, operation, fieldsV1), in the server's order.
fn owners<K: Resource>(object: &K) -> Vec<(String, String, Value)> {
    let entries = object.meta().managed_fields.clone().unwrap_or_default();
    entries
        .into_iter()
        .map(|e| {
            let fields = e.fields_v1.map(|f| f.0).unwrap_or(Value::Null);
            (
                e.manager.unwrap_or_default(),
                e.operation.unwrap_or_default(),
                fields,
            )
        })
        .collect()
}

fn owner(manager: &str, operation: &str, fields: Value) -> (String, String, Value) {
    (manager.to_string(), operation.to_string(), fields)
}

fn field_manager(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.to_string()),
        ..PatchParams::default()
    }
}

/// The claims of a JWT (its signature unchecked).
fn jwt_claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url claims");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

/// A plain HTTP/1.0 GET with a bearer token, beneath kube-rs' retries: (status, head, body).
async fn raw_get(server: &FakeApiServer, path: &str, token: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    within("a raw answer", stream.read_to_string(&mut out))
        .await
        .unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}

// --- typed API and error statuses -------------------------------------------------------------

#[tokio::test]
async fn secrets_get_create_and_error_statuses_match_the_real_server() {
    let server = server().await;
    let admin: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let new: Secret = typed(secret("shop", "db", "hunter2"));

    let created = admin.create(&PostParams::default(), &new).await.unwrap();
    assert!(rv_of(&created) > 0);
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    let data = created.data.clone().unwrap_or_default();
    assert_eq!(
        data["value"].0, b"hunter2",
        "stringData is folded into data"
    );
    assert!(created.string_data.is_none());
    assert_eq!(admin.get("db").await.unwrap(), created);

    let exists = status(admin.create(&PostParams::default(), &new).await);
    assert_eq!(
        (exists.code, exists.reason.as_str()),
        (409, "AlreadyExists")
    );
    assert_eq!(exists.message, r#"secrets "db" already exists"#);

    let missing = status(admin.get("missing").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, r#"secrets "missing" not found"#);
    assert_eq!(missing.details.unwrap().name, "missing");

    let ghost: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "ghost");
    let mismatch = status(ghost.create(&PostParams::default(), &new).await);
    assert_eq!(
        (mismatch.code, mismatch.reason.as_str()),
        (400, "BadRequest")
    );
    let mut elsewhere = new.clone();
    elsewhere.metadata.namespace = None;
    let no_namespace = status(ghost.create(&PostParams::default(), &elsewhere).await);
    assert_eq!(no_namespace.code, 404);
    assert_eq!(no_namespace.message, r#"namespaces "ghost" not found"#);

    let mut bad = new.clone();
    bad.metadata.name = Some("Not_A_Name".into());
    let invalid = status(admin.create(&PostParams::default(), &bad).await);
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn a_pod_token_reads_only_its_own_namespace_and_unknown_tokens_are_rejected() {
    let server = server().await;
    server.apply(secret("shop", "db", "mine"));
    server.apply(secret("other", "db", "theirs"));
    let pod = server.client(POD).await;

    let own: Api<Secret> = Api::namespaced(pod.clone(), "shop");
    assert_eq!(
        own.get("db").await.unwrap().data.unwrap()["value"].0,
        b"mine"
    );

    let foreign: Api<Secret> = Api::namespaced(pod.clone(), "other");
    let denied = status(foreign.get("db").await);
    assert_eq!((denied.code, denied.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        denied.message,
        r#"secrets "db" is forbidden: User "system:serviceaccount:shop:web" cannot get resource "secrets" in API group "" in the namespace "other""#
    );
    let listing = status(own.list(&ListParams::default()).await);
    assert_eq!(
        listing.message,
        r#"secrets is forbidden: User "system:serviceaccount:shop:web" cannot list resource "secrets" in API group "" in the namespace "shop""#
    );

    let stranger: Api<Secret> = Api::namespaced(server.client("not-a-token").await, "shop");
    let unauthorized = status(stranger.get("db").await);
    assert_eq!(
        (unauthorized.code, unauthorized.reason.as_str()),
        (401, "Unauthorized")
    );
}

#[tokio::test]
async fn external_secrets_follow_crd_rules_and_the_agent_permissions() {
    let server = server().await;
    let admin: Api<ExternalSecret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let mut new = external_secret("shop", "db", "1h");
    new["status"] = json!({"refreshTime": "2024-01-01T00:00:00Z"});

    let created = admin
        .create(&PostParams::default(), &typed(new))
        .await
        .unwrap();
    assert!(
        created.status.is_none(),
        "status is a subresource: create drops it"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let agent = server.client(AGENT).await;
    let agent_shop: Api<ExternalSecret> = Api::namespaced(agent.clone(), "shop");
    let read = agent_shop.get("db").await.unwrap();
    assert_eq!(read.metadata, created.metadata);
    assert_eq!(read.spec, created.spec);
    let everywhere: Api<ExternalSecret> = Api::all(agent.clone());
    assert_eq!(
        names(&everywhere.list(&ListParams::default()).await.unwrap().items),
        ["db"]
    );

    let missing = status(agent_shop.get("nope").await);
    assert_eq!(
        missing.message,
        r#"externalsecrets.latchkey.dev "nope" not found"#
    );
    let denied = status(agent_shop.create(&PostParams::default(), &created).await);
    assert_eq!(
        denied.message,
        r#"externalsecrets.latchkey.dev is forbidden: User "system:serviceaccount:latchkey:latchkey-node" cannot create resource "externalsecrets" in API group "latchkey.dev" in the namespace "shop""#
    );

    // Secrets: only in the agent's own namespace (there, a missing one is a plain 404).
    let denied = status(
        Api::<Secret>::namespaced(agent.clone(), "shop")
            .get("x")
            .await,
    );
    assert_eq!(denied.code, 403);
    let own = status(
        Api::<Secret>::namespaced(agent.clone(), AGENT_NAMESPACE)
            .get("x")
            .await,
    );
    assert_eq!(own.code, 404);

    // Stores of both scopes are readable by the agent.
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "store", "namespace": "shop"}, "spec": {"provider": {"fake": {}}}}),
    );
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
        "metadata": {"name": "global"}, "spec": {"provider": {"fake": {}}}}),
    );
    let store = Api::<SecretStore>::namespaced(agent.clone(), "shop")
        .get("store")
        .await;
    assert_eq!(store.unwrap().name_any(), "store");
    let global = Api::<ClusterSecretStore>::all(agent)
        .get("global")
        .await
        .unwrap();
    assert_eq!(global.namespace(), None);
}

#[tokio::test]
async fn replace_conflicts_on_a_stale_version_and_patches_respect_the_status_subresource() {
    let server = server().await;
    let admin: Api<ExternalSecret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let first = admin
        .create(
            &PostParams::default(),
            &typed(external_secret("shop", "db", "1h")),
        )
        .await
        .unwrap();

    let spec = Patch::Merge(json!({"spec": {"refreshInterval": "5m"}}));
    let patched = admin
        .patch("db", &PatchParams::default(), &spec)
        .await
        .unwrap();
    assert_eq!(patched.spec.refresh_interval.as_deref(), Some("5m"));
    assert_eq!(patched.metadata.generation, Some(2));

    let stale = status(admin.replace("db", &PostParams::default(), &first).await);
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(
        stale.message.contains("the object has been modified"),
        "{}",
        stale.message
    );

    let new_status = Patch::Merge(json!({"status": {"refreshTime": "2024-01-01T00:00:00Z"}}));
    let with_status = admin
        .patch_status("db", &PatchParams::default(), &new_status)
        .await;
    let with_status = with_status.unwrap();
    assert_eq!(
        with_status.metadata.generation,
        Some(2),
        "status does not bump generation"
    );
    assert!(rv_of(&with_status) > rv_of(&patched));
    assert_eq!(
        with_status.status.as_ref().unwrap().refresh_time.as_deref(),
        Some("2024-01-01T00:00:00Z")
    );

    let status_on_main = Patch::Merge(json!({"status": {"refreshTime": "never"}}));
    let ignored = admin
        .patch("db", &PatchParams::default(), &status_on_main)
        .await
        .unwrap();
    assert_eq!(
        rv_of(&ignored),
        rv_of(&with_status),
        "ignored status change is a no-op"
    );

    let strategic = Patch::Strategic(json!({}));
    let unsupported = status(admin.patch("db", &PatchParams::default(), &strategic).await);
    assert_eq!(unsupported.code, 415);

    admin.delete("db", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(admin.get("db").await).code, 404);
}

// --- resourceVersions, pagination and selectors -----------------------------------------------

#[tokio::test]
async fn resource_versions_are_one_increasing_counter_and_no_op_writes_keep_them() {
    let server = server().await;
    let a = server.apply(secret("shop", "a", "1"));
    let b = server.apply(external_secret("shop", "b", "1h"));
    let c = server.apply(namespace("c", json!({})));
    let rv = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&a) < rv(&b) && rv(&b) < rv(&c));
    assert_eq!(rv(&c), server.resource_version());

    let again = server.apply(secret("shop", "a", "1"));
    assert_eq!(again, a, "re-applying an unchanged object changes nothing");
    let changed = server.apply(secret("shop", "a", "2"));
    assert!(rv(&changed) > rv(&c));
    assert_eq!(changed["metadata"]["uid"], a["metadata"]["uid"]);

    let admin: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let list = admin.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        list.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let unchanged = admin.get("a").await.unwrap();
    let replaced = admin
        .replace("a", &PostParams::default(), &unchanged)
        .await
        .unwrap();
    assert_eq!(rv_of(&replaced), rv_of(&unchanged));

    let deleted = server
        .delete("v1", "Secret", Some("shop"), "a")
        .expect("existed");
    assert!(rv(&deleted) > rv(&changed));
    assert!(server.delete("v1", "Secret", Some("shop"), "a").is_none());
}

#[tokio::test]
async fn paginated_lists_are_consistent_snapshots_until_compacted() {
    let server = server().await;
    for name in ["a", "b", "c"] {
        server.apply(external_secret("shop", name, "1h"));
    }
    let api: Api<ExternalSecret> = Api::all(server.client(AGENT).await);

    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first.items), ["a", "b"]);
    assert_eq!(first.metadata.remaining_item_count, Some(1));
    let token = first.metadata.continue_.clone().expect("continue token");

    server.apply(external_secret("other", "d", "1h"));
    server.delete("latchkey.dev/v1alpha1", "ExternalSecret", Some("shop"), "c");
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        names(&rest.items),
        ["c"],
        "the list continues at the first page's revision"
    );
    assert_eq!(
        rest.metadata.resource_version,
        first.metadata.resource_version
    );
    assert_eq!(rest.metadata.continue_, None);

    let fresh = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        names(&fresh.items),
        ["d", "a", "b"],
        "ordered by namespace, then name"
    );

    server.compact();
    let expired = status(
        api.list(&ListParams::default().limit(2).continue_token(&token))
            .await,
    );
    assert_eq!((expired.code, expired.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn label_selectors_filter_namespace_lists_and_watches() {
    let server = server().await;
    server.apply(namespace("team-a", json!({"team": "a"})));
    server.apply(namespace("team-b", json!({"team": "b"})));
    let api: Api<Namespace> = Api::all(server.client(AGENT).await);
    let select = |selector: &'static str| {
        let api = api.clone();
        async move {
            names(
                &api.list(&ListParams::default().labels(selector))
                    .await
                    .unwrap()
                    .items,
            )
        }
    };

    assert_eq!(select("team=a").await, ["team-a"]);
    assert_eq!(select("team in (a, b)").await, ["team-a", "team-b"]);
    assert_eq!(
        select("team notin (a)").await,
        ["latchkey", "other", "shop", "team-b"]
    );
    assert_eq!(select("!team").await, ["latchkey", "other", "shop"]);
    assert_eq!(select("kubernetes.io/metadata.name=shop").await, ["shop"]);
    let bad = status(api.list(&ListParams::default().labels("team in (a")).await);
    assert_eq!(bad.code, 400);
    let by_name = ListParams::default().fields("metadata.name=shop");
    assert_eq!(names(&api.list(&by_name).await.unwrap().items), ["shop"]);
    let unsupported = status(api.list(&ListParams::default().fields("spec.x=y")).await);
    assert_eq!(unsupported.message, "field label not supported: spec.x");

    let params = WatchParams::default().labels("team=a");
    let mut stream = open_watch(&api, &params, server.resource_version()).await;
    server.apply(namespace("team-b", json!({"team": "a"})));
    let Some(WatchEvent::Added(ns)) = next_event(&mut stream).await else {
        panic!("an object entering the selector is ADDED");
    };
    assert_eq!(ns.name_any(), "team-b");
    server.apply(namespace("team-b", json!({"team": "c"})));
    let Some(WatchEvent::Deleted(ns)) = next_event(&mut stream).await else {
        panic!("an object leaving the selector is DELETED");
    };
    assert_eq!(ns.labels()["team"], "c", "with its new state");
}

// --- watches ----------------------------------------------------------------------------------

#[tokio::test]
async fn a_reflector_sees_objects_before_and_after_it_starts_and_their_changes() {
    let server = server().await;
    server.apply(external_secret("shop", "before", "1h"));
    let api: Api<ExternalSecret> = Api::all(server.client(AGENT).await);
    let (reader, writer) = reflector::store();
    let _task = drain(reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()),
    ));
    within("the initial list", reader.wait_until_ready())
        .await
        .unwrap();
    assert_eq!(
        names(
            &reader
                .state()
                .iter()
                .map(|o| (**o).clone())
                .collect::<Vec<_>>()
        ),
        ["before"]
    );

    server.apply(external_secret("other", "after", "1h"));
    eventually("the new object", || reader.state().len() == 2).await;
    server.apply(external_secret("shop", "before", "5m"));
    let before = ObjectRef::new("before").within("shop");
    eventually("the modification", || {
        reader
            .get(&before)
            .and_then(|o| o.spec.refresh_interval.clone())
            == Some("5m".into())
    })
    .await;
    server.delete(
        "latchkey.dev/v1alpha1",
        "ExternalSecret",
        Some("shop"),
        "before",
    );
    eventually("the deletion", || reader.get(&before).is_none()).await;

    // What kube-rs sent: one paginated list, then a watch from the list's resourceVersion.
    let requests = server.requests();
    let list = requests
        .iter()
        .find(|r| r.is_list_of(ES_PATH))
        .expect("a list");
    assert_eq!(list.param("limit").as_deref(), Some("500"));
    assert_eq!(list.identity, Some(Identity::Agent));
    let watch = requests
        .iter()
        .find(|r| r.path == ES_PATH && r.is_watch())
        .expect("a watch");
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert_eq!(watch.param("timeoutSeconds").as_deref(), Some("290"));
    assert!(watch.param("resourceVersion").is_some());
}

#[tokio::test]
async fn a_watcher_resumes_after_a_closed_watch_and_relists_after_compaction() {
    let server = server().await;
    let api: Api<Namespace> = Api::all(server.client(AGENT).await);
    let (_task, mut events) = watch_events(api, watcher::Config::default());
    let listed = [
        "init",
        "init-apply latchkey",
        "init-apply other",
        "init-apply shop",
    ];
    expect_events(&mut events, &listed).await;
    expect_events(&mut events, &["init-done"]).await;

    eventually("the watch", || server.open_watches() == 1).await;
    server.close_watches();
    server.apply(namespace("late", json!({})));
    expect_events(&mut events, &["apply late"]).await;
    let requests = server.requests();
    assert_eq!(
        watches_of(&requests, "/api/v1/namespaces"),
        2,
        "watched again"
    );
    assert_eq!(
        lists_of(&requests, "/api/v1/namespaces"),
        1,
        "resumed, not relisted"
    );

    server.compact();
    expect_events(&mut events, &["error 410", "init", "init-apply latchkey"]).await;
    expect_events(
        &mut events,
        &["init-apply late", "init-apply other", "init-apply shop"],
    )
    .await;
    expect_events(&mut events, &["init-done"]).await;
    let requests = server.requests();
    assert_eq!(lists_of(&requests, "/api/v1/namespaces"), 2);
    assert!(
        watches_of(&requests, "/api/v1/namespaces") >= 3,
        "the 410 came on a new watch"
    );

    server.apply(namespace("later", json!({})));
    expect_events(&mut events, &["apply later"]).await;
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_initial_events_and_the_end_bookmark() {
    let server = server().await;
    let api: Api<Namespace> = Api::all(server.client(AGENT).await);
    let config = watcher::Config::default().streaming_lists();
    let (_task, mut events) = watch_events(api, config);
    let initial = [
        "init",
        "init-apply latchkey",
        "init-apply other",
        "init-apply shop",
        "init-done",
    ];
    expect_events(&mut events, &initial).await;
    server.apply(namespace("late", json!({})));
    expect_events(&mut events, &["apply late"]).await;

    let requests = server.requests();
    assert_eq!(
        lists_of(&requests, "/api/v1/namespaces"),
        0,
        "no list at all"
    );
    let watch = requests.iter().find(|r| r.is_watch()).expect("a watch");
    assert_eq!(watch.param("sendInitialEvents").as_deref(), Some("true"));
    assert_eq!(watch.param("resourceVersion").as_deref(), Some("0"));
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_gets_410_and_a_timed_out_watch_ends_with_a_bookmark() {
    let server = server().await;
    let api: Api<Namespace> = Api::all(server.client(AGENT).await);
    let old = server.resource_version();
    server.compact();

    let mut stream = open_watch(&api, &WatchParams::default(), old).await;
    let Some(WatchEvent::Error(gone)) = next_event(&mut stream).await else {
        panic!("a too-old resourceVersion is an ERROR event");
    };
    assert_eq!((gone.code, gone.reason.as_str()), (410, "Expired"));
    assert!(
        gone.message.starts_with("too old resource version"),
        "{}",
        gone.message
    );
    assert!(
        next_event(&mut stream).await.is_none(),
        "and the stream ends"
    );

    let now = server.resource_version();
    let mut stream = open_watch(&api, &WatchParams::default().timeout(1), now).await;
    server.apply(namespace("x", json!({})));
    let Some(WatchEvent::Added(added)) = next_event(&mut stream).await else {
        panic!("ADDED expected");
    };
    let Some(WatchEvent::Bookmark(mark)) = next_event(&mut stream).await else {
        panic!("a BOOKMARK before the timeout ends the watch");
    };
    assert_eq!(
        mark.metadata.resource_version,
        added.resource_version().unwrap()
    );
    assert!(next_event(&mut stream).await.is_none());
}

// --- events and request recording -------------------------------------------------------------

#[tokio::test]
async fn events_are_created_and_listed_and_the_recorder_needs_events_k8s_io() {
    let server = server().await;
    let agent = server.client(AGENT).await;
    let event = CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some("web-0.".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("shop".into()),
            name: Some("web-0".into()),
            ..ObjectReference::default()
        },
        reason: Some("RefreshFailed".into()),
        type_: Some("Warning".into()),
        ..CoreEvent::default()
    };
    let events: Api<CoreEvent> = Api::namespaced(agent.clone(), "shop");
    let created = events.create(&PostParams::default(), &event).await.unwrap();
    assert!(created.name_any().starts_with("web-0."));
    assert_eq!(server.events().len(), 1);
    assert_eq!(server.events()[0]["reason"], "RefreshFailed");
    let read = status(events.list(&ListParams::default()).await);
    assert_eq!(read.code, 403, "the agent may create events, not read them");

    // kube-rs' Recorder writes events.k8s.io/v1 (POST, then merge PATCH for a series).
    let pod = ObjectReference {
        kind: Some("Pod".into()),
        namespace: Some("shop".into()),
        name: Some("web-0".into()),
        ..ObjectReference::default()
    };
    let note = Event {
        type_: EventType::Normal,
        reason: "Mounted".into(),
        note: None,
        action: "Publish".into(),
        secondary: None,
    };
    let reporter = Reporter {
        controller: "latchkey".into(),
        instance: None,
    };
    let denied = Recorder::new(agent, reporter.clone())
        .publish(&note, &pod)
        .await;
    assert_eq!(
        status(denied).code,
        403,
        "rbac.yaml grants core events only"
    );
    let recorder = Recorder::new(server.client(ADMIN).await, reporter);
    recorder.publish(&note, &pod).await.unwrap();
    recorder.publish(&note, &pod).await.unwrap();
    let modern = server.objects("events.k8s.io/v1", "Event");
    assert_eq!(modern.len(), 1);
    assert_eq!(modern[0]["series"]["count"], 2);
}

#[tokio::test]
async fn requests_are_recorded_with_the_identity_that_made_them() {
    let server = server().await;
    server.apply(secret("shop", "db", "x"));
    let _ = Api::<Secret>::namespaced(server.client(POD).await, "shop")
        .get("db")
        .await;
    let _ = Api::<Namespace>::all(server.client(AGENT).await)
        .get("shop")
        .await;
    let _ = Api::<Namespace>::all(server.client("bogus").await)
        .get("shop")
        .await;

    let seen: Vec<(String, Option<Identity>)> = server
        .requests()
        .into_iter()
        .map(|r| (format!("{} {}", r.method, r.path), r.identity))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "GET /api/v1/namespaces/shop/secrets/db".to_string(),
                Some(Identity::service_account("shop", "web"))
            ),
            (
                "GET /api/v1/namespaces/shop".to_string(),
                Some(Identity::Agent)
            ),
            ("GET /api/v1/namespaces/shop".to_string(), None),
        ]
    );
    server.clear_requests();
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn the_written_kubeconfig_is_usable_by_kube_rs() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.kubeconfig(&path, AGENT);
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), format!("{}/", server.url()));
    let client = kube::Client::try_from(config).unwrap();
    let shop = Api::<Namespace>::all(client).get("shop").await.unwrap();
    assert_eq!(shop.status.unwrap().phase.as_deref(), Some("Active"));
}

// --- server-side apply and managedFields ------------------------------------------------------

#[tokio::test]
async fn server_side_apply_creates_owns_prunes_and_writes_nothing_when_nothing_changes() {
    let server = server().await;
    let client = server.client(ADMIN).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "shop");
    let latchkey = PatchParams::apply("latchkey");
    let config = |data: Value, labels: Option<Value>| {
        let mut config = json!({"apiVersion": "v1", "kind": "Secret",
                                "metadata": {"name": "db"}, "data": data});
        if let Some(labels) = labels {
            config["metadata"]["labels"] = labels;
        }
        Patch::Apply(config)
    };
    let first = config(
        json!({"password": b64("p1"), "user": b64("u")}),
        Some(json!({"x": "1"})),
    );

    let created = secrets.patch("db", &latchkey, &first).await.unwrap();
    let applied = json!({"f:data": {"f:password": {}, "f:user": {}},
                         "f:metadata": {"f:labels": {"f:x": {}}}});
    assert_eq!(owners(&created), [owner("latchkey", "Apply", applied)]);
    let entry = &created.metadata.managed_fields.as_ref().unwrap()[0];
    assert_eq!(entry.api_version.as_deref(), Some("v1"));
    assert_eq!(entry.fields_type.as_deref(), Some("FieldsV1"));
    assert!(entry.time.is_some());
    assert_eq!(created.type_.as_deref(), Some("Opaque"), "defaulted");

    let rv = server.resource_version();
    let again = secrets.patch("db", &latchkey, &first).await.unwrap();
    assert_eq!(again, created, "a no-op apply answers the stored object");
    assert_eq!(server.resource_version(), rv, "and writes nothing");

    // Another manager applies the same label; then latchkey stops applying it and `user`.
    let label = Patch::Apply(json!({"apiVersion": "v1", "kind": "Secret",
                                    "metadata": {"name": "db", "labels": {"x": "1"}}}));
    let labelled = secrets
        .patch("db", &PatchParams::apply("labeller"), &label)
        .await
        .unwrap();
    assert!(rv_of(&labelled) > rv, "a new owner is a change");
    let trimmed = secrets
        .patch(
            "db",
            &latchkey,
            &config(json!({"password": b64("p2")}), None),
        )
        .await
        .unwrap();
    let data = trimmed.data.clone().unwrap();
    assert_eq!(data["password"].0, b"p2");
    assert!(
        !data.contains_key("user"),
        "only latchkey owned it: removed"
    );
    assert_eq!(trimmed.labels()["x"], "1", "the labeller owns it too: kept");
    assert_eq!(
        owners(&trimmed),
        [
            owner(
                "labeller",
                "Apply",
                json!({"f:metadata": {"f:labels": {"f:x": {}}}})
            ),
            owner("latchkey", "Apply", json!({"f:data": {"f:password": {}}})),
        ]
    );

    // Created is 201, updated 200, as kube-rs cannot show.
    let raw = |name: &str| {
        let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}});
        http::Request::patch(format!(
            "/api/v1/namespaces/shop/secrets/{name}?fieldManager=raw"
        ))
        .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .unwrap()
    };
    assert_eq!(client.send(raw("fresh")).await.unwrap().status(), 201);
    assert_eq!(client.send(raw("fresh")).await.unwrap().status(), 200);

    let no_manager = status(secrets.patch("db", &PatchParams::default(), &first).await);
    assert_eq!(
        (no_manager.code, no_manager.reason.as_str()),
        (422, "Invalid")
    );
    assert_eq!(
        no_manager.message,
        r#"PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch"#
    );
    let typeless = Patch::Apply(json!({"metadata": {"name": "db"}}));
    let bad = status(secrets.patch("db", &latchkey, &typeless).await);
    assert_eq!(bad.code, 400);
    assert!(
        bad.message.starts_with("Object 'Kind' is missing"),
        "{}",
        bad.message
    );
}

#[tokio::test]
async fn applies_conflict_with_other_managers_fields_unless_forced_and_updates_own_what_they_change()
 {
    let server = server().await;
    let secrets: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let post = PostParams {
        field_manager: Some("kubectl-create".into()),
        ..PostParams::default()
    };
    let created = secrets
        .create(&post, &typed(secret("shop", "db", "v1")))
        .await
        .unwrap();
    assert_eq!(
        owners(&created),
        [owner(
            "kubectl-create",
            "Update",
            json!({"f:data": {"f:value": {}}, "f:type": {}})
        )]
    );
    let edit = Patch::Merge(json!({"data": {"value": b64("v2")}}));
    let edited = secrets
        .patch("db", &field_manager("kubectl-edit"), &edit)
        .await
        .unwrap();
    assert_eq!(
        owners(&edited),
        [
            owner("kubectl-create", "Update", json!({"f:type": {}})),
            owner("kubectl-edit", "Update", json!({"f:data": {"f:value": {}}})),
        ],
        "an update takes the fields it changes"
    );

    let apply = |value: &str| {
        Patch::Apply(json!({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": "db"}, "data": {"value": b64(value)}}))
    };
    let latchkey = PatchParams::apply("latchkey");
    let conflict = status(secrets.patch("db", &latchkey, &apply("mine")).await);
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        conflict.message,
        r#"Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.value"#
    );
    let cause = &conflict.details.unwrap().causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldManagerConflict", ".data.value")
    );
    assert_eq!(cause.message, r#"conflict with "kubectl-edit" using v1"#);

    let shared = secrets.patch("db", &latchkey, &apply("v2")).await.unwrap();
    assert_eq!(
        owners(&shared).len(),
        3,
        "the same value: owned by both, no conflict"
    );
    let forced = secrets
        .patch("db", &latchkey.clone().force(), &apply("mine"))
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["value"].0, b"mine");
    assert_eq!(
        owners(&forced),
        [
            owner("latchkey", "Apply", json!({"f:data": {"f:value": {}}})),
            owner("kubectl-create", "Update", json!({"f:type": {}})),
        ],
        "forced: the field changes hands and an emptied manager is dropped"
    );

    // Without fieldManager the manager is the User-Agent's product; kube-rs sends none.
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml(ADMIN)).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    let agent = "kubectl/v1.30.2 (linux/amd64) kubernetes/3968350";
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(agent),
    ));
    let kubectl: Api<Secret> = Api::namespaced(kube::Client::try_from(config).unwrap(), "shop");
    let label = Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}));
    let labelled = kubectl
        .patch("db", &PatchParams::default(), &label)
        .await
        .unwrap();
    assert!(owners(&labelled).contains(&owner(
        "kubectl",
        "Update",
        json!({"f:metadata": {"f:labels": {"f:team": {}}}})
    )));
    let anonymous = secrets
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "1"}}})),
        )
        .await
        .unwrap();
    assert!(owners(&anonymous).contains(&owner(
        "",
        "Update",
        json!({"f:metadata": {"f:labels": {"f:b": {}}}})
    )));
}

#[tokio::test]
async fn status_applies_own_only_status_fields() {
    let server = server().await;
    let admin: Api<ExternalSecret> = Api::namespaced(server.client(ADMIN).await, "shop");
    admin
        .create(
            &PostParams::default(),
            &typed(external_secret("shop", "db", "1h")),
        )
        .await
        .unwrap();
    let config = json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
                        "metadata": {"name": "db"},
                        "spec": {"refreshInterval": "1m"},
                        "status": {"refreshTime": "2024-01-01T00:00:00Z"}});
    let latchkey = PatchParams::apply("latchkey");

    let applied = admin
        .patch_status("db", &latchkey, &Patch::Apply(&config))
        .await
        .unwrap();
    assert_eq!(
        applied.status.unwrap().refresh_time.as_deref(),
        Some("2024-01-01T00:00:00Z")
    );
    assert_eq!(
        applied.spec.refresh_interval.as_deref(),
        Some("1h"),
        "spec untouched"
    );
    assert_eq!(applied.metadata.generation, Some(1));
    let entry = applied
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some("latchkey"))
        .expect("latchkey's entry");
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    assert_eq!(
        entry.fields_v1.unwrap().0,
        json!({"f:status": {"f:refreshTime": {}}})
    );

    let rv = server.resource_version();
    admin
        .patch_status("db", &latchkey, &Patch::Apply(&config))
        .await
        .unwrap();
    assert_eq!(
        server.resource_version(),
        rv,
        "a no-op status apply writes nothing"
    );

    // The main resource: `status` is ignored, `spec.refreshInterval` is the creator's.
    let conflict = status(admin.patch("db", &latchkey, &Patch::Apply(&config)).await);
    assert_eq!(
        conflict.message,
        r#"Apply failed with 1 conflict: conflict with "" using latchkey.dev/v1alpha1: .spec.refreshInterval"#
    );
    let main = admin
        .patch("db", &latchkey.clone().force(), &Patch::Apply(&config))
        .await
        .unwrap();
    assert_eq!(main.spec.refresh_interval.as_deref(), Some("1m"));
    assert_eq!(main.metadata.generation, Some(2));
    let mut absent = config.clone();
    absent["metadata"]["name"] = json!("nope");
    let missing = status(
        admin
            .patch_status("nope", &latchkey, &Patch::Apply(&absent))
            .await,
    );
    assert_eq!(missing.code, 404);
}

// --- ownerReferences and garbage collection ---------------------------------------------------

#[tokio::test]
async fn garbage_is_collected_only_when_asked_and_never_while_an_owner_lives() {
    let server = server().await;
    let first = server.apply(external_secret("shop", "first", "1h"));
    let second = server.apply(external_secret("shop", "second", "1h"));
    let reference = |owner: &Value| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
               "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
               "controller": true})
    };
    let owned = |name: &str, owners: Value| {
        let mut secret = secret("shop", name, "x");
        secret["metadata"]["ownerReferences"] = owners;
        secret
    };
    server.apply(owned("solo", json!([reference(&first)])));
    server.apply(owned(
        "shared",
        json!([reference(&first), reference(&second)]),
    ));
    let secrets: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let made = secrets
        .create(
            &PostParams::default(),
            &typed(owned("api-made", json!([reference(&first)]))),
        )
        .await
        .unwrap();
    let refs = made.metadata.owner_references.unwrap();
    assert_eq!(
        refs[0].uid,
        first["metadata"]["uid"].as_str().unwrap(),
        "stored as given"
    );

    let mut events = open_watch(&secrets, &WatchParams::default(), server.resource_version()).await;
    server.delete(
        "latchkey.dev/v1alpha1",
        "ExternalSecret",
        Some("shop"),
        "first",
    );
    assert!(
        server.get("v1", "Secret", Some("shop"), "solo").is_some(),
        "nothing is collected unless asked"
    );
    let deleted: Vec<String> = server
        .collect_garbage()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deleted, ["api-made", "solo"]);
    let shared = server.get("v1", "Secret", Some("shop"), "shared").unwrap();
    assert_eq!(
        shared["metadata"]["ownerReferences"],
        json!([reference(&second)]),
        "a live owner keeps it; the dangling reference goes"
    );
    for (want, name) in [
        ("DELETED", "api-made"),
        ("MODIFIED", "shared"),
        ("DELETED", "solo"),
    ] {
        let event = next_event(&mut events).await.expect("an event");
        let (got, object) = match event {
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!((got, object.name_any().as_str()), (want, name));
    }
    assert!(server.collect_garbage().is_empty());
}

// --- Secret validation ------------------------------------------------------------------------

#[tokio::test]
async fn immutable_secrets_types_and_sizes_are_validated_with_the_real_messages() {
    let server = server().await;
    let secrets: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let pp = PostParams::default();
    let mut frozen = secret("shop", "frozen", "v1");
    frozen["immutable"] = json!(true);
    secrets.create(&pp, &typed(frozen)).await.unwrap();
    let merge = |patch: Value| Patch::Merge(patch);

    let change = status(
        secrets
            .patch(
                "frozen",
                &PatchParams::default(),
                &merge(json!({"stringData": {"value": "v2"}})),
            )
            .await,
    );
    assert_eq!((change.code, change.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        change.message,
        "Secret \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
    );
    let thaw = status(
        secrets
            .patch(
                "frozen",
                &PatchParams::default(),
                &merge(json!({"immutable": false})),
            )
            .await,
    );
    assert_eq!(
        thaw.message,
        "Secret \"frozen\" is invalid: immutable: Forbidden: field is immutable when `immutable` is set"
    );
    let apply = Patch::Apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "frozen"}, "data": {"value": b64("v3")}}));
    let applied = status(
        secrets
            .patch("frozen", &PatchParams::apply("x").force(), &apply)
            .await,
    );
    assert_eq!(applied.code, 422, "apply is validated too");
    secrets
        .patch(
            "frozen",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("metadata stays mutable");

    secrets
        .create(&pp, &typed(secret("shop", "db", "x")))
        .await
        .unwrap();
    let retype = status(
        secrets
            .patch(
                "db",
                &PatchParams::default(),
                &merge(json!({"type": "example.com/custom"})),
            )
            .await,
    );
    assert_eq!(
        retype.message,
        r#"Secret "db" is invalid: type: Invalid value: "example.com/custom": field is immutable"#
    );

    let limit = 1024 * 1024;
    secrets
        .create(&pp, &typed(secret("shop", "full", &"x".repeat(limit))))
        .await
        .expect("exactly 1 MiB fits");
    let big = status(
        secrets
            .create(&pp, &typed(secret("shop", "big", &"x".repeat(limit + 1))))
            .await,
    );
    assert_eq!((big.code, big.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        big.message,
        r#"Secret "big" is invalid: data: Too long: must have at most 1048576 bytes"#
    );
    let cause = &big.details.unwrap().causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldValueTooLong", "data")
    );
}

// --- Leases and ServiceAccounts ---------------------------------------------------------------

#[tokio::test]
async fn leases_and_service_accounts_are_served_with_the_generic_verbs() {
    let server = server().await;
    let elector = Identity::service_account(AGENT_NAMESPACE, "controller");
    server.add_identity("elector", elector.clone());
    for verb in ["get", "create", "update"] {
        server.allow(
            elector.clone(),
            verb,
            "coordination.k8s.io",
            "leases",
            Some(AGENT_NAMESPACE),
        );
    }
    let leases: Api<Lease> = Api::namespaced(server.client("elector").await, AGENT_NAMESPACE);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    };
    let pp = PostParams::default();
    let created = leases.create(&pp, &lease).await.unwrap();
    let mut taken = created.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let updated = leases.replace("leader", &pp, &taken).await.unwrap();
    assert!(rv_of(&updated) > rv_of(&created));
    let stale = status(leases.replace("leader", &pp, &created).await);
    assert_eq!(
        stale.message,
        r#"Operation cannot be fulfilled on leases.coordination.k8s.io "leader": the object has been modified; please apply your changes to the latest version and try again"#
    );
    let denied = status(leases.list(&ListParams::default()).await);
    assert_eq!(
        denied.message,
        r#"leases.coordination.k8s.io is forbidden: User "system:serviceaccount:latchkey:controller" cannot list resource "leases" in API group "coordination.k8s.io" in the namespace "latchkey""#
    );

    let admin = server.client(ADMIN).await;
    let all: Api<Lease> = Api::all(admin.clone());
    assert_eq!(
        names(&all.list(&ListParams::default()).await.unwrap().items),
        ["leader"]
    );
    let admin_leases: Api<Lease> = Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    let mut stream = open_watch(&admin_leases, &WatchParams::default(), rv_of(&updated)).await;
    let renew = Patch::Merge(json!({"spec": {"leaseTransitions": 1}}));
    admin_leases
        .patch("leader", &PatchParams::default(), &renew)
        .await
        .unwrap();
    let Some(WatchEvent::Modified(seen)) = next_event(&mut stream).await else {
        panic!("MODIFIED expected");
    };
    assert_eq!(seen.spec.unwrap().lease_transitions, Some(1));
    let apply = Patch::Apply(
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                    "metadata": {"name": "other"}, "spec": {"holderIdentity": "c"}}),
    );
    admin_leases
        .patch("other", &PatchParams::apply("x"), &apply)
        .await
        .unwrap();
    admin_leases
        .delete("other", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(status(admin_leases.get("other").await).code, 404);

    let accounts: Api<ServiceAccount> = Api::namespaced(admin, "shop");
    let web = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("web".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let made = accounts.create(&pp, &web).await.unwrap();
    assert_eq!(
        made.metadata.uid,
        Some(server.service_account_uid("shop", "web")),
        "the uid TokenReviews report"
    );
    assert_eq!(
        names(&accounts.list(&ListParams::default()).await.unwrap().items),
        ["web"]
    );
    accounts
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        server
            .get("v1", "ServiceAccount", Some("shop"), "web")
            .is_none()
    );
}

// --- TokenRequest -----------------------------------------------------------------------------

fn token_request(audiences: &[&str], seconds: Option<i64>) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration_seconds: seconds,
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    }
}

async fn review(server: &FakeApiServer, token: &str, audiences: &[&str]) -> Value {
    let reviews: Api<TokenReview> = Api::all(server.client(ADMIN).await);
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
        },
        ..TokenReview::default()
    };
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    serde_json::to_value(answer.status.unwrap()).unwrap()
}

#[tokio::test]
async fn token_requests_mint_tokens_for_their_audiences_until_they_expire() {
    let server = server().await;
    let minter = Identity::service_account(AGENT_NAMESPACE, "controller");
    server.add_identity("minter", minter.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(server.client("minter").await, "shop");
    let pp = PostParams::default();
    let vault_request = token_request(&["vault"], Some(600));

    let denied = status(
        accounts
            .create_token_request("web", &pp, &vault_request)
            .await,
    );
    assert_eq!(
        denied.message,
        r#"serviceaccounts "web" is forbidden: User "system:serviceaccount:latchkey:controller" cannot create resource "serviceaccounts/token" in API group "" in the namespace "shop""#
    );
    server.allow(minter, "create", "", "serviceaccounts/token", None);
    let missing = status(
        accounts
            .create_token_request("web", &pp, &vault_request)
            .await,
    );
    assert_eq!(missing.message, r#"serviceaccounts "web" not found"#);
    server.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "web", "namespace": "shop"}}));
    let short = status(
        accounts
            .create_token_request("web", &pp, &token_request(&["vault"], Some(599)))
            .await,
    );
    assert_eq!(
        short.message,
        r#"TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"#
    );

    let minted = accounts
        .create_token_request("web", &pp, &vault_request)
        .await
        .unwrap();
    assert_eq!(minted.spec.audiences, ["vault"]);
    assert_eq!(minted.spec.expiration_seconds, Some(600));
    let vault_token = minted.status.unwrap().token;
    let claims = jwt_claims(&vault_token);
    assert_eq!(claims["sub"], "system:serviceaccount:shop:web");
    assert_eq!(claims["aud"], json!(["vault"]));
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        600
    );
    assert_eq!(claims["kubernetes.io"]["namespace"], "shop");
    let uid = server.service_account_uid("shop", "web");
    assert_eq!(
        claims["kubernetes.io"]["serviceaccount"],
        json!({"name": "web", "uid": uid})
    );

    // For `vault` only: no API calls, but a TokenReview for `vault` authenticates it.
    let as_vault: Api<Secret> = Api::namespaced(server.client(&vault_token).await, "shop");
    assert_eq!(status(as_vault.get("db").await).code, 401);
    let reviewed = review(&server, &vault_token, &["vault"]).await;
    assert_eq!(reviewed["authenticated"], true);
    assert_eq!(
        reviewed["user"]["username"],
        "system:serviceaccount:shop:web"
    );
    assert_eq!(reviewed["user"]["uid"], uid.as_str());
    assert_eq!(
        review(&server, &vault_token, &["other"]).await["authenticated"],
        false
    );

    // No audiences: the API server's own, for an hour; it calls the API as the account.
    let api_token = accounts
        .create_token_request("web", &pp, &token_request(&[], None))
        .await
        .unwrap();
    assert_eq!(api_token.spec.audiences, [API_AUDIENCE]);
    assert_eq!(api_token.spec.expiration_seconds, Some(3600));
    let api_token = api_token.status.unwrap().token;
    server.apply(secret("shop", "db", "x"));
    let as_web: Api<Secret> = Api::namespaced(server.client(&api_token).await, "shop");
    as_web.get("db").await.unwrap();
    assert_eq!(
        server.requests().last().unwrap().identity,
        Some(Identity::service_account("shop", "web"))
    );
    assert_eq!(
        server.token_requests(),
        [
            TokenRequestRecord {
                namespace: "shop".into(),
                service_account: "web".into(),
                audiences: vec!["vault".into()],
                expiration_seconds: 600,
            },
            TokenRequestRecord {
                namespace: "shop".into(),
                service_account: "web".into(),
                audiences: vec![API_AUDIENCE.into()],
                expiration_seconds: 3600,
            },
        ],
        "refused requests mint nothing"
    );

    server.advance_token_clock(Duration::from_secs(601));
    let expired = review(&server, &vault_token, &["vault"]).await;
    assert_eq!(expired["authenticated"], false);
    assert!(
        expired["error"].as_str().unwrap().contains("expired"),
        "{expired}"
    );
    as_web
        .get("db")
        .await
        .expect("the hour-long token still works");
    server.advance_token_clock(Duration::from_secs(3000));
    assert_eq!(status(as_web.get("db").await).code, 401);

    let fresh = accounts
        .create_token_request("web", &pp, &token_request(&[], None))
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let fresh_api: Api<Secret> = Api::namespaced(server.client(&fresh).await, "shop");
    fresh_api.get("db").await.unwrap();
    server.delete("v1", "ServiceAccount", Some("shop"), "web");
    assert_eq!(
        status(fresh_api.get("db").await).code,
        401,
        "a deleted account's tokens die with it"
    );
}

/// Needs OpenBao's `bao` on PATH (scripts/test.sh's venv): run with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minted_tokens_log_in_to_openbao_kubernetes_auth() {
    let server = server().await;
    let reviewer = "openbao-reviewer";
    let openbao = Identity::service_account("openbao", "openbao");
    server.add_identity(reviewer, openbao.clone());
    server.allow(
        openbao,
        "create",
        "authentication.k8s.io",
        "tokenreviews",
        None,
    );
    server.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "web", "namespace": "shop"}}));
    let bao = support::openbao::OpenBao::start().await;
    bao.kubernetes(
        &server.url(),
        reviewer,
        "shop",
        ("shop", "web"),
        "vault",
        &["default"],
    )
    .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(server.client(ADMIN).await, "shop");
    let token = accounts
        .create_token_request(
            "web",
            &PostParams::default(),
            &token_request(&["vault"], None),
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let login = bao
        .api(
            "POST",
            "auth/kubernetes/login",
            Some(json!({"role": "shop", "jwt": token})),
        )
        .await;
    assert_eq!(login["auth"]["metadata"]["service_account_name"], "web");
    assert!(login["auth"]["client_token"].as_str().is_some());
}

// --- metadata-only responses ------------------------------------------------------------------

#[tokio::test]
async fn metadata_only_gets_lists_and_watches_never_carry_secret_data() {
    let server = server().await;
    server.apply(secret("shop", "db", "hunter2"));
    let client = server.client(ADMIN).await;
    let meta: Api<PartialObjectMeta<Secret>> = Api::namespaced(client.clone(), "shop");

    let one = meta.get("db").await.unwrap();
    assert_eq!(one.types.unwrap().kind, "PartialObjectMetadata");
    assert_eq!(one.metadata.name.as_deref(), Some("db"));
    let listed = meta.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&listed.items), ["db"]);
    let request = kube::core::Request::new("/api/v1/namespaces/shop/secrets");
    let text = client
        .request_text(request.list_metadata(&ListParams::default()).unwrap())
        .await
        .unwrap();
    assert!(
        text.contains(r#""kind":"PartialObjectMetadataList""#),
        "{text}"
    );
    assert!(
        !text.contains(r#""data""#) && !text.contains(&b64("hunter2")),
        "{text}"
    );

    let (_task, mut events) = watch_events(meta, watcher::Config::default());
    expect_events(&mut events, &["init", "init-apply db", "init-done"]).await;
    let since = server.resource_version().to_string();
    let raw = request
        .watch_metadata(&WatchParams::default().timeout(1), &since)
        .unwrap();
    let raw = tokio::spawn({
        let client = client.clone();
        async move { client.request_text(raw).await }
    });
    eventually("both watches", || server.open_watches() == 2).await;
    server.apply(secret("shop", "db", "rotated"));
    expect_events(&mut events, &["apply db"]).await;
    let text = within("the raw watch to time out", raw)
        .await
        .unwrap()
        .unwrap();
    assert!(text.contains(r#""type":"MODIFIED""#), "{text}");
    assert!(text.contains(r#""kind":"PartialObjectMetadata""#), "{text}");
    assert!(
        !text.contains(r#""data""#) && !text.contains(&b64("rotated")),
        "{text}"
    );

    let wrong = http::Request::get("/api/v1/namespaces/shop/secrets/db")
        .header(
            http::header::ACCEPT,
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .body(Vec::new())
        .unwrap();
    let refused = status(client.request_text(wrong).await);
    assert_eq!(
        (refused.code, refused.reason.as_str()),
        (406, "NotAcceptable")
    );
}

// --- injected failures ------------------------------------------------------------------------

#[tokio::test]
async fn injected_failures_have_the_real_shapes_and_kube_rs_retries_throttling() {
    let server = server().await;
    server.apply(secret("shop", "db", "x"));
    let secrets: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");

    server.fail_next("GET", "/secrets/db", 429, 1);
    let (code, head, body) = raw_get(&server, "/api/v1/namespaces/shop/secrets/db", ADMIN).await;
    assert_eq!(code, 429);
    assert!(head.contains("retry-after: 1"), "{head}");
    let throttled: Status = serde_json::from_str(&body).unwrap();
    assert_eq!(throttled.reason, "TooManyRequests");
    assert_eq!(throttled.details.unwrap().retry_after_seconds, 1);

    // kube-rs retries 429 (after Retry-After) and 503 on its own.
    server.fail_next("GET", "/secrets/db", 429, 1);
    server.fail_next("GET", "/secrets/db", 503, 1);
    server.clear_requests();
    let started = Instant::now();
    within("a retried get", secrets.get("db")).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(server.requests().len(), 3, "every attempt is recorded");

    server.fail_next("PATCH", "/secrets/db", 500, 1);
    let label = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    let internal = status(secrets.patch("db", &PatchParams::default(), &label).await);
    assert_eq!(
        (
            internal.code,
            internal.reason.as_str(),
            internal.message.as_str()
        ),
        (
            500,
            "InternalError",
            "Internal error occurred: injected by the fake API server"
        )
    );
    server.fail_next("*", "/secrets/db", 409, 1);
    let conflict = status(secrets.patch("db", &PatchParams::default(), &label).await);
    assert_eq!(conflict.reason, "Conflict");
    assert!(
        conflict
            .message
            .starts_with(r#"Operation cannot be fulfilled on secrets "db""#)
    );
    server.fail_next("PATCH", "/secrets/db", 422, 1);
    let invalid = status(secrets.patch("db", &PatchParams::default(), &label).await);
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));
    assert!(
        invalid.message.starts_with(r#"Secret "db" is invalid: "#),
        "{}",
        invalid.message
    );
    let unlabelled = server.get("v1", "Secret", Some("shop"), "db").unwrap();
    assert!(
        unlabelled["metadata"].get("labels").is_none(),
        "failed writes wrote nothing"
    );
    secrets
        .patch("db", &PatchParams::default(), &label)
        .await
        .expect("the queue is used up");
}

// --- delete preconditions and held requests ----------------------------------------------------

/// A delete with `preconditions` removes only the object the client checked (uid and
/// resourceVersion), as the real server does: anything else is 409 Conflict and nothing goes.
/// A held request reads the store only after its delay.
#[tokio::test]
async fn deletes_honour_preconditions_and_held_requests_read_late() {
    let server = server().await;
    let admin: Api<Secret> = Api::namespaced(server.client(ADMIN).await, "shop");
    let first = server.apply(secret("shop", "a", "1"));
    let uid = first["metadata"]["uid"].as_str().unwrap().to_string();
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let only = |uid: &str, rv: &str| DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: Some(rv.to_string()),
        }),
        ..DeleteParams::default()
    };
    // Changed since it was checked, or another object of the same name: refused.
    server.apply(secret("shop", "a", "2"));
    let stale = status(admin.delete("a", &only(&uid, &rv)).await);
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(
        stale.message.contains("ResourceVersion in precondition"),
        "{}",
        stale.message
    );
    let now = admin.get("a").await.unwrap();
    let other = status(
        admin
            .delete("a", &only("not-its-uid", &now.resource_version().unwrap()))
            .await,
    );
    assert_eq!(other.code, 409);
    assert!(
        other.message.contains("UID in precondition"),
        "{}",
        other.message
    );
    assert!(server.get("v1", "Secret", Some("shop"), "a").is_some());
    admin
        .delete("a", &only(&uid, &now.resource_version().unwrap()))
        .await
        .unwrap();
    assert!(server.get("v1", "Secret", Some("shop"), "a").is_none());

    // Held for 300 ms: a Secret created meanwhile is what the held get finds.
    server.delay_next("GET", "/secrets/late", Duration::from_millis(300), 1);
    let held = tokio::spawn({
        let admin = admin.clone();
        async move { admin.get_opt("late").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.apply(secret("shop", "late", "x"));
    let found = held.await.unwrap().unwrap();
    assert!(
        found.is_some(),
        "the held request read the store before its delay"
    );
}

// --- provider kinds: discovery and CRDs that are not installed --------------------------------

/// A group version's discovery document lists its installed kinds, as kube's
/// `list_api_group_resources` reads it; an uninstalled CRD disappears from it, its paths are
/// Go's plain-text `404 page not found`, and a group with nothing installed is one too.
#[tokio::test]
async fn discovery_lists_installed_provider_kinds_and_an_uninstalled_crd_is_not_there() {
    let server = server().await;
    let client = server.client(AGENT).await;
    for group in [
        "providers.latchkey.dev/v1alpha1",
        "cluster.providers.latchkey.dev/v1alpha1",
    ] {
        let (code, _, body) = raw_get(&server, &format!("/apis/{group}"), AGENT).await;
        assert_eq!(
            (code, body.as_str()),
            (404, "404 page not found\n"),
            "{group}"
        );
        for kind in ["Vault", "Fake"] {
            server.install(group, kind);
        }
    }
    let kinds = |list: &k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList| {
        list.resources
            .iter()
            .map(|r| (r.name.clone(), r.kind.clone(), r.namespaced))
            .collect::<Vec<_>>()
    };
    let list = client
        .list_api_group_resources("providers.latchkey.dev/v1alpha1")
        .await
        .unwrap();
    assert_eq!(list.group_version, "providers.latchkey.dev/v1alpha1");
    assert!(kinds(&list).contains(&("vaults".into(), "Vault".into(), true)));
    let cluster = client
        .list_api_group_resources("cluster.providers.latchkey.dev/v1alpha1")
        .await
        .unwrap();
    assert!(kinds(&cluster).contains(&("vaults".into(), "Vault".into(), false)));

    server.uninstall("providers.latchkey.dev/v1alpha1", "Vault");
    let list = client
        .list_api_group_resources("providers.latchkey.dev/v1alpha1")
        .await
        .unwrap();
    assert!(!kinds(&list).iter().any(|k| k.1 == "Vault"), "{list:?}");
    assert!(kinds(&list).iter().any(|k| k.1 == "Fake"));
    let (code, head, body) = raw_get(
        &server,
        "/apis/providers.latchkey.dev/v1alpha1/namespaces/shop/vaults",
        AGENT,
    )
    .await;
    assert_eq!((code, body.as_str()), (404, "404 page not found\n"));
    assert!(head.contains("content-type: text/plain"), "{head}");
    let (code, _, body) = raw_get(&server, "/apis/nothing.example/v1", AGENT).await;
    assert_eq!((code, body.as_str()), (404, "404 page not found\n"));
}
