//! Reading current values together: the keys of a volume are requested concurrently, one `get`
//! each, and the current ones (no version, or `AWSCURRENT`) are answered from one queue with
//! `BatchGetSecretValue`, 20 names per call, instead of one `GetSecretValue` each. Every caller
//! still receives its own value or its own error.
//!
//! Not for other stages or `uuid/` versions (those are read alone with [`get_one`]), and not
//! for deciding which keys to read: that is the publish path's job.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::operation::batch_get_secret_value::BatchGetSecretValueOutput;
use tokio::sync::oneshot;

use super::super::ProviderError;
use super::errors::{code_error, map_err};
use super::value;
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::BackendLabels;

/// `BatchGetSecretValue` takes at most this many ids.
pub(super) const BATCH: usize = 20;
/// How many times the first queued `get` lets its task run on before the queue is flushed: the
/// other keys of a volume are requested in the same polls of the publish task.
const WINDOW_YIELDS: usize = 2;
/// The stage `BatchGetSecretValue` returns.
pub(super) const CURRENT: &str = "AWSCURRENT";

pub(super) type Reply = oneshot::Sender<Result<SecretBytes, ProviderError>>;
/// Current-version reads waiting for the next flush: (secret id, where its outcome goes).
pub(super) type Queue = Arc<Mutex<Vec<(String, Reply)>>>;

/// The current value of `id`, read by one flush together with every other current value asked
/// for in the same polls of the caller's task.
pub(super) async fn current(
    queue: &Queue,
    client: &Client,
    metrics: &Arc<Metrics>,
    id: &str,
) -> Result<SecretBytes, ProviderError> {
    let (client, metrics) = (client.clone(), Arc::clone(metrics));
    queued(queue, id, "GetSecretValue", move |queued| async move {
        flush(&client, &metrics, queued).await;
    })
    .await
}

/// Queues `id` and waits for its outcome. The first caller of a window spawns `flush` with
/// everything queued once it has let its task run on (or was dropped); `op` names the read in
/// the error of an abandoned flush. Shared by Secrets Manager and Parameter Store.
pub(super) async fn queued<F, Fut>(
    queue: &Queue,
    id: &str,
    op: &str,
    flush: F,
) -> Result<SecretBytes, ProviderError>
where
    F: FnOnce(Vec<(String, Reply)>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let first = {
        let mut queued = queue.lock().unwrap_or_else(PoisonError::into_inner);
        queued.push((id.to_string(), tx));
        queued.len() == 1
    };
    if first {
        // The flush waits until this caller has let its task run on, or was dropped.
        let (go, wait) = oneshot::channel::<()>();
        let queue = Arc::clone(queue);
        tokio::spawn(async move {
            let _ = wait.await;
            let queued = std::mem::take(&mut *queue.lock().unwrap_or_else(PoisonError::into_inner));
            flush(queued).await;
        });
        for _ in 0..WINDOW_YIELDS {
            tokio::task::yield_now().await;
        }
        drop(go);
    }
    rx.await.unwrap_or_else(|_| {
        Err(ProviderError::Unavailable(format!(
            "{op}: the batched read was abandoned"
        )))
    })
}

/// Groups queued callers by name (first-asked order) for one flush.
pub(super) fn by_name(queued: Vec<(String, Reply)>) -> (Vec<String>, HashMap<String, Vec<Reply>>) {
    let mut names: Vec<String> = Vec::new();
    let mut replies: HashMap<String, Vec<Reply>> = HashMap::new();
    for (name, tx) in queued {
        let waiting = replies.entry(name).or_insert_with_key(|n| {
            names.push(n.clone());
            Vec::new()
        });
        waiting.push(tx);
    }
    (names, replies)
}

/// Sends every caller waiting for a name its outcome.
pub(super) fn answer(
    mut replies: HashMap<String, Vec<Reply>>,
    results: Vec<(String, Result<SecretBytes, ProviderError>)>,
) {
    for (name, result) in results {
        for tx in replies.remove(&name).unwrap_or_default() {
            let _ = tx.send(result.clone());
        }
    }
}

/// One secret with `GetSecretValue`: its current value, or the given stage or `uuid/` version.
pub(super) async fn get_one(
    client: &Client,
    id: &str,
    version: Option<&str>,
) -> Result<SecretBytes, ProviderError> {
    let req = client.get_secret_value().secret_id(id);
    let req = match version {
        Some(v) => match v.strip_prefix("uuid/") {
            Some(id) => req.version_id(id),
            None => req.version_stage(v),
        },
        None => req,
    };
    let out = req.send().await.map_err(|e| map_err("GetSecretValue", e))?;
    value(out.secret_string(), out.secret_binary())
}

/// One `BatchGetSecretValue` call (at most `BATCH` ids), counted and timed as `batch_get`.
pub(super) async fn batch_call(
    client: &Client,
    metrics: &Metrics,
    ids: &[String],
) -> Result<BatchGetSecretValueOutput, ProviderError> {
    let start = Instant::now();
    let result = client
        .batch_get_secret_value()
        .set_secret_id_list(Some(ids.to_vec()))
        .send()
        .await
        .map_err(|e| map_err("BatchGetSecretValue", e));
    count(metrics, "batch_get", start, result.as_ref().err());
    result
}

/// Counts and times one batched call under `provider="aws"` and its own `operation`.
pub(super) fn count(
    metrics: &Metrics,
    operation: &'static str,
    start: Instant,
    error: Option<&ProviderError>,
) {
    let labels = BackendLabels {
        provider: "aws",
        operation,
        result: error.map_or("success", ProviderError::kind),
    };
    metrics.backend_requests.get_or_create(&labels).inc();
    metrics
        .backend_duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
}

/// Reads the current values of everything queued and answers every caller: one name with
/// `GetSecretValue`, more with concurrent `BatchGetSecretValue` calls of `BATCH` names.
async fn flush(client: &Client, metrics: &Metrics, queued: Vec<(String, Reply)>) {
    let (names, replies) = by_name(queued);
    let results = if let [name] = names.as_slice() {
        vec![(name.clone(), get_one(client, name, None).await)]
    } else {
        futures::future::join_all(
            names
                .chunks(BATCH)
                .map(|chunk| batch_current(client, metrics, chunk)),
        )
        .await
        .into_iter()
        .flatten()
        .collect()
    };
    answer(replies, results);
}

/// The current value, or the error, of each of `ids` (at most `BATCH`): one
/// `BatchGetSecretValue` call, with `GetSecretValue` for the ids its answer does not name (a
/// partial ARN, say) and for all of them when the identity may not batch.
async fn batch_current(
    client: &Client,
    metrics: &Metrics,
    ids: &[String],
) -> Vec<(String, Result<SecretBytes, ProviderError>)> {
    let call = batch_call(client, metrics, ids).await;
    settle(
        ids,
        call,
        |resp| {
            let mut answered: HashMap<&str, Result<SecretBytes, ProviderError>> = HashMap::new();
            for v in resp.secret_values() {
                let id = ids
                    .iter()
                    .find(|id| v.name() == Some(id.as_str()) || v.arn() == Some(id.as_str()));
                if let Some(id) = id {
                    answered.insert(id, value(v.secret_string(), v.secret_binary()));
                }
            }
            for e in resp.errors() {
                let id = ids.iter().find(|id| e.secret_id() == Some(id.as_str()));
                if let Some(id) = id {
                    answered.entry(id).or_insert_with(|| {
                        Err(code_error(
                            "BatchGetSecretValue",
                            e.error_code().unwrap_or(""),
                            e.message(),
                            400,
                        ))
                    });
                }
            }
            answered
        },
        |id| async move { get_one(client, &id, None).await },
    )
    .await
}

/// Every name's outcome from one batch `call` over `names`: a call the identity may not make
/// (or an endpoint without it) reads every name alone with `one`; any other error is every
/// name's; an answer gives what `answers` finds in it, and the names it does not mention are
/// read alone.
pub(super) async fn settle<'n, R, Fut>(
    names: &'n [String],
    call: Result<R, ProviderError>,
    answers: impl FnOnce(&R) -> HashMap<&'n str, Result<SecretBytes, ProviderError>>,
    one: impl Fn(String) -> Fut,
) -> Vec<(String, Result<SecretBytes, ProviderError>)>
where
    Fut: std::future::Future<Output = Result<SecretBytes, ProviderError>>,
{
    let one_by_one = |names: Vec<String>| {
        futures::future::join_all(names.into_iter().map(|name| {
            let read = one(name.clone());
            async move { (name, read.await) }
        }))
    };
    let answered = match call {
        Ok(resp) => answers(&resp),
        Err(ProviderError::PermissionDenied(_) | ProviderError::Config(_)) => {
            return one_by_one(names.to_vec()).await;
        }
        Err(e) => return names.iter().map(|n| (n.clone(), Err(e.clone()))).collect(),
    };
    let unanswered: Vec<String> = names
        .iter()
        .filter(|n| !answered.contains_key(n.as_str()))
        .cloned()
        .collect();
    let mut out: Vec<_> = answered
        .into_iter()
        .map(|(n, r)| (n.to_string(), r))
        .collect();
    out.extend(one_by_one(unanswered).await);
    out
}
