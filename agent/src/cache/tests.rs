use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

fn key(identity: &str, name: &str) -> CacheKey {
    CacheKey::new(
        "SecretStore/shop/aws-prod#1a2b",
        identity,
        &RemoteKey {
            key: name.into(),
            version: None,
        },
    )
}

fn cache(limits: CacheLimits) -> (Arc<ValueCache>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    (
        Arc::new(ValueCache::new(limits, Arc::clone(&metrics))),
        metrics,
    )
}

fn no_jitter() -> CacheLimits {
    CacheLimits {
        jitter: 0.0,
        ..CacheLimits::default()
    }
}

/// (hits, misses, joins)
fn counts(metrics: &Metrics) -> (u64, u64, u64) {
    (
        metrics.cache_hits.get(),
        metrics.cache_misses.get(),
        metrics.cache_joins.get(),
    )
}

async fn value(v: &str) -> Result<SecretBytes, ProviderError> {
    Ok(SecretBytes::from(v))
}

async fn must_not_fetch() -> Result<SecretBytes, ProviderError> {
    panic!("expected a cache hit");
}

#[tokio::test]
async fn counts_hits_misses_and_joins() {
    let (cache, metrics) = cache(CacheLimits::default());
    let k = key("shop/web", "db");
    let v = cache
        .get_or_fetch(k.clone(), None, || value("s3cret"))
        .await;
    assert_eq!(v.unwrap().expose(), b"s3cret");
    assert_eq!(counts(&metrics), (0, 1, 0));

    let v = cache.get_or_fetch(k.clone(), None, must_not_fetch).await;
    assert_eq!(v.unwrap().expose(), b"s3cret");
    assert_eq!(counts(&metrics), (1, 1, 0));

    // A second key, fetched slowly by one caller while two more join it.
    let k2 = key("shop/web", "api");
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        value("tok").await
    };
    let (a, b, c) = tokio::join!(
        cache.get_or_fetch(k2.clone(), None, slow),
        cache.get_or_fetch(k2.clone(), None, must_not_fetch),
        cache.get_or_fetch(k2.clone(), None, must_not_fetch),
    );
    for v in [a, b, c] {
        assert_eq!(v.unwrap().expose(), b"tok");
    }
    assert_eq!(counts(&metrics), (1, 2, 2));
    assert_eq!(cache.len(), 2);
}

/// 500 concurrent publishes over 10 keys and `identities` service accounts; returns the number
/// of backend calls.
async fn mount_storm(identities: &[&str]) -> (usize, Arc<Metrics>) {
    let (cache, metrics) = cache(CacheLimits::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..500 {
        let identity = identities[i % identities.len()].to_string();
        let name = format!("secret-{}", (i / identities.len()) % 10);
        let (cache, calls) = (Arc::clone(&cache), Arc::clone(&calls));
        tasks.push(tokio::spawn(async move {
            let expected = format!("{identity}:{name}");
            let fetched = expected.clone();
            let v = cache
                .get_or_fetch(key(&identity, &name), Some(Duration::from_secs(60)), || {
                    let calls = Arc::clone(&calls);
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok(SecretBytes::from(fetched))
                    }
                })
                .await
                .unwrap();
            // Each identity gets the value fetched as itself, never another's.
            assert_eq!(v.expose(), expected.as_bytes());
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (calls.load(Ordering::SeqCst), metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_storm_one_identity_fetches_each_key_once() {
    let (calls, metrics) = mount_storm(&["shop/web"]).await;
    assert_eq!(calls, 10);
    let (hits, misses, joins) = counts(&metrics);
    assert_eq!(misses, 10);
    assert_eq!(hits + misses + joins, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_storm_two_identities_fetch_each_key_once_per_identity() {
    let (calls, metrics) = mount_storm(&["shop/web", "shop/worker"]).await;
    assert_eq!(calls, 20);
    let (hits, misses, joins) = counts(&metrics);
    assert_eq!(misses, 20);
    assert_eq!(hits + misses + joins, 500);
}

#[tokio::test]
async fn failures_are_shared_by_waiters_and_not_cached() {
    let (cache, metrics) = cache(CacheLimits::default());
    let k = key("shop/web", "db");
    let failing = || async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Err(ProviderError::Throttled("slow down".into()))
    };
    let (a, b, c) = tokio::join!(
        cache.get_or_fetch(k.clone(), None, failing),
        cache.get_or_fetch(k.clone(), None, must_not_fetch),
        cache.get_or_fetch(k.clone(), None, must_not_fetch),
    );
    for r in [a, b, c] {
        assert!(
            matches!(&r, Err(ProviderError::Throttled(m)) if m == "slow down"),
            "{r:?}"
        );
    }
    assert_eq!(counts(&metrics), (0, 1, 2));
    assert!(cache.is_empty());

    // The error was not cached: the next call fetches again, and its success is cached.
    let v = cache.get_or_fetch(k.clone(), None, || value("ok")).await;
    assert_eq!(v.unwrap().expose(), b"ok");
    assert_eq!(counts(&metrics), (0, 2, 2));
    assert_eq!(cache.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelled_fetcher_does_not_strand_waiters() {
    let (cache, metrics) = cache(CacheLimits::default());
    let k = key("shop/web", "db");
    let waiter_fetches = Arc::new(AtomicUsize::new(0));

    // The fetcher's backend never answers; its caller gives up (a cancelled gRPC call).
    let fetcher = tokio::time::timeout(
        Duration::from_millis(100),
        cache.get_or_fetch(k.clone(), None, std::future::pending),
    );
    let waiter = || {
        let cache = Arc::clone(&cache);
        let k = k.clone();
        let fetches = Arc::clone(&waiter_fetches);
        async move {
            // Let the fetcher start its flight first, so that this caller joins it.
            tokio::task::yield_now().await;
            cache
                .get_or_fetch(k, None, || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    value("second try").await
                })
                .await
        }
    };
    let (f, a, b, c) = tokio::join!(fetcher, waiter(), waiter(), waiter());
    assert!(f.is_err(), "the fetcher should have timed out");
    for r in [a, b, c] {
        assert_eq!(r.unwrap().expose(), b"second try");
    }
    // One waiter became the new fetcher; the other two joined it.
    assert_eq!(waiter_fetches.load(Ordering::SeqCst), 1);
    let (hits, misses, joins) = counts(&metrics);
    assert_eq!((hits, misses), (0, 2));
    assert_eq!(
        joins,
        3 + 2,
        "three joined the first flight, two the second"
    );
    assert_eq!(cache.len(), 1);
    assert!(format!("{cache:?}").contains("in_flight: 0"));
}

#[tokio::test(start_paused = true)]
async fn entries_expire_after_max_age() {
    let (cache, metrics) = cache(no_jitter());
    let k = key("shop/web", "db");
    let max_age = Some(Duration::from_secs(10));
    cache
        .get_or_fetch(k.clone(), max_age, || value("v1"))
        .await
        .unwrap();

    tokio::time::advance(Duration::from_millis(9_999)).await;
    let v = cache.get_or_fetch(k.clone(), max_age, must_not_fetch).await;
    assert_eq!(v.unwrap().expose(), b"v1");

    tokio::time::advance(Duration::from_millis(1)).await;
    let v = cache.get_or_fetch(k.clone(), max_age, || value("v2")).await;
    assert_eq!(v.unwrap().expose(), b"v2");
    assert_eq!(counts(&metrics), (1, 2, 0));
    // Replaced, not added.
    assert_eq!(cache.len(), 1);

    // A caller with a shorter refresh interval sees the same entry as stale sooner.
    tokio::time::advance(Duration::from_secs(2)).await;
    let v = cache
        .get_or_fetch(k.clone(), Some(Duration::from_secs(1)), || value("v3"))
        .await;
    assert_eq!(v.unwrap().expose(), b"v3");
    // `Some(0)` is never fresh.
    let v = cache
        .get_or_fetch(k.clone(), Some(Duration::ZERO), || value("v4"))
        .await;
    assert_eq!(v.unwrap().expose(), b"v4");
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_expiry_across_entries() {
    let (cache, _) = cache(CacheLimits {
        jitter: 0.5,
        ..CacheLimits::default()
    });
    let max_age = Some(Duration::from_secs(100));
    let keys: Vec<_> = (0..100)
        .map(|i| key("shop/web", &format!("k{i}")))
        .collect();
    for k in &keys {
        cache
            .get_or_fetch(k.clone(), max_age, || value("v"))
            .await
            .unwrap();
    }
    // Every entry lives at least max_age × (1 − 0.5) ...
    tokio::time::advance(Duration::from_millis(49_999)).await;
    for k in &keys {
        cache
            .get_or_fetch(k.clone(), max_age, must_not_fetch)
            .await
            .unwrap();
    }
    // ... and at 75 s some have expired and some have not (all on one side: p = 2^-99).
    tokio::time::advance(Duration::from_millis(25_001)).await;
    let fetched = AtomicUsize::new(0);
    for k in &keys {
        cache
            .get_or_fetch(k.clone(), max_age, || async {
                fetched.fetch_add(1, Ordering::SeqCst);
                value("v").await
            })
            .await
            .unwrap();
    }
    let fetched = fetched.load(Ordering::SeqCst);
    assert!(0 < fetched && fetched < 100, "{fetched} of 100 expired");
}

#[test]
fn jitter_is_clamped() {
    for (asked, got) in [(7.0, 0.5), (-1.0, 0.0), (f64::NAN, 0.0), (0.2, 0.2)] {
        let (c, _) = cache(CacheLimits {
            jitter: asked,
            ..CacheLimits::default()
        });
        assert_eq!(c.limits.jitter, got, "asked for {asked}");
    }
}

#[tokio::test(start_paused = true)]
async fn no_max_age_never_expires() {
    let (cache, metrics) = cache(CacheLimits::default());
    let k = key("shop/web", "db");
    cache
        .get_or_fetch(k.clone(), None, || value("once"))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
    let v = cache.get_or_fetch(k.clone(), None, must_not_fetch).await;
    assert_eq!(v.unwrap().expose(), b"once");
    // Even a huge max_age neither overflows nor panics.
    let v = cache
        .get_or_fetch(k, Some(Duration::MAX), must_not_fetch)
        .await;
    assert_eq!(v.unwrap().expose(), b"once");
    assert_eq!(counts(&metrics), (2, 1, 0));
}

#[tokio::test]
async fn lru_evicts_by_entry_count_keeping_the_most_recently_used() {
    let (cache, _) = cache(CacheLimits {
        max_entries: 3,
        ..CacheLimits::default()
    });
    let [a, b, c, d] = ["a", "b", "c", "d"].map(|n| key("shop/web", n));
    for k in [&a, &b, &c] {
        cache
            .get_or_fetch(k.clone(), None, || value("v"))
            .await
            .unwrap();
    }
    // Use `a`, so `b` is now the least recently used.
    cache
        .get_or_fetch(a.clone(), None, must_not_fetch)
        .await
        .unwrap();
    cache
        .get_or_fetch(d.clone(), None, || value("v"))
        .await
        .unwrap();
    assert_eq!(cache.len(), 3);
    for k in [&a, &c, &d] {
        cache
            .get_or_fetch(k.clone(), None, must_not_fetch)
            .await
            .unwrap();
    }
    let refetched = AtomicUsize::new(0);
    cache
        .get_or_fetch(b.clone(), None, || async {
            refetched.fetch_add(1, Ordering::SeqCst);
            value("v").await
        })
        .await
        .unwrap();
    assert_eq!(
        refetched.load(Ordering::SeqCst),
        1,
        "b should have been evicted"
    );
    assert_eq!(cache.len(), 3);
}

#[tokio::test]
async fn lru_evicts_by_bytes_keeping_the_most_recently_used() {
    let [a, b, c] = ["a", "b", "c"].map(|n| key("shop/web", n));
    let entry = 100 + a.size();
    let (cache, _) = cache(CacheLimits {
        max_bytes: 2 * entry + entry / 2,
        ..CacheLimits::default()
    });
    let hundred = || async { Ok(SecretBytes::new(vec![7; 100])) };
    cache.get_or_fetch(a.clone(), None, hundred).await.unwrap();
    cache.get_or_fetch(b.clone(), None, hundred).await.unwrap();
    assert_eq!(cache.bytes(), 2 * entry);
    cache
        .get_or_fetch(a.clone(), None, must_not_fetch)
        .await
        .unwrap();
    cache.get_or_fetch(c.clone(), None, hundred).await.unwrap();
    assert_eq!((cache.len(), cache.bytes()), (2, 2 * entry));
    cache
        .get_or_fetch(a.clone(), None, must_not_fetch)
        .await
        .unwrap();
    cache
        .get_or_fetch(c.clone(), None, must_not_fetch)
        .await
        .unwrap();

    // A value larger than the whole budget is returned but not stored, and evicts nothing.
    let huge = cache
        .get_or_fetch(key("shop/web", "huge"), None, || async {
            Ok(SecretBytes::new(vec![1; 4096]))
        })
        .await
        .unwrap();
    assert_eq!(huge.len(), 4096);
    assert_eq!((cache.len(), cache.bytes()), (2, 2 * entry));
}

#[tokio::test]
async fn invalidate_drops_the_entry_and_detaches_the_flight() {
    let (cache, _) = cache(CacheLimits::default());
    let k = key("shop/web", "db");
    cache
        .get_or_fetch(k.clone(), None, || value("old"))
        .await
        .unwrap();
    assert!(cache.bytes() > 0);
    cache.invalidate(&k);
    assert_eq!((cache.len(), cache.bytes()), (0, 0));

    // A flight invalidated while running answers its caller, but its value is not stored.
    let v = cache
        .get_or_fetch(k.clone(), None, || async {
            cache.invalidate(&k);
            value("in flight").await
        })
        .await;
    assert_eq!(v.unwrap().expose(), b"in flight");
    assert!(cache.is_empty());
    let v = cache.get_or_fetch(k.clone(), None, || value("new")).await;
    assert_eq!(v.unwrap().expose(), b"new");
}

#[tokio::test]
async fn debug_shows_no_values() {
    let (cache, _) = cache(CacheLimits::default());
    cache
        .get_or_fetch(key("shop/web", "db"), None, || {
            value("hunter2-super-secret")
        })
        .await
        .unwrap();
    let printed = format!("{cache:?} {cache:#?}");
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("entries: 1"), "{printed}");
}

#[test]
fn get_or_fetch_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let (cache, _) = cache(CacheLimits::default());
    let fut = cache.get_or_fetch(key("shop/web", "db"), None, || value("v"));
    assert_send(&fut);
}

#[test]
fn keys_whose_parts_join_alike_stay_apart() {
    let remote = |key: &str, version: Option<&str>| RemoteKey {
        key: key.into(),
        version: version.map(Into::into),
    };
    let keys = [
        CacheKey::new("store", "shop/web", &remote("db", None)),
        CacheKey::new("store", "shop/we", &remote("bdb", None)),
        CacheKey::new("stores", "hop/web", &remote("db", None)),
        CacheKey::new("store", "shop/web", &remote("db", Some(""))),
        CacheKey::new("store", "shop/web", &remote("d", Some("b"))),
        CacheKey::new("store", "shop/web", &remote("db", Some("AWSCURRENT"))),
    ];
    for (i, a) in keys.iter().enumerate() {
        for (j, b) in keys.iter().enumerate() {
            assert_eq!(a == b, i == j, "{a:?} against {b:?}");
        }
    }
    assert_eq!(
        keys[0],
        CacheKey::new("store", "shop/web", &remote("db", None))
    );
    assert_eq!(
        format!("{:?}", keys[5]),
        r#"CacheKey { store: Some("store"), identity: Some("shop/web"), key: Some("db"), version: Some("AWSCURRENT") }"#
    );
    assert_eq!(
        format!("{:?}", keys[0]),
        r#"CacheKey { store: Some("store"), identity: Some("shop/web"), key: Some("db"), version: None }"#
    );
}

#[test]
fn a_key_too_long_for_the_stack_packs_alike() {
    // Past the stack buffer the key is packed on the heap: same bytes, same parts.
    let long = "k".repeat(600);
    let remote = RemoteKey {
        key: long.clone(),
        version: Some("v2".into()),
    };
    let key = CacheKey::new("store", "shop/web", &remote);
    assert_eq!(key, CacheKey::new("store", "shop/web", &remote));
    assert_eq!(key.size(), 4 * 8 + 5 + 8 + 600 + 2);
    let parts: Vec<_> = key.parts().collect();
    assert_eq!(
        parts,
        [
            Some("store"),
            Some("shop/web"),
            Some(long.as_str()),
            Some("v2")
        ]
    );
}

/// Lets the sweeping task run up to `secs` seconds from now (paused time advances by itself).
async fn wait(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn stale_entries_leave_without_a_reader() {
    let (cache, metrics) = cache(no_jitter());
    let ten = Some(Duration::from_secs(10));
    for name in ["db", "api"] {
        cache
            .get_or_fetch(key("shop/web", name), ten, || value("v"))
            .await
            .unwrap();
    }
    wait(9.9).await;
    assert_eq!(cache.len(), 2, "still fresh");
    wait(0.2).await;
    assert_eq!((cache.len(), cache.bytes()), (0, 0), "gone once stale");
    assert_eq!(metrics.cache_expired.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_longest_reader_keeps_an_entry() {
    let (cache, metrics) = cache(no_jitter());
    let k = key("shop/web", "db");
    cache
        .get_or_fetch(k.clone(), Some(Duration::from_secs(10)), || value("v"))
        .await
        .unwrap();
    wait(5.0).await;
    // A reader with a longer refresh interval uses it: it stays until stale for that one too.
    cache
        .get_or_fetch(k.clone(), Some(Duration::from_secs(100)), must_not_fetch)
        .await
        .unwrap();
    wait(50.0).await;
    assert_eq!(cache.len(), 1);
    wait(50.0).await;
    assert_eq!(cache.len(), 0);
    assert_eq!(metrics.cache_expired.get(), 1);

    // A reader with no max_age takes any value: nothing expires it any more.
    cache
        .get_or_fetch(k.clone(), Some(Duration::from_secs(10)), || value("v"))
        .await
        .unwrap();
    cache.get_or_fetch(k, None, must_not_fetch).await.unwrap();
    wait(365.0 * 24.0 * 3600.0).await;
    assert_eq!(cache.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_sooner_expiry_moves_the_planned_sweep_earlier() {
    let (cache, _) = cache(no_jitter());
    let hour = Some(Duration::from_secs(3600));
    cache
        .get_or_fetch(key("shop/web", "hourly"), hour, || value("v"))
        .await
        .unwrap();
    wait(1.0).await;
    let short = key("shop/web", "short");
    cache
        .get_or_fetch(short.clone(), Some(Duration::from_secs(5)), || value("v"))
        .await
        .unwrap();
    wait(5.1).await;
    assert_eq!(
        cache.len(),
        1,
        "the short-lived entry went, the hourly one stays"
    );
    // Sweeps are at least GAP apart: one expiring now waits for the next.
    cache
        .get_or_fetch(short.clone(), Some(Duration::from_secs(1)), || value("v"))
        .await
        .unwrap();
    wait(1.5).await;
    assert_eq!(cache.len(), 2);
    wait(sweep::GAP.as_secs_f64()).await;
    assert_eq!(cache.len(), 1);
    wait(3600.0).await;
    assert!(cache.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_sweeping_task_ends_with_its_cache() {
    let (cache, _) = cache(no_jitter());
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    cache
        .get_or_fetch(
            key("shop/web", "db"),
            Some(Duration::from_secs(3600)),
            || value("v"),
        )
        .await
        .unwrap();
    assert_eq!(tasks(), before + 1, "one task sweeps");
    let state = Arc::downgrade(&cache.state);
    drop(cache);
    wait(0.1).await;
    assert_eq!(tasks(), before, "and ends when the cache goes");
    assert!(state.upgrade().is_none(), "without keeping its state");
}

#[test]
fn without_a_runtime_entries_still_store_and_expire_on_read() {
    let (cache, _) = cache(no_jitter());
    let k = key("shop/web", "db");
    let got = futures::executor::block_on(cache.get_or_fetch(
        k.clone(),
        Some(Duration::from_secs(3600)),
        || value("v"),
    ));
    assert_eq!(got.unwrap().expose(), b"v");
    assert_eq!(cache.len(), 1);
    let got =
        futures::executor::block_on(cache.get_or_fetch(k, Some(Duration::ZERO), || value("again")));
    assert_eq!(got.unwrap().expose(), b"again");

    // The first store inside a runtime starts the sweeping after all.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let short = key("shop/web", "short");
        let ten = Some(Duration::from_secs(10));
        cache.get_or_fetch(short, ten, || value("v")).await.unwrap();
        assert_eq!(cache.len(), 2);
        wait(10.1).await;
        // With the value stored for `max_age` zero outside, stale since.
        assert!(cache.is_empty());
    });
}

#[tokio::test(start_paused = true)]
async fn a_sweep_logs_no_value() {
    let buffer = crate::telemetry::LogBuffer::default();
    let out = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || out.clone())
        .finish();
    // The runtime is this thread's: the sweeping task logs here.
    let _logging = tracing::subscriber::set_default(subscriber);
    let (cache, metrics) = cache(no_jitter());
    cache
        .get_or_fetch(key("shop/web", "db"), Some(Duration::from_secs(1)), || {
            value("hunter2-super-secret")
        })
        .await
        .unwrap();
    wait(1.1).await;
    assert_eq!(metrics.cache_expired.get(), 1);
    let printed = format!("{} {cache:?}", buffer.text());
    assert!(!printed.contains("hunter2"), "{printed}");
}
