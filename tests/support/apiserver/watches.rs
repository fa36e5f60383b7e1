//! Watch streams.

use super::*;

pub(super) type Chunk = Result<Bytes, std::io::Error>;

/// A watch request, resolved.
pub(super) struct WatchSpec {
    pub(super) filter: Filter,
    /// `None`: start now, with synthetic ADDED events for the current objects.
    pub(super) after: Option<u64>,
    pub(super) initial_events: bool,
    pub(super) initial_end_bookmark: bool,
    pub(super) bookmarks: bool,
    pub(super) timeout: Duration,
    pub(super) representation: Representation,
}

impl WatchSpec {
    pub(super) fn new(
        target: &Target,
        query: &Query,
        representation: Representation,
    ) -> Result<Self, ApiError> {
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
            representation,
        })
    }

    /// One event line, its object as the client asked for it.
    fn line(&self, event: &str, object: &Value) -> Bytes {
        event_line(event, &self.representation.object(object.clone()))
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let kind = self.kind();
        let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object =
            json!({"kind": kind.kind, "apiVersion": kind.api_version(), "metadata": metadata});
        self.line("BOOKMARK", &object)
    }

    pub(super) fn kind(&self) -> &'static Kind {
        &KINDS[self.filter.kind]
    }
}

pub(super) fn start_watch(
    shared: &Arc<Shared>,
    target: &Target,
    query: &Query,
    representation: Representation,
) -> Result<Response, ApiError> {
    let spec = WatchSpec::new(target, query, representation)?;
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
pub(super) struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    pub(super) fn new(shared: &Arc<Shared>) -> Self {
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
pub(super) async fn run_watch(
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
                    let _ = tx.send(Ok(spec.bookmark(last, false))).await;
                }
                return;
            }
            () = tx.closed() => return,
        }
    }
}

/// Sends every line; `false` when the client has gone.
pub(super) async fn send_all(tx: &mpsc::Sender<Chunk>, lines: Vec<Bytes>) -> bool {
    for line in lines {
        if tx.send(Ok(line)).await.is_err() {
            return false;
        }
    }
    true
}

/// The events a watch starts with and the revision it continues after (`None`: it ends).
pub(super) fn initial_events(shared: &Shared, spec: &WatchSpec) -> (Vec<Bytes>, Option<u64>) {
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
            .map(|(_, object)| spec.line("ADDED", object))
            .collect();
    }
    if spec.initial_end_bookmark {
        lines.push(spec.bookmark(rv, true));
    }
    (lines, Some(rv))
}

/// Events after `last` and the revision they bring the watch to (`None`: the watch ends,
/// because history is gone or the watch was closed).
/// A closed watch sends nothing more.
pub(super) fn watch_step(
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
        .filter_map(|change| watch_event(spec, change))
        .collect();
    // The kind's CRD was deleted: the deletions go out, then the watch ends.
    if lock(&shared.uninstalled).contains(&spec.filter.kind) {
        return (lines, None);
    }
    (lines, Some(store.rv))
}

/// A change as this watch sees it: an object entering its selector is ADDED, one leaving it
/// is DELETED (with its new state), as the real watch cache does.
pub(super) fn watch_event(spec: &WatchSpec, change: &Change) -> Option<Bytes> {
    let filter = &spec.filter;
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
    Some(spec.line(kind, &change.object))
}

pub(super) fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub(super) fn too_old_line(rv: u64, compacted: u64) -> Bytes {
    let error = ApiError::expired(format!("too old resource version: {rv} ({compacted})"));
    event_line("ERROR", &error.status())
}
