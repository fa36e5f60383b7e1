//! End-to-end tests of the templates: every case goes through [`apply`] (compile, check,
//! instrument, evaluate, output), so they cover the submodules together and are kept here.

use base64::Engine;
use base64::prelude::BASE64_STANDARD;

use super::limits::nesting;
use super::*;
use crate::api::StoreKind;
use crate::api::external_secret::TemplateMergePolicy::{Merge, Replace};

/// Every secret value below contains this; no error may.
const MARK: &str = "hunter2";
const BINARY: &[u8] = &[0xff, 0xfe, b'h', b'u', b'n', b't', b'e', b'r', b'2', 0x00];

fn ctx() -> Context {
    Context {
        namespace: "shop".into(),
        external_secret: "db".into(),
        store_kind: StoreKind::SecretStore,
        store_name: "fake".into(),
    }
}

fn pod() -> TemplatePod {
    TemplatePod {
        namespace: "shop".into(),
        name: "web-0".into(),
        service_account: "web".into(),
    }
}

fn resolved() -> BTreeMap<String, SecretBytes> {
    let entries: [(&str, Vec<u8>); 10] = [
        ("username", b"hunter2-template-user".to_vec()),
        ("password", b"hunter2-template-secret".to_vec()),
        (
            "config",
            br#"{"host":"db.internal","port":5432,"token":"hunter2-template-json","hosts":["a","b"]}"#
                .to_vec(),
        ),
        ("binary", BINARY.to_vec()),
        // 20 KB: splits into characters within the value limit.
        ("medium", format!("{MARK}{}", "m".repeat(20_000 - MARK.len())).into_bytes()),
        // 300 KB: four of them exceed the value limit.
        ("large", format!("{MARK}{}", "l".repeat(300_000 - MARK.len())).into_bytes()),
        (
            "deep",
            format!("{}\"{MARK}\"{}", "[".repeat(200), "]".repeat(200)).into_bytes(),
        ),
        ("tls.crt", b"hunter2-template-cert".to_vec()),
        ("empty", Vec::new()),
        ("pct", b"hunter2-%q".to_vec()),
    ];
    entries
        .into_iter()
        .map(|(k, v)| (k.to_owned(), SecretBytes::new(v)))
        .collect()
}

fn template(data: &[(&str, &str)], merge_policy: Option<TemplateMergePolicy>) -> Template {
    Template {
        data: data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        merge_policy,
        ..Default::default()
    }
}

/// Evaluates one template as key `out`, with the pod known.
fn eval(expr: &str) -> Result<Vec<u8>, String> {
    eval_with(expr, Some(&pod()))
}

fn eval_with(expr: &str, pod: Option<&TemplatePod>) -> Result<Vec<u8>, String> {
    apply(&ctx(), &template(&[("out", expr)], None), resolved(), pod)
        .map(|mut m| m.remove("out").unwrap().expose().to_vec())
        .map_err(|e| e.to_string())
}

/// Runs `f` on a thread with the 2 MiB stack of a Tokio worker.
fn on_worker_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn assert_clean(expr: &str, err: &str) {
    assert!(
        err.starts_with(
            "namespace \"shop\", ExternalSecret \"db\", SecretStore \"fake\": \
             target.template.data[\"out\"]: "
        ),
        "{expr}: {err}"
    );
    assert!(!err.contains(MARK), "{expr}: error shows a value: {err}");
    assert!(!err.contains("\u{fffd}"), "{expr}: {err}");
}

#[test]
fn templates_produce_the_expected_output() {
    let b64 = |b: &[u8]| BASE64_STANDARD.encode(b);
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "the DESIGN example",
            "'postgres://%s:%s@db/shop'.format([secret.username, secret.password])",
            b"postgres://hunter2-template-user:hunter2-template-secret@db/shop".to_vec(),
        ),
        (
            "format with several clauses",
            "'%s|%d|%d|%.2f|%f|%x|%X|%x|%%|%s|%s|%s|%s'.format(['a', 42, 7u, 3.14159, 1, \
             255, 'hi', -255, true, [1, 'b', null], {'b': 2, 'a': 1.5}, b'by'])",
            b"a|42|7|3.14|1.000000|ff|6869|-ff|%|true|[1, b, null]|{a: 1.5, b: 2}|by".to_vec(),
        ),
        (
            "format without clauses",
            "'plain'.format([])",
            b"plain".to_vec(),
        ),
        (
            "base64 of a string",
            "base64.encode(secret.password)",
            b64(b"hunter2-template-secret").into_bytes(),
        ),
        (
            "base64 of bytes",
            "base64.encode(secret.binary)",
            b64(BINARY).into_bytes(),
        ),
        (
            "base64 round trip",
            "string(base64.decode(base64.encode(secret.password))) == secret.password",
            b"true".to_vec(),
        ),
        (
            "base64 decode to bytes",
            "base64.decode('aGk')",
            b"hi".to_vec(),
        ),
        (
            "json field access",
            "json.parse(secret.config).host",
            b"db.internal".to_vec(),
        ),
        (
            "json numbers are ints",
            "json.parse(secret.config).port + 1",
            b"5433".to_vec(),
        ),
        (
            "json of bytes, formatted",
            "'%s:%d'.format([json.parse(bytes(secret.config)).host, \
             json.parse(secret.config).port])",
            b"db.internal:5432".to_vec(),
        ),
        (
            "json list through a comprehension",
            "json.parse(secret.config).hosts.map(h, h + ':5432').join(',')",
            b"a:5432,b:5432".to_vec(),
        ),
        (
            "pod fields",
            "pod.namespace + '/' + pod.name + '/' + pod.serviceAccountName",
            b"shop/web-0/web".to_vec(),
        ),
        (
            "has() on pod",
            "has(pod.name) && !has(pod.uid)",
            b"true".to_vec(),
        ),
        (
            "non-UTF-8 secret as bytes",
            "secret.binary",
            BINARY.to_vec(),
        ),
        ("its type", "type(secret.binary) == bytes", b"true".to_vec()),
        ("bytes size", "size(secret.binary)", b"10".to_vec()),
        (
            "index with a dotted key",
            "secret['tls.crt']",
            b"hunter2-template-cert".to_vec(),
        ),
        ("has on secret", "has(secret.username)", b"true".to_vec()),
        ("in on secret", "'password' in secret", b"true".to_vec()),
        ("empty value", "secret.empty", b"".to_vec()),
        (
            "matches",
            "secret.username.matches('^hunter2-[a-z-]+$')",
            b"true".to_vec(),
        ),
        (
            "matches as a function",
            "matches(secret.username, 'x$')",
            b"false".to_vec(),
        ),
        (
            "conditional",
            "secret.username.startsWith('hunter2') ? 'yes' : 'no'",
            b"yes".to_vec(),
        ),
        ("int", "1 + 2", b"3".to_vec()),
        ("uint", "2u", b"2".to_vec()),
        ("double", "1.5", b"1.5".to_vec()),
        ("bool", "1 < 2", b"true".to_vec()),
        (
            "map as JSON with sorted keys",
            "{'b': [1, 2.5], 'a': 'x', 'c': {'z': null, 'y': b'hi'}}",
            br#"{"a":"x","b":[1,2.5],"c":{"y":"aGk=","z":null}}"#.to_vec(),
        ),
        (
            "list as JSON",
            "[1, 'two', true]",
            br#"[1,"two",true]"#.to_vec(),
        ),
        (
            "trim and lowerAscii",
            "'  AbC  '.trim().lowerAscii()",
            b"abc".to_vec(),
        ),
        ("upperAscii", "'abc'.upperAscii()", b"ABC".to_vec()),
        (
            "split and join",
            "'a,b,c'.split(',').join('-')",
            b"a-b-c".to_vec(),
        ),
        (
            "join without separator",
            "['x', 'y'].join()",
            b"xy".to_vec(),
        ),
        (
            "split into characters",
            "'abc'.split('')",
            br#"["a","b","c"]"#.to_vec(),
        ),
        ("replace", "'abcb'.replace('b', 'X')", b"aXcX".to_vec()),
        (
            "replace the empty string",
            "'ab'.replace('', '-')",
            b"-a-b-".to_vec(),
        ),
        ("map", "[1, 2, 3].map(x, x * 2)", b"[2,4,6]".to_vec()),
        (
            "map with filter",
            "[1, 2, 3].map(x, x > 1, x * 10)",
            b"[20,30]".to_vec(),
        ),
        ("filter", "[1, 2, 3].filter(x, x > 1)", b"[2,3]".to_vec()),
        ("all", "[1, 2, 3].all(x, x > 0)", b"true".to_vec()),
        ("exists", "[1, 2, 3].exists(x, x > 2)", b"true".to_vec()),
        (
            "exists_one",
            "[1, 2, 3].exists_one(x, x > 2)",
            b"true".to_vec(),
        ),
        (
            "exists absorbs an error, as in CEL",
            "[1, 2].exists(x, x == 2 || secret.missing == 'a')",
            b"true".to_vec(),
        ),
        (
            "two nested comprehensions",
            "[[1, 2], [3]].map(l, l.map(x, x + 1))",
            b"[[2,3],[4]]".to_vec(),
        ),
        (
            "keys of a map",
            "secret.filter(k, k.startsWith('user'))",
            br#"["username"]"#.to_vec(),
        ),
        (
            "comment and raw string",
            "// a comment with ( and '\nr'\\d(' + \"\"\"[\"\"\"",
            b"\\d([".to_vec(),
        ),
    ];
    for (name, expr, want) in cases {
        let got = eval(expr).unwrap_or_else(|e| panic!("{name}: {expr}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{name}: {expr}"
        );
    }
}

#[test]
fn errors_name_the_key_and_never_a_value() {
    let cases: [(&str, &str, &str); 33] = [
        (
            "invalid pattern from a value",
            "'a'.matches(secret.password + '(')",
            "matches: not a valid regular expression",
        ),
        (
            "matches on a non-string",
            "secret.binary.matches('a')",
            "matches: expected a string, got a bytes",
        ),
        (
            "parse error",
            "secret.password +",
            "does not parse: line 1, column",
        ),
        ("unterminated string", "'abc", "does not parse"),
        (
            "unknown variable",
            "nope + 'x'",
            "unknown variable or function \"nope\"",
        ),
        (
            "unknown function",
            "frob(secret.password)",
            "unknown variable or function \"frob\"",
        ),
        ("unknown method", "secret.password.frob()", "\"frob\""),
        ("missing key", "secret.missing", "no such key \"missing\""),
        (
            "missing key computed from a value",
            "secret[secret.password]",
            "no such key (computed at run time, so not shown)",
        ),
        (
            "type error",
            "secret.password + 1",
            "operator \"add\" does not apply to string and int",
        ),
        (
            "comparison",
            "secret.password < 1",
            "takes arguments of type (string, int)",
        ),
        (
            "failing conversion",
            "int(secret.password)",
            "details are not shown",
        ),
        (
            "bytes that are not UTF-8",
            "string(secret.binary)",
            "details are not shown",
        ),
        (
            "bad base64",
            "base64.decode(secret.password)",
            "not valid base64",
        ),
        (
            "bad JSON",
            "json.parse(secret.password)",
            "json.parse: the input is not valid JSON",
        ),
        (
            "JSON nested too deeply",
            "json.parse(secret.deep)",
            "json.parse: the input nests JSON objects and arrays deeper than 32 levels",
        ),
        ("null", "json.parse('null')", "the result is null"),
        (
            "null in JSON",
            "json.parse(secret.config).missing",
            "no such key \"missing\"",
        ),
        (
            "a type",
            "type(secret.password)",
            "cannot be written to a file",
        ),
        (
            "%d of a string",
            "'%d'.format([secret.password])",
            "%d needs an int or uint, got a string",
        ),
        (
            "too few arguments",
            "'%s %s'.format([secret.password])",
            "clause 2 has no argument",
        ),
        (
            "unknown clause",
            "'%q'.format([secret.password])",
            "unsupported clause",
        ),
        (
            "clause from a value",
            "secret.pct.format([1])",
            "format: unsupported clause",
        ),
        (
            "%s of non-UTF-8 bytes",
            "'%s'.format([secret.binary])",
            "not UTF-8",
        ),
        (
            "division by zero",
            "size(secret.password) / 0",
            "division by zero",
        ),
        (
            "overflow",
            "9223372036854775807 + size(secret.password)",
            "integer overflow",
        ),
        (
            "index out of bounds",
            "[secret.password][3]",
            "out of bounds",
        ),
        (
            "duplicate key",
            "{secret.password: 1, secret.password: 2}",
            "repeats a key",
        ),
        (
            "join of non-strings",
            "[secret.password, 1].join()",
            "join: expected a string, got a int",
        ),
        ("NaN in JSON", "[0.0 / 0.0]", "JSON cannot hold"),
        (
            "map key type",
            "{[secret.password]: 1}",
            "cannot be a map key",
        ),
        (
            "wrong method target",
            "secret.password.join()",
            "type (string)",
        ),
        (
            "equality type error",
            "secret.password.startsWith(1)",
            "(string, int)",
        ),
    ];
    for (name, expr, want) in cases {
        let err = eval(expr).map(|v| String::from_utf8_lossy(&v).into_owned());
        let err = err.expect_err(&format!("{name}: {expr} succeeded"));
        assert_clean(expr, &err);
        assert!(err.contains(want), "{name}: {expr}: {err}");
    }
}

#[test]
fn pod_is_absent_without_a_pod() {
    let err = eval_with("pod.name", None).unwrap_err();
    assert_clean("pod.name", &err);
    assert!(err.contains("only available when a pod mounts"), "{err}");
    assert_eq!(
        eval_with("secret.username", None).unwrap(),
        b"hunter2-template-user"
    );
}

#[test]
fn bounds_are_enforced() {
    let long = format!("'{}'", "a".repeat(MAX_EXPRESSION_BYTES));
    let parens = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
    let lists = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let parens_33 = format!("{}1{}", "(".repeat(33), ")".repeat(33));
    let lists_33 = format!("{}{}", "[".repeat(33), "]".repeat(33));
    let maps_33 = format!("{}1{}", "{1: ".repeat(33), "}".repeat(33));
    let calls_33 = format!("{}1{}", "int(".repeat(33), ")".repeat(33));
    let ternaries = format!("{}1{}", "true ? ".repeat(33), " : 2".repeat(33));
    let concat = vec!["'a'"; 1000].join("+");
    let selects = format!("secret{}", ".a".repeat(2000));
    let indexes = format!("[1]{}", "[0]".repeat(1300));
    let methods = format!("'a'{}", ".trim()".repeat(580));
    let large4 = "secret.large + secret.large + secret.large + secret.large";
    let replaces = format!("'a'{}", ".replace('a', 'aa')".repeat(30));
    let cases: Vec<(&str, String, &str)> = vec![
        ("too long", long, "more than the limit of 4096"),
        (
            "10,000 nested parentheses",
            parens.clone(),
            "more than the limit of 4096",
        ),
        (
            "10,000 nested lists",
            lists.clone(),
            "more than the limit of 4096",
        ),
        (
            "33 nested parentheses",
            parens_33,
            "nests brackets and conditionals more than 32",
        ),
        (
            "33 nested lists",
            lists_33,
            "nests brackets and conditionals more than 32",
        ),
        (
            "33 nested maps",
            maps_33,
            "nests brackets and conditionals more than 32",
        ),
        (
            "33 nested calls",
            calls_33,
            "nests brackets and conditionals more than 32",
        ),
        (
            "33 nested conditionals",
            ternaries,
            "nests brackets and conditionals more than 32",
        ),
        ("long operator chain", concat, "nested more than 64 deep"),
        ("long select chain", selects, "nested more than 64 deep"),
        ("long index chain", indexes, "nested more than 64 deep"),
        ("long method chain", methods, "nested more than 64 deep"),
        (
            "three nested comprehensions",
            "[1].map(a, [1].map(b, [1].map(c, c)))".into(),
            "comprehensions (map, filter, all, exists, exists_one) are nested more than 2",
        ),
        (
            "comprehension in a comprehension's range",
            "[1].all(a, [1].map(b, b).exists(c, [c].all(d, true)))".into(),
            "nested more than 2",
        ),
        (
            "huge output via format",
            "'%x%x'.format([secret.large, secret.large])".into(),
            "format: the result would be larger than 1048576 bytes",
        ),
        (
            "huge output via concatenation",
            large4.into(),
            "a value grew larger than the limit of 1048576 bytes",
        ),
        (
            "huge list",
            "[secret.large, secret.large, secret.large, secret.large]".into(),
            "a value grew larger than the limit of 1048576 bytes",
        ),
        (
            "doubling by replace",
            replaces,
            "replace: the result would be larger than 1048576 bytes",
        ),
        (
            "amplification by join",
            "secret.medium.split('').join(secret.large)".into(),
            "join: the result would be larger",
        ),
        (
            "amplification by base64",
            "base64.encode(base64.encode(base64.encode(base64.encode(base64.encode(secret.large)))))".into(),
            "larger than",
        ),
        (
            "split into too many parts",
            "secret.large.split('')".into(),
            "split: the result would be larger",
        ),
        (
            "costly regular expression (charged by its compiled size)",
            "secret.large.matches('[a-z]{2000}x')".into(),
            "exceeded the cost budget",
        ),
        (
            "regular expression too large to compile",
            "secret.large.matches(secret.medium)".into(),
            "compiles to more than 262144 bytes",
        ),
        (
            "one costly pattern called many times",
            "secret.medium.split('').filter(c, secret.large.matches('[a-f]+[0-9]x')).size()"
                .into(),
            "exceeded the cost budget",
        ),
        (
            "quadratic comprehension",
            "secret.medium.split('').map(c, secret.medium).size()".into(),
            "exceeded the cost budget of 33554432",
        ),
        (
            "nested comprehensions over a large range",
            "secret.medium.split('').all(a, secret.medium.split('').exists(b, b == a))".into(),
            "exceeded the cost budget",
        ),
        (
            "a bound is not swallowed by ||",
            "secret.medium.split('').map(c, secret.medium).size() > 0 || true".into(),
            "exceeded the cost budget",
        ),
    ];
    for (name, expr, want) in cases {
        let shown = expr.chars().take(80).collect::<String>();
        let err = on_worker_stack(move || eval(&expr).map(|v| v.len()))
            .expect_err(&format!("{name}: {shown} succeeded"));
        assert_clean(&shown, &err);
        assert!(err.contains(want), "{name}: {shown}: {err}");
    }
    // The lexical count sees the 10,000 levels without parsing anything.
    assert!(nesting(&parens) > MAX_NESTING && nesting(&lists) > MAX_NESTING);
    assert_eq!(nesting("'((((' + \"[[\" + r'\\' + '''{{'''"), 0);
    assert_eq!(nesting("f([a ? b : c, {1: (d)}])"), 5);
}

#[test]
fn templates_at_the_limits_evaluate_on_a_worker_stack() {
    let parens = format!("{}1{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
    let lists = format!("{}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
    let concat = vec!["secret.username"; 60].join(" + ");
    let unary = format!("{}true", "!".repeat(3000));
    let negations = format!("{}1", "-".repeat(3000));
    let (p, l, c) = on_worker_stack(move || {
        let _ = eval(&unary);
        let _ = eval(&negations);
        (eval(&parens), eval(&lists), eval(&concat))
    });
    assert_eq!(p.unwrap(), b"1");
    let l = String::from_utf8(l.unwrap()).unwrap();
    assert_eq!(
        l,
        format!("{}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING))
    );
    assert_eq!(c.unwrap().len(), 60 * "hunter2-template-user".len());
}

#[test]
fn the_budget_is_shared_by_all_keys_and_output_is_bounded_in_total() {
    // Each key measures ~30 x 300 KB = 9 MB: the fourth exceeds 32 MiB.
    let sizes = format!(
        "[{}].map(i, size(secret.large)).size()",
        vec!["1"; 30].join(",")
    );
    let data: Vec<(String, &str)> = (0..4).map(|i| (format!("k{i}"), sizes.as_str())).collect();
    let data: Vec<(&str, &str)> = data.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let err = apply(&ctx(), &template(&data, None), resolved(), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("target.template.data[\"k3\"]: evaluation exceeded the cost budget"),
        "{err}"
    );
    let three = "secret.large + secret.large + secret.large";
    let data: Vec<(String, &str)> = (0..5).map(|i| (format!("k{i}"), three)).collect();
    let data: Vec<(&str, &str)> = data.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let err = apply(&ctx(), &template(&data, None), resolved(), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data[\"k4\"]: the templates' output together exceeds 4194304 bytes"),
        "{err}"
    );
    assert!(!err.contains(MARK));
}

#[test]
fn indexing_does_not_measure_the_whole_map() {
    let mut big = resolved();
    for i in 0..4 {
        big.insert(format!("big{i}"), SecretBytes::new(vec![b'b'; 300_000]));
    }
    let run = |expr: &str| {
        apply(&ctx(), &template(&[("out", expr)], None), big.clone(), None)
            .map(|m| m["out"].expose().to_vec())
            .map_err(|e| e.to_string())
    };
    assert_eq!(run("secret['tls.crt']").unwrap(), b"hunter2-template-cert");
    assert_eq!(run("secret.username").unwrap(), b"hunter2-template-user");
    let err = run("size(secret)").unwrap_err();
    assert!(err.contains("a value grew larger than the limit"), "{err}");
}

#[test]
fn replace_and_merge_policies() {
    let data = [
        ("url", "secret.username + '@db'"),
        ("password", "'overridden'"),
    ];
    let keys = |policy| {
        let out = apply(&ctx(), &template(&data, policy), resolved(), None).unwrap();
        out.into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(v.expose()).into_owned()))
            .collect::<BTreeMap<_, _>>()
    };
    for policy in [None, Some(Replace)] {
        let out = keys(policy);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["password", "url"]);
        assert_eq!(out["url"], "hunter2-template-user@db");
        assert_eq!(out["password"], "overridden");
    }
    let out = keys(Some(Merge));
    assert_eq!(out.len(), resolved().len() + 1);
    assert_eq!(out["password"], "overridden");
    assert_eq!(out["url"], "hunter2-template-user@db");
    assert_eq!(out["username"], "hunter2-template-user");
}

#[test]
fn entries_applies_templates_end_to_end() {
    use crate::api::RemoteRef;
    use crate::api::external_secret::*;
    use crate::providers::RemoteKey;

    let spec = ExternalSecretSpec {
        secret_store_ref: Some(SecretStoreRef {
            name: "fake".into(),
            kind: StoreKind::SecretStore,
        }),
        refresh_interval: None,
        data: vec![ExternalSecretData {
            source_ref: None,
            secret_key: "password".into(),
            remote_ref: RemoteRef {
                key: "prod/db".into(),
                property: Some("password".into()),
                ..Default::default()
            },
        }],
        data_from: vec![DataFrom {
            source_ref: None,
            extract: Some(RemoteRef {
                key: "prod/app".into(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        target: Some(Target {
            template: Some(template(
                &[
                    (
                        "DATABASE_URL",
                        "'postgres://%s:%s@db/%s'.format([secret.username, \
                         secret.password, pod.namespace])",
                    ),
                    ("missing", "secret.nope"),
                ],
                None,
            )),
            ..Default::default()
        }),
        service_account_name: None,
        refresh_policy: None,
    };
    let fetched: super::super::Fetched = [
        ("prod/db", r#"{"password":"hunter2-e2e"}"#),
        ("prod/app", r#"{"username":"app"}"#),
    ]
    .into_iter()
    .map(|(k, v)| {
        (
            RemoteKey {
                key: k.into(),
                version: None,
            },
            SecretBytes::from(v),
        )
    })
    .collect();
    let err = super::super::entries(&ctx(), &spec, &fetched, Some(&pod()))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "namespace \"shop\", ExternalSecret \"db\", SecretStore \"fake\": \
         target.template.data[\"missing\"]: no such key \"nope\""
    );
    let mut spec = spec;
    if let Some(t) = spec.target.as_mut().and_then(|t| t.template.as_mut()) {
        t.data.remove("missing");
    }
    let out = super::super::entries(&ctx(), &spec, &fetched, Some(&pod())).unwrap();
    assert_eq!(out.keys().collect::<Vec<_>>(), ["DATABASE_URL"]);
    assert_eq!(
        out["DATABASE_URL"].expose(),
        b"postgres://app:hunter2-e2e@db/shop"
    );
    let err = super::super::entries(&ctx(), &spec, &fetched, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"DATABASE_URL\"]: unknown variable \"pod\""),
        "{err}"
    );
}

/// `json.parse` of a value of 40,000 tiny keys (760 KB, under the 1 MiB value limit) built a
/// tree of ~6 MB before its size was measured; the keys are now counted first and the parse
/// refused, naming no key or value.
#[test]
fn json_parse_counts_keys_before_building() {
    let members: Vec<String> = (0..40_000)
        .map(|i| format!("\"k{i}\":\"hunter2\""))
        .collect();
    let mut values = resolved();
    values.insert(
        "many".into(),
        SecretBytes::from(format!("{{{}}}", members.join(","))),
    );
    let err = apply(
        &ctx(),
        &template(&[("out", "string(json.parse(secret.many))")], None),
        values,
        Some(&pod()),
    )
    .unwrap_err()
    .to_string();
    assert_clean("json.parse(secret.many)", &err);
    assert!(
        err.contains("json.parse: the input holds more than 10000 JSON keys"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}
