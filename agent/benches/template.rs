//! What the compiled-template cache saves on a republish that is due: `template::apply` of a
//! 5-key template over 5 resolved values, with every source already compiled (the cache hit of
//! every refresh after the first) against sources seen for the first time (the parse, check and
//! instrumentation every refresh paid before the cache). Both series run in one process, on the
//! calling thread, interleaved, so they share the machine's state.
//!
//! ```sh
//! cargo bench -p latchkey --bench template                          # 2,000 of each (release)
//! LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --bench template    # 50 of each (debug, CI)
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use latchkey::api::StoreKind;
use latchkey::api::external_secret::Template;
use latchkey::resolve::Context;
use latchkey::resolve::template::{TemplatePod, apply};
use latchkey::secret::SecretBytes;

/// The five templates of a typical database ExternalSecret; `{n}` makes a source unique.
const SOURCES: [(&str, &str); 5] = [
    (
        "url",
        "'postgres://%s:%s@%s/shop{n}'.format([secret.user, secret.password, secret.host])",
    ),
    ("user", "secret.user + '{n}'"),
    ("password", "secret.password + '{n}'"),
    ("config", "json.parse(secret.config).host + '{n}'"),
    (
        "auth",
        "base64.encode(secret.user + ':' + secret.password + '{n}')",
    ),
];

fn template(unique: Option<usize>) -> Template {
    let n = unique.map(|i| format!("#{i}")).unwrap_or_default();
    Template {
        data: SOURCES
            .iter()
            .map(|(key, source)| (key.to_string(), source.replace("{n}", &n)))
            .collect(),
        merge_policy: None,
        ..Default::default()
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn main() {
    let quick = std::env::var("LATCHKEY_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let count = if quick { 50 } else { 2000 };
    let ctx = Context {
        namespace: "shop".into(),
        external_secret: "db".into(),
        store_kind: StoreKind::SecretStore,
        store_name: "vault".into(),
    };
    let pod = TemplatePod {
        namespace: "shop".into(),
        name: "web-0".into(),
        service_account: "web".into(),
    };
    let values: BTreeMap<String, SecretBytes> = [
        ("user", "shop"),
        ("password", "correct-horse-battery-staple"),
        ("host", "db.internal"),
        ("config", r#"{"host": "db.internal", "port": 5432}"#),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), SecretBytes::from(v)))
    .collect();
    let cached = template(None);
    let run = |t: &Template| {
        let start = Instant::now();
        let out = apply(&ctx, t, values.clone(), Some(&pod)).expect("the templates evaluate");
        assert_eq!(out.len(), SOURCES.len());
        start.elapsed()
    };
    run(&cached);
    let (mut hits, mut misses) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        hits.push(run(&cached));
        misses.push(run(&template(Some(i))));
    }
    let (hit, miss) = (median(hits), median(misses));
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("template bench: {count} due republishes of a 5-key template each way, {build} build");
    println!(
        "  compiled programs reused (cache hit)   median {:>9.1} us",
        hit.as_secs_f64() * 1e6
    );
    println!(
        "  compiled every time (before the cache) median {:>9.1} us",
        miss.as_secs_f64() * 1e6
    );
    println!(
        "  saved per due republish: {:.1} us ({:.1}x faster)",
        (miss.saturating_sub(hit)).as_secs_f64() * 1e6,
        miss.as_secs_f64() / hit.as_secs_f64().max(1e-9)
    );
    if quick || cfg!(debug_assertions) {
        println!("  (quick mode or debug build: numbers only show that the harness works)");
    }
}
