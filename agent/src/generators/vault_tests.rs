use super::*;

#[test]
fn paths_are_plain_relative_vault_paths() {
    assert_eq!(
        check_path("/pki/issue/example-dot-com/").unwrap(),
        "pki/issue/example-dot-com"
    );
    for bad in [
        "",
        "/",
        "pki//issue",
        "pki/../sys/raw",
        "./pki",
        "pki/issue?x=1",
        "pki#x",
        "pki\\x",
        "pki/\nissue",
    ] {
        assert!(
            matches!(check_path(bad), Err(GeneratorError::Invalid(_))),
            "{bad:?}"
        );
    }
    assert!(check_path(&"a".repeat(MAX_PATH_LEN + 1)).is_err());
}

#[test]
fn methods_are_esos() {
    assert_eq!(Method::parse(None).unwrap(), Method::Get);
    assert_eq!(Method::parse(Some("LIST")).unwrap(), Method::List);
    assert!(Method::parse(Some("DELETE")).is_err());
    assert!(Method::parse(Some("post")).is_err());
}

#[test]
fn states_name_a_lease_or_an_accessor_checked() {
    assert!(matches!(
        target(&json!({"leaseId": "pki/issue/x/abc", "ttl": 30})).unwrap(),
        Target::Lease { id, ttl: Some(30) } if id == "pki/issue/x/abc"
    ));
    assert!(matches!(
        target(&json!({"accessor": "acc"})).unwrap(),
        Target::Token { ttl: None, .. }
    ));
    assert!(matches!(target(&json!({})).unwrap(), Target::Nothing));
    for bad in [
        json!({"leaseId": 7}),
        json!({"leaseId": "a b"}),
        json!({"accessor": "x".repeat(MAX_STATE_FIELD + 1)}),
    ] {
        assert!(
            matches!(target(&bad), Err(GeneratorError::Invalid(_))),
            "{bad}"
        );
    }
}

fn generator(method: Method, parameters: Value) -> VaultDynamic {
    VaultDynamic {
        client: Transport::new(
            reqwest::Client::new(),
            "http://127.0.0.1:1",
            vaultrs::api::EndpointMiddleware {
                token: "s.secret-token".into(),
                version: "v1".into(),
                wrap: None,
                namespace: None,
            },
        ),
        path: "pki/issue/web".into(),
        method,
        parameters: serde_json::from_value(parameters).unwrap(),
        result_type: VaultResultType::Data,
        allow_empty: false,
        metrics: std::sync::Arc::new(Metrics::new()),
    }
}

#[test]
fn posts_ask_for_a_short_ttl_unless_one_is_given() {
    let post = generator(Method::Post, json!({"common_name": "localhost"}));
    let body: Value = serde_json::from_slice(&post.request().unwrap().body.unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"common_name": "localhost", "ttl": DEFAULT_TTL})
    );
    let own = generator(Method::Put, json!({"ttl": "5m"}));
    let body: Value = serde_json::from_slice(&own.request().unwrap().body.unwrap()).unwrap();
    assert_eq!(body, json!({"ttl": "5m"}));
    let get = generator(Method::Get, json!({"a": "x y", "n": 3, "l": ["p", "q"]}));
    let call = get.request().unwrap();
    assert!(call.body.is_none());
    assert_eq!(
        call.query.as_deref(),
        Some("a=x+y&l=%5B%22p%22%2C%22q%22%5D&n=3")
    );
    assert!(
        generator(Method::List, json!({}))
            .request()
            .unwrap()
            .query
            .is_none()
    );
}

#[test]
fn debug_shows_no_token() {
    let g = generator(Method::Post, json!({}));
    let debug = format!("{g:?}");
    assert!(!debug.contains("secret-token"), "{debug}");
    assert!(debug.contains("pki/issue/web"), "{debug}");
}

#[tokio::test]
async fn an_unreachable_vault_names_the_path() {
    let g = generator(Method::Post, json!({}));
    let err = g.generate().await.unwrap_err().to_string();
    assert!(err.contains("POST pki/issue/web"), "{err}");
    assert!(!err.contains("secret-token"), "{err}");
    let err = g
        .cleanup(&json!({"leaseId": "pki/issue/web/abc"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sys/leases/revoke of lease pki/issue/web/abc"),
        "{err}"
    );
}
