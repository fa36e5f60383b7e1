//! Self-tests of the fake Kubernetes API server (`tests/support/apiserver.rs`), driven by the
//! real kube-rs client the agent uses: typed get/create/replace/patch and their error statuses,
//! authorisation per token, watchers and reflectors (including 410 recovery), resourceVersions,
//! pagination, selectors, events and request recording. Every wait is bounded.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, ObjectReference, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::core::Status;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use latchkey::api::{ClusterSecretStore, ExternalSecret, SecretStore};
use serde_json::{Value, json};
use support::apiserver::{AGENT_NAMESPACE, FakeApiServer, Identity, RecordedRequest};
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

    let apply = Patch::Apply(json!({}));
    let unsupported = status(admin.patch("db", &PatchParams::apply("t"), &apply).await);
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
