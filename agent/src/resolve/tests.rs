//! Planning and resolving: key order, precedence of sources, rewrites, find, and errors.

use regex::Regex;

use super::rewrite::replace_bounded;
use super::*;
use crate::api::external_secret::*;

pub(crate) fn ctx() -> Context {
    Context {
        namespace: "shop".into(),
        external_secret: "db".into(),
        store_kind: StoreKind::SecretStore,
        store_name: "fake".into(),
    }
}

fn spec(data: Vec<(&str, &str, Option<&str>)>, data_from: Vec<DataFrom>) -> ExternalSecretSpec {
    ExternalSecretSpec {
        secret_store_ref: Some(SecretStoreRef {
            name: "fake".into(),
            kind: StoreKind::SecretStore,
        }),
        refresh_interval: None,
        data: data
            .into_iter()
            .map(|(secret_key, key, property)| ExternalSecretData {
                source_ref: None,
                secret_key: secret_key.into(),
                remote_ref: RemoteRef {
                    key: key.into(),
                    property: property.map(String::from),
                    ..Default::default()
                },
            })
            .collect(),
        data_from,
        target: None,
        service_account_name: None,
        refresh_policy: None,
    }
}

fn extract(key: &str, rewrite: Vec<(&str, &str)>) -> DataFrom {
    DataFrom {
        source_ref: None,
        extract: Some(RemoteRef {
            key: key.into(),
            ..Default::default()
        }),
        find: None,
        rewrite: rewrite
            .into_iter()
            .map(|(s, t)| Rewrite {
                regexp: Some(RewriteRegexp {
                    source: s.into(),
                    target: t.into(),
                }),
            })
            .collect(),
    }
}

fn fetched(pairs: &[(&str, &str)]) -> Fetched {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                RemoteKey {
                    key: k.to_string(),
                    version: None,
                },
                SecretBytes::from(*v),
            )
        })
        .collect()
}

fn text(m: &BTreeMap<String, SecretBytes>) -> Vec<(String, String)> {
    m.iter()
        .map(|(k, v)| (k.clone(), String::from_utf8(v.expose().to_vec()).unwrap()))
        .collect()
}

#[test]
fn remote_keys_are_deduplicated_in_first_use_order() {
    let s = spec(
        vec![
            ("a", "k1", Some("x")),
            ("b", "k2", None),
            ("c", "k1", Some("y")),
        ],
        vec![extract("k3", vec![])],
    );
    let keys: Vec<_> = plan(&ctx(), &s)
        .unwrap()
        .keys
        .into_iter()
        .map(|k| k.key)
        .collect();
    assert_eq!(keys, ["k3", "k1", "k2"]);
}

#[test]
fn many_remote_keys_are_deduplicated_in_first_use_order_too() {
    // Past the few keys compared one by one, a set does it: same result.
    let names: Vec<String> = (0..40).map(|i| format!("k{}", i % 25)).collect();
    let data = names
        .iter()
        .map(|k| (k.as_str(), k.as_str(), None))
        .collect();
    let keys: Vec<_> = plan(&ctx(), &spec(data, vec![]))
        .unwrap()
        .keys
        .into_iter()
        .map(|k| k.key)
        .collect();
    let expected: Vec<String> = (0..25).map(|i| format!("k{i}")).collect();
    assert_eq!(keys, expected);
}

#[test]
fn fetched_values_are_found_by_key_and_version_and_the_later_of_two_wins() {
    let key = |k: &str, v: Option<&str>| RemoteKey {
        key: k.into(),
        version: v.map(String::from),
    };
    let at = |k: &str, v: Option<&str>| RemoteRef {
        key: k.into(),
        version: v.map(String::from),
        ..Default::default()
    };
    let pairs = [
        (key("b", None), SecretBytes::from("b-first")),
        (key("a", Some("2")), SecretBytes::from("a2")),
        (key("b", None), SecretBytes::from("b-later")),
        (key("a", None), SecretBytes::from("a")),
    ];
    let f: Fetched = pairs.iter().cloned().collect();
    let value =
        |f: &Fetched, r: &RemoteRef| f.get(r).map(|(k, v)| (k.clone(), v.expose().to_vec()));
    assert_eq!(
        value(&f, &at("b", None)),
        Some((key("b", None), b"b-later".to_vec()))
    );
    assert_eq!(
        value(&f, &at("a", Some("2"))),
        Some((key("a", Some("2")), b"a2".to_vec()))
    );
    assert_eq!(
        value(&f, &at("a", None)),
        Some((key("a", None), b"a".to_vec()))
    );
    assert_eq!(value(&f, &at("a", Some("1"))), None);
    assert_eq!(value(&f, &at("c", None)), None);
    let more = [
        (key("c", None), SecretBytes::from("c")),
        (key("a", None), SecretBytes::from("a-again")),
    ];
    let f: Fetched = pairs.into_iter().chain(more).collect();
    assert_eq!(
        value(&f, &at("c", None)),
        Some((key("c", None), b"c".to_vec()))
    );
    assert_eq!(
        value(&f, &at("a", None)),
        Some((key("a", None), b"a-again".to_vec()))
    );
    assert_eq!(f.values.len(), 4);
}

#[test]
fn data_overrides_data_from_and_later_sources_override_earlier() {
    let s = spec(
        vec![("user", "single", None)],
        vec![extract("first", vec![]), extract("second", vec![])],
    );
    let f = fetched(&[
        ("first", r#"{"user":"one","host":"h1","port":5432}"#),
        ("second", r#"{"host":"h2","nested":{"a":1}}"#),
        ("single", "root"),
    ]);
    let out = text(&entries(&ctx(), &s, &f, None).unwrap());
    assert_eq!(
        out,
        [
            ("host".to_string(), "h2".to_string()),
            ("nested".into(), r#"{"a":1}"#.into()),
            ("port".into(), "5432".into()),
            ("user".into(), "root".into()),
        ]
    );
}

#[test]
fn repeated_sources_render_as_one_and_order_still_decides() {
    let f = fetched(&[
        ("first", r#"{"host":"h1","port":5432}"#),
        ("second", r#"{"host":"h2"}"#),
    ]);
    let render =
        |sources: Vec<DataFrom>| text(&entries(&ctx(), &spec(vec![], sources), &f, None).unwrap());
    let once = render(vec![extract("second", vec![]), extract("first", vec![])]);
    let repeated = render(vec![
        extract("first", vec![]),
        extract("second", vec![]),
        extract("first", vec![]),
        extract("second", vec![]),
        extract("first", vec![]),
    ]);
    assert_eq!(repeated, once, "the last copy of each source decides");
    assert_eq!(once[0], ("host".to_string(), "h1".to_string()));
}

#[test]
fn rewrite_steps_apply_in_order_to_that_source_only() {
    let s = spec(
        vec![],
        vec![
            extract("a", vec![("^db_", ""), ("(.*)", "DB_$1")]),
            extract("b", vec![]),
        ],
    );
    let f = fetched(&[("a", r#"{"db_user":"u"}"#), ("b", r#"{"db_pass":"p"}"#)]);
    let names: Vec<_> = entries(&ctx(), &s, &f, None).unwrap().into_keys().collect();
    assert_eq!(names, ["DB_user", "db_pass"]);
}

#[test]
fn errors_name_namespace_external_secret_store_and_key_but_no_value() {
    let s = spec(vec![("p", "db", Some("password"))], vec![]);
    let f = fetched(&[("db", r#"{"user":"hunter2-value"}"#)]);
    let err = entries(&ctx(), &s, &f, None).unwrap_err().to_string();
    assert_eq!(
        err,
        "namespace \"shop\", ExternalSecret \"db\", SecretStore \"fake\", remote key \"db\": \
             property \"password\" not found"
    );
    let s = spec(vec![], vec![extract("plain", vec![])]);
    let f = fetched(&[("plain", "hunter2-value")]);
    let err = entries(&ctx(), &s, &f, None).unwrap_err().to_string();
    assert!(
        err.contains("needs a JSON object") && !err.contains("hunter2"),
        "{err}"
    );
}

fn find(regexp: &str, rewrite: Vec<(&str, &str)>) -> DataFrom {
    DataFrom {
        source_ref: None,
        find: Some(FindRef {
            name: Some(FindName {
                regexp: regexp.into(),
            }),
            ..Default::default()
        }),
        rewrite: extract("unused", rewrite).rewrite,
        ..Default::default()
    }
}

#[test]
fn find_results_become_entries_after_rewrite_and_data_still_wins() {
    let s = spec(
        vec![("db", "single", None)],
        vec![find("^prod/shop/", vec![("^prod/shop/", "")])],
    );
    let plan = plan(&ctx(), &s).unwrap();
    assert_eq!(plan.finds.len(), 1);
    let query = &plan.finds[0].1;
    assert!(query.matches("prod/shop/db") && !query.matches("dev/shop/db"));
    let mut f = fetched(&[("single", "from-data")]);
    f.insert_found(
        0,
        vec![
            ("prod/shop/api".into(), SecretBytes::from("a")),
            ("prod/shop/db".into(), SecretBytes::from("from-find")),
        ],
    );
    assert_eq!(
        text(&entries(&ctx(), &s, &f, None).unwrap()),
        [
            ("api".to_string(), "a".to_string()),
            ("db".into(), "from-data".into())
        ]
    );
}

#[test]
fn a_bad_find_regexp_names_the_entry() {
    let s = spec(vec![], vec![find("(unclosed", vec![])]);
    let err = plan(&ctx(), &s).unwrap_err().to_string();
    assert!(
        err.contains("spec.dataFrom[0].find.name: invalid regexp \"(unclosed\""),
        "{err}"
    );
}

#[test]
fn rewrites_are_bounded_while_names_are_built() {
    let doubling = vec![("^(.*)$", "$1$1"); 16];
    let s = spec(vec![], vec![extract("a", doubling)]);
    let f = fetched(&[("a", r#"{"name":"v"}"#)]);
    let err = entries(&ctx(), &s, &f, None).unwrap_err();
    assert!(
        matches!(err, ResolveError::Bound { .. })
            && err.to_string().contains("grows beyond 1024 bytes"),
        "{err}"
    );
    assert_eq!(
        replace_bounded(&Regex::new("b").unwrap(), "abcb", "[$0]", 100).as_deref(),
        Some("a[b]c[b]")
    );
    assert_eq!(
        replace_bounded(&Regex::new("x*").unwrap(), "abc", "yyyy", 10),
        None
    );
}
