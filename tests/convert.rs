//! `latchkey convert`: golden tests over the real binary. Each case converts input files from
//! `tests/convert/` and compares stdout with `<case>.golden.yaml`, stderr with `<case>.stderr`
//! and the exit code with the table. `LATCHKEY_BLESS=1` rewrites the golden files instead.
//!
//! Every golden output must also load with the agent's strict manifest loader and pass its
//! validation, and no input file may change.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use latchkey::api::cluster_external_secret::ClusterExternalSecret;
use latchkey::api::push_secret::PushSecret;
use latchkey::api::validate;
use latchkey::api::{ClusterSecretStore, ExternalSecret, SecretStore, StoreKind};
use latchkey::catalog::ManifestCatalog;

/// One run of the binary.
struct Case {
    /// Golden file stem.
    name: &'static str,
    /// Arguments after `convert` (file names are relative to `tests/convert/`).
    args: &'static [&'static str],
    /// Input file fed on stdin, if any.
    stdin: Option<&'static str>,
    /// Expected exit code.
    code: i32,
}

const CASES: &[Case] = &[
    Case {
        name: "spc-aws-jmespath",
        args: &["spc-aws-jmespath.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "spc-aws-ssm",
        args: &["spc-aws-ssm.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "spc-vault",
        args: &["spc-vault.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "spc-sync",
        args: &["spc-sync.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "spc-azure",
        args: &["spc-azure.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "spc-gcp",
        args: &["spc-gcp.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "eso-external-secret-v1",
        args: &["eso-external-secret-v1.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "eso-external-secret-v1beta1",
        args: &["eso-external-secret-v1beta1.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "eso-stores",
        args: &["eso-stores.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "eso-cluster-external-secret",
        args: &["eso-cluster-external-secret.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "eso-cluster-store",
        args: &["eso-cluster-store.input.yaml"],
        stdin: None,
        code: 1,
    },
    // Objects with unknown fields are not converted; the others are printed, and the exit code
    // says that not everything was.
    Case {
        name: "unknown-field",
        args: &["unknown-field.input.yaml"],
        stdin: None,
        code: 1,
    },
    // Unknown fields in entries dropped for other reasons, in objects YAML and provider blocks.
    Case {
        name: "unknown-nested",
        args: &["unknown-nested.input.yaml"],
        stdin: None,
        code: 1,
    },
    // Each store's provider block becomes a provider object the store names by providerRef.
    Case {
        name: "provider-refs",
        args: &[
            "--provider-refs",
            "eso-stores.input.yaml",
            "eso-cluster-store.input.yaml",
            "spc-azure.input.yaml",
        ],
        stdin: None,
        code: 1,
    },
    Case {
        name: "eso-push-secret",
        args: &["eso-push-secret.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "spc-vault-dynamic",
        args: &["spc-vault-dynamic.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "eso-generators",
        args: &["eso-generators.input.yaml"],
        stdin: None,
        code: 1,
    },
    // Rows of docs/migrating.md's tables no other case exercises.
    Case {
        name: "eso-table",
        args: &["eso-table.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "spc-table",
        args: &["spc-table.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "bad-yaml",
        args: &["spc-vault.input.yaml", "bad-yaml.input.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "missing-file",
        args: &["spc-vault.input.yaml", "does-not-exist.yaml"],
        stdin: None,
        code: 1,
    },
    Case {
        name: "two-files",
        args: &["spc-aws-jmespath.input.yaml", "eso-stores.input.yaml"],
        stdin: None,
        code: 1,
    },
    // stdin, without arguments and as `-`: the same output as the file.
    Case {
        name: "spc-vault",
        args: &[],
        stdin: Some("spc-vault.input.yaml"),
        code: 0,
    },
    Case {
        name: "stdin-and-file",
        args: &["-", "spc-aws-ssm.input.yaml"],
        stdin: Some("eso-external-secret-v1beta1.input.yaml"),
        code: 1,
    },
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/convert")
}

fn bless() -> bool {
    std::env::var_os("LATCHKEY_BLESS").is_some_and(|v| v == "1")
}

/// Runs the binary for `case`: (stdout, stderr, exit code).
fn run(case: &Case) -> (String, String, i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_latchkey"))
        .arg("convert")
        .args(case.args)
        .current_dir(dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start latchkey");
    let input = match case.stdin {
        Some(file) => std::fs::read(dir().join(file)).expect("read the stdin input"),
        None => Vec::new(),
    };
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(&input).expect("write stdin");
    drop(stdin);
    let out = child.wait_with_output().expect("wait for latchkey");
    (
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
        out.status.code().expect("exit code"),
    )
}

/// Every file of the input directory with its content, to prove that none is written.
fn snapshot() -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).expect("list tests/convert") {
        let path = entry.expect("entry").path();
        if path.to_string_lossy().ends_with(".input.yaml") {
            files.insert(path.clone(), std::fs::read(&path).expect("read input"));
        }
    }
    files
}

#[test]
fn golden_outputs() {
    let before = snapshot();
    let mut failures = Vec::new();
    for case in CASES {
        let (stdout, stderr, code) = run(case);
        let golden = dir().join(format!("{}.golden.yaml", case.name));
        let golden_err = dir().join(format!("{}.stderr", case.name));
        if bless() && case.stdin.is_none_or(|_| !case.args.is_empty()) {
            std::fs::write(&golden, &stdout).expect("write golden");
            std::fs::write(&golden_err, &stderr).expect("write golden stderr");
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        let want_err = std::fs::read_to_string(&golden_err).unwrap_or_default();
        let label = format!(
            "{} (args {:?}, stdin {:?})",
            case.name, case.args, case.stdin
        );
        if code != case.code {
            failures.push(format!(
                "{label}: exit code {code}, want {}\n{stderr}",
                case.code
            ));
        }
        if stdout != want {
            failures.push(format!(
                "{label}: stdout differs from {}:\n{stdout}",
                golden.display()
            ));
        }
        if stderr != want_err {
            failures.push(format!(
                "{label}: stderr differs from {}:\n{stderr}",
                golden_err.display()
            ));
        }
        // A failed run prints nothing, unless only some objects failed: then the others.
        let partial = stderr.contains("were not converted");
        if code != 0 && !stdout.is_empty() && !partial {
            failures.push(format!("{label}: a failed run printed output"));
        }
        if partial && code == 0 {
            failures.push(format!(
                "{label}: objects were not converted, yet it exited 0"
            ));
        }
    }
    assert_eq!(before, snapshot(), "an input file changed");
    assert!(
        failures.is_empty(),
        "{}\n(LATCHKEY_BLESS=1 regenerates the golden files)",
        failures.join("\n\n")
    );
}

/// A store's validation: its inline block, or a well-formed `providerRef`.
fn store(
    provider: &latchkey::api::store::StoreProvider,
    provider_ref: Option<&latchkey::api::store::ProviderRef>,
    kind: StoreKind,
) -> Result<(), validate::Invalid> {
    match validate::provider_or_ref(provider, provider_ref, kind)? {
        Some(_) => Ok(()),
        None => validate::provider(provider, kind).map(|_| ()),
    }
}

/// A provider object's validation, as the agent checks the one a store names.
fn provider_object(value: &serde_norway::Value) -> Result<(), validate::Invalid> {
    use latchkey::api::provider_kinds::{CLUSTER_PROVIDER_API_VERSION, ProviderKind};
    let kind = ProviderKind::named(value["kind"].as_str().unwrap()).expect("a provider kind");
    let cluster = value["apiVersion"] == CLUSTER_PROVIDER_API_VERSION;
    let mut inline = serde_norway::Mapping::new();
    inline.insert(kind.block_name().into(), value["spec"].clone());
    let provider: latchkey::api::store::StoreProvider =
        serde_norway::from_value(serde_norway::Value::Mapping(inline)).expect("schema");
    let store_kind = if cluster {
        StoreKind::ClusterSecretStore
    } else {
        StoreKind::SecretStore
    };
    validate::provider(&provider, store_kind).map(|_| ())
}

#[test]
fn every_golden_output_loads_and_validates() {
    let mut checked = 0;
    for entry in std::fs::read_dir(dir()).expect("list tests/convert") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".golden.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read golden");
        // ClusterExternalSecrets and PushSecrets are the controller's: the node agent's loader
        // does not take them (standalone mode has no controller), so it sees the other documents.
        let for_the_agent: Vec<String> = serde_norway::Deserializer::from_str(&text)
            .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
            .filter(|v: &serde_norway::Value| {
                !v.is_null()
                    && !matches!(
                        v["kind"].as_str(),
                        Some("ClusterExternalSecret" | "PushSecret")
                    )
            })
            .map(|v| serde_norway::to_string(&v).expect("YAML"))
            .collect();
        ManifestCatalog::default()
            .add_documents(&path, &for_the_agent.join("---\n"))
            .unwrap_or_else(|e| panic!("{}: the strict loader refuses it: {e}", path.display()));
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value: serde_norway::Value =
                serde::Deserialize::deserialize(doc).expect("a YAML document");
            if value.is_null() {
                continue;
            }
            let kind = value["kind"].as_str().unwrap_or_default().to_string();
            let result = match kind.as_str() {
                "ExternalSecret" => {
                    let es: ExternalSecret = serde_norway::from_value(value).expect("schema");
                    validate::external_secret(&es.spec)
                }
                "SecretStore" => {
                    let s: SecretStore = serde_norway::from_value(value).expect("schema");
                    store(
                        &s.spec.provider,
                        s.spec.provider_ref.as_ref(),
                        StoreKind::SecretStore,
                    )
                }
                "ClusterSecretStore" => {
                    let s: ClusterSecretStore = serde_norway::from_value(value).expect("schema");
                    let r = s.spec.provider_ref.as_ref();
                    store(&s.spec.provider, r, StoreKind::ClusterSecretStore)
                }
                // A provider object (--provider-refs): its spec is checked as the inline block.
                _ if value["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.contains("providers.latchkey.dev/")) =>
                {
                    provider_object(&value)
                }
                "Password" | "VaultDynamicSecret" | "ClusterGenerator" => {
                    let g: latchkey::api::generator::GeneratorObject = match kind.as_str() {
                        "Password" => latchkey::api::generator::GeneratorObject::Password(
                            std::sync::Arc::new(serde_norway::from_value(value).expect("schema")),
                        ),
                        "VaultDynamicSecret" => {
                            latchkey::api::generator::GeneratorObject::VaultDynamicSecret(
                                std::sync::Arc::new(
                                    serde_norway::from_value(value).expect("schema"),
                                ),
                            )
                        }
                        _ => latchkey::api::generator::GeneratorObject::Cluster(
                            std::sync::Arc::new(serde_norway::from_value(value).expect("schema")),
                        ),
                    };
                    validate::generator(&g).map(|_| ())
                }
                "ClusterExternalSecret" => {
                    let c: ClusterExternalSecret = serde_norway::from_value(value).expect("schema");
                    validate::cluster_external_secret(&c.spec)
                }
                "PushSecret" => {
                    let p: PushSecret = serde_norway::from_value(value).expect("schema");
                    validate::push_secret(&p.spec)
                }
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            };
            if let Err(e) = result {
                panic!("{}: {kind} fails validation: {e}", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} documents checked");
}

#[test]
fn secret_values_never_reach_stderr() {
    for case in CASES {
        let (_, stderr, _) = run(case);
        for value in [
            "s3cr3t-never-printed",
            "not-a-real-password",
            "older-not-real",
        ] {
            assert!(!stderr.contains(value), "{}: {value} on stderr", case.name);
        }
    }
}

#[test]
fn help_says_inputs_are_never_written() {
    let out = Command::new(env!("CARGO_BIN_EXE_latchkey"))
        .args(["convert", "--help"])
        .output()
        .expect("run latchkey");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(help.contains("never written"), "{help}");
    assert!(help.contains("stdout"), "{help}");
}

/// A YAML document a hostile tenant would like an admin to apply: a cluster-wide store that reads
/// with the agent's own identity.
const INJECTED: &str = "x\n---\napiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\n\
    metadata: {name: pwned}\nspec: {provider: {aws: {region: us-east-1, auth: {agentIdentity: \
    {}}}}}\n---\n#";

/// Runs the binary on `input` (stdin): (stdout, stderr, exit code).
fn run_stdin(input: &str) -> (String, String, i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_latchkey"))
        .arg("convert")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start latchkey");
    let mut stdin = child.stdin.take().expect("piped stdin");
    // The child may refuse the input before reading it all.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let out = child.wait_with_output().expect("wait for latchkey");
    (
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
        out.status.code().expect("exit code"),
    )
}

/// The YAML documents of `text`, nulls (comment-only documents) left out.
fn documents(text: &str) -> Vec<serde_norway::Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("the output is YAML"))
        .filter(|v: &serde_norway::Value| !v.is_null())
        .collect()
}

#[test]
fn input_text_never_becomes_an_output_document() {
    // Every line break YAML knows: libyaml also ends a comment at NEL, LS and PS.
    for newline in ["\n", "\r", "\r\n", "\u{85}", "\u{2028}", "\u{2029}"] {
        let evil = INJECTED.replace('\n', newline);
        injection_is_refused(&evil);
    }
}

/// `value` without the mapping entries named `key`, except labels and annotations (which are
/// carried over as they are).
fn without_key(value: &serde_json::Value, key: &str) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != key)
                .map(|(k, v)| {
                    let keep = matches!(k.as_str(), "labels" | "annotations");
                    (
                        k.clone(),
                        if keep { v.clone() } else { without_key(v, key) },
                    )
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| without_key(v, key)).collect()),
        other => other.clone(),
    }
}

/// Feeds `evil` as field names and values in every place the conversion reads, and checks that
/// the output holds the converted documents only.
fn injection_is_refused(evil: &str) {
    let docs = serde_json::json!([
        // aws: an unknown parameter, an object's unknown field, names and versions.
        {"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
         "metadata": {"name": "aws", "namespace": "shop", "labels": {evil: evil},
                      "annotations": {evil: evil}},
         "spec": {"provider": "aws", "parameters": {
             evil: evil, "region": evil, "pathTranslation": evil,
             "objects": serde_norway::to_string(&serde_json::json!([
                 {"objectName": evil, "objectType": evil},
                 {"objectName": "db", "objectType": "secretsmanager", evil: evil,
                  "objectAlias": evil, "objectVersionLabel": evil, "filePermission": evil,
                  "jmesPath": [{"path": evil, "objectAlias": evil}]},
             ])).unwrap()}}},
        // vault: the same in its parameters.
        {"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
         "metadata": {"name": "vault", "namespace": "shop"},
         "spec": {"provider": "vault", "secretObjects": [{"secretName": evil, "type": evil,
                  "data": [{"objectName": evil, "key": evil}], evil: evil}],
                  "parameters": {
             evil: evil, "vaultAddress": evil, "roleName": evil,
             "objects": serde_norway::to_string(&serde_json::json!([
                 {"objectName": evil, "secretPath": evil, "secretKey": evil, "encoding": evil,
                  "method": evil, evil: evil},
             ])).unwrap()}}},
        // A provider pod's class, an evil name and namespace.
        {"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
         "metadata": {"name": evil, "namespace": evil},
         "spec": {"provider": "azure", "parameters": {evil: evil}, evil: evil}},
        {"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
         "metadata": {"name": "csi", "namespace": "shop"},
         "spec": {"provider": evil, "parameters": {evil: evil}}},
        // ESO: unknown fields, odd values, an unknown kind and apiVersion.
        {"apiVersion": "external-secrets.io/v1", "kind": "ExternalSecret",
         "metadata": {"name": "es", "namespace": "shop"},
         "spec": {"secretStoreRef": {"name": evil, "kind": evil}, evil: evil,
                  "refreshInterval": evil,
                  "data": [{"secretKey": evil, "remoteRef": {"key": evil, evil: evil,
                            "property": evil, "conversionStrategy": evil,
                            "metadataPolicy": evil}}],
                  "dataFrom": [{"extract": {"key": evil}, "rewrite": [{"regexp":
                               {"source": evil, "target": evil}}]}],
                  "target": {"name": evil, "creationPolicy": evil, "template": {
                      "data": {evil: format!("{{{{ .{evil} }}}}")}, "type": evil}}}},
        {"apiVersion": "external-secrets.io/v1", "kind": "SecretStore",
         "metadata": {"name": "store", "namespace": "shop"},
         "spec": {"provider": {"vault": {"server": evil, "path": evil, evil: evil,
                  "auth": {"kubernetes": {"role": evil, "mountPath": evil, evil: evil}}}}}},
        {"apiVersion": "external-secrets.io/v1", "kind": evil,
         "metadata": {"name": evil, "namespace": evil}},
        {"apiVersion": evil, "kind": "SecretProviderClass",
         "metadata": {"name": evil, "namespace": evil}},
    ]);
    // The same objects without the hostile field names (which fail them as unknown fields), so
    // that they convert and their notes quote the hostile values; and a provider pod's class,
    // whose parameters are carried over as they are.
    let mut all: Vec<serde_json::Value> = docs.as_array().expect("a list").clone();
    all.extend(
        docs.as_array()
            .expect("a list")
            .iter()
            .map(|d| without_key(d, evil)),
    );
    all.push(serde_json::json!(
        {"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
         "metadata": {"name": "carried", "namespace": "shop"},
         "spec": {"provider": "azure", "parameters": {evil: evil, "objects": evil}}}));
    let docs = serde_json::Value::Array(all);
    let mut input = String::new();
    for doc in docs.as_array().expect("a list") {
        input.push_str("---\n");
        input.push_str(&serde_norway::to_string(doc).expect("YAML"));
    }
    // kubectl's List as well: the same objects as items.
    input.push_str("---\n");
    input.push_str(
        &serde_norway::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "List",
            "items": docs}))
        .expect("YAML"),
    );
    let (stdout, stderr, _) = run_stdin(&input);
    let out = documents(&stdout);
    let written: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("latchkey convert: "))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary line: {stderr}"));
    assert_eq!(
        out.len(),
        written,
        "documents differ from the summary\n{stdout}"
    );
    assert!(
        written >= 2,
        "too few objects converted to prove anything:\n{stderr}"
    );
    for doc in &out {
        assert_eq!(
            doc["apiVersion"].as_str(),
            Some("latchkey.dev/v1alpha1"),
            "{doc:?}"
        );
        assert_ne!(doc["kind"].as_str(), Some("ClusterSecretStore"), "{stdout}");
        assert_ne!(doc["metadata"]["name"].as_str(), Some("pwned"), "{stdout}");
    }
    // Every comment is one line, and stderr is one line per message.
    for line in stdout.lines().filter(|l| l.starts_with('#')) {
        assert!(!line.contains('\r'), "{line:?}");
    }
    for line in stderr.lines() {
        assert!(
            ["warning: ", "error: ", "note: ", "latchkey convert: "]
                .iter()
                .any(|p| line.starts_with(p)),
            "a stderr line that is no message: {line:?}\n{stderr}"
        );
    }
    assert!(!stdout.contains("\n---\napiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore"));
}

/// Runs the binary on `input` (stdin), killing it after `limit`: (stderr, exit code, seconds).
fn run_bounded(input: String, limit: std::time::Duration) -> (String, Option<i32>, f64) {
    let start = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_latchkey"))
        .arg("convert")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start latchkey");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || {
        // The child may refuse the input before reading it all.
        let _ = stdin.write_all(input.as_bytes());
    });
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for latchkey") {
            break status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = writer.join();
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    (stderr, code, start.elapsed().as_secs_f64())
}

/// The largest resident set of any child this test process has waited for, in KiB.
fn children_max_rss_kib() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; it is read only when the call succeeds.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) } == 0;
    assert!(ok, "getrusage");
    // SAFETY: filled by the successful call above.
    unsafe { usage.assume_init() }.ru_maxrss
}

#[test]
fn yaml_bombs_are_refused_quickly_and_in_little_memory() {
    let mb = "x".repeat(1 << 20);
    let store = "apiVersion: external-secrets.io/v1\nkind: SecretStore\nmetadata: {name: s, \
                 namespace: n}\n";
    let bombs = [
        // 500 aliases of a 1 MB scalar: 500 MB once expanded.
        (
            "aliases",
            format!(
                "{store}spec: {{provider: {{fake: {{data: [{{key: k, value: &a \"{mb}\"}}]}}}}}}\n\
                 x: [{}]\n",
                vec!["*a"; 500].join(", ")
            ),
        ),
        // A List of 2,000 aliases of one 1 MB object.
        (
            "list",
            format!(
                "apiVersion: v1\nkind: List\nx: &o {{apiVersion: external-secrets.io/v1, kind: \
                 SecretStore, metadata: {{name: s}}, spec: {{provider: {{fake: {{data: [{{key: k, \
                 value: \"{mb}\"}}]}}}}}}}}\nitems: [{}]\n",
                vec!["*o"; 2_000].join(", ")
            ),
        ),
        // Billion laughs: ten levels of ten aliases each.
        ("laughs", {
            let mut t = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
            for i in 1..10 {
                let prev = format!("*a{}", i - 1);
                t.push_str(&format!(
                    "a{i}: &a{i} [{}]\n",
                    [prev.as_str(); 10].join(", ")
                ));
            }
            t
        }),
        // 500 KB of nested flow collections: quadratic in the scanner.
        (
            "nested",
            format!("a: {}{}\n", "[".repeat(250_000), "]".repeat(250_000)),
        ),
        ("nested-maps", format!("a: {}\n", "{a: ".repeat(100_000))),
        // 1.4 million one-line documents (8 MiB): each small, all held at once.
        ("documents", "---\na\n".repeat(1_400_000)),
        // Past the size limit.
        ("large", format!("a: \"{}\"\n", "x".repeat(33 << 20))),
    ];
    for (name, input) in bombs {
        let (stderr, code, secs) = run_bounded(input, std::time::Duration::from_secs(30));
        assert_eq!(
            code,
            Some(1),
            "{name}: exit code (None: killed after 30 s)\n{stderr}"
        );
        assert!(
            stderr.contains("refused before parsing") || stderr.contains("longer than the limit"),
            "{name}: {stderr}"
        );
        assert!(
            name == "large" || stderr.contains("nothing was converted"),
            "{name}: {stderr}"
        );
        assert!(secs < 10.0, "{name}: took {secs:.1} s");
    }
    // The children's peak: the 33 MB input itself, never what it expands to.
    let rss = children_max_rss_kib();
    assert!(rss < 160 * 1024, "a converting child reached {rss} KiB");
}
