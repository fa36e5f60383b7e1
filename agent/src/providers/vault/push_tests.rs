//! Unit tests of the KV v2 pusher: errors read as the operator needs them, and only JSON objects
//! are whole KV values.

use super::*;

fn api(code: u16, message: &str) -> ClientError {
    ClientError::APIError {
        code,
        errors: vec![message.into()],
    }
}

#[test]
fn a_failed_check_and_set_is_a_change_naming_the_key() {
    let e = api(
        400,
        "check-and-set parameter did not match the current version",
    );
    let err = failed(e, "update", "secret/data/prod/db", "prod/db", Some(3));
    assert!(
        matches!(err, PushError::Changed { ref version, .. } if version == "3"),
        "{err}"
    );
    assert_eq!(err.reason(), "ConcurrentWrite");
    let text = err.to_string();
    assert!(text.contains("\"prod/db\""), "{text}");
    assert!(text.contains("the next push tries again"), "{text}");
    // Another 400 of the same write is not a race.
    let err = failed(api(400, "invalid"), "update", "p", "prod/db", Some(3));
    assert!(matches!(err, PushError::Backend(_)), "{err}");
}

#[test]
fn a_refusal_names_the_path_and_the_policy_needed() {
    let err = failed(
        api(403, "1 error occurred:\n\t* permission denied\n\n"),
        "update",
        "secret/data/prod/db",
        "prod/db",
        Some(0),
    );
    let text = err.to_string();
    assert!(
        text.contains(
            "Vault denied update on \"secret/data/prod/db\": 1 error occurred: * permission denied"
        ),
        "{text}"
    );
    assert!(text.contains("metadata/*"), "{text}");
    let err = unmarked(
        failed(api(403, "permission denied"), "update", "m", "k", None),
        1,
    );
    assert!(err.to_string().contains("created but not marked"), "{err}");
}

#[test]
fn only_a_json_object_is_a_whole_kv_value() {
    assert!(whole("k", &SecretBytes::from(r#"{"a": {"b": 1}}"#)).is_ok());
    for bad in ["plain text", "[1]", "\"s\"", "{"] {
        let err = whole("k", &SecretBytes::from(bad)).unwrap_err();
        assert!(matches!(err, PushError::CannotPush { .. }), "{err}");
        assert!(!err.to_string().contains(bad), "{err}");
    }
}
