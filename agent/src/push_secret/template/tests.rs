use std::time::Duration;

use super::*;
use crate::api::external_secret::{Template, TemplateMergePolicy};

const PASSWORD: &str = "tpl-unit-password-8812";

fn pool() -> Pool {
    Pool::new(1, Duration::from_secs(5)).unwrap()
}

fn source() -> BTreeMap<String, SecretBytes> {
    [("user", "app"), ("password", PASSWORD)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), SecretBytes::from(v)))
        .collect()
}

fn template(pairs: &[(&str, &str)], merge: Option<TemplateMergePolicy>) -> PushSecretTemplate {
    PushSecretTemplate {
        template: Template {
            data: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            merge_policy: merge,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn text(keys: &BTreeMap<String, SecretBytes>) -> BTreeMap<&str, &str> {
    keys.iter()
        .map(|(k, v)| (k.as_str(), std::str::from_utf8(v.expose()).unwrap()))
        .collect()
}

#[tokio::test]
async fn replace_keeps_only_the_template_keys_and_merge_adds_them() {
    let url = "'postgres://%s:%s@db'.format([secret.user, secret.password])";
    let t = template(&[("url", url)], None);
    let out = apply(&pool(), "shop", "db", Some(&t), source())
        .await
        .unwrap();
    let expected = format!("postgres://app:{PASSWORD}@db");
    assert_eq!(text(&out), BTreeMap::from([("url", expected.as_str())]));

    let t = template(
        &[("url", url), ("user", "secret.user.upperAscii()")],
        Some(TemplateMergePolicy::Merge),
    );
    let out = apply(&pool(), "shop", "db", Some(&t), source())
        .await
        .unwrap();
    assert_eq!(
        text(&out),
        BTreeMap::from([
            ("password", PASSWORD),
            ("url", expected.as_str()),
            ("user", "APP")
        ])
    );
}

#[tokio::test]
async fn no_template_or_one_without_keys_pushes_the_secret_as_it_is() {
    let out = apply(&pool(), "shop", "db", None, source()).await.unwrap();
    assert_eq!(out, source());
    let empty = template(&[], None);
    let out = apply(&pool(), "shop", "db", Some(&empty), source())
        .await
        .unwrap();
    assert_eq!(out, source());
}

#[tokio::test]
async fn an_error_names_the_push_secret_and_key_never_a_value() {
    for expression in [
        "int(secret.password)",
        "secret.password + secret.nothing",
        "pod.name",
        "secret.password.matches('(')",
    ] {
        let t = template(&[("bad", expression)], None);
        let err = apply(&pool(), "shop", "db", Some(&t), source())
            .await
            .unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(
            shown.starts_with("PushSecret shop/db: spec.template.data[\"bad\"]: "),
            "{shown}"
        );
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(!shown.contains("ExternalSecret"), "{shown}");
    }
}

#[tokio::test]
async fn the_evaluators_bounds_hold() {
    // An expression past the size limit is refused before it is parsed.
    let mut e = "secret.password".to_string();
    for _ in 0..12 {
        e = format!("[{e}, {e}].join()");
    }
    let t = template(&[("big", &e)], None);
    let err = apply(&pool(), "shop", "db", Some(&t), source())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TemplateError::Failed { key, .. } if key == "big"),
        "{err}"
    );
    assert!(!err.to_string().contains(PASSWORD));
}
