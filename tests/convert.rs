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
        code: 0,
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
        code: 0,
    },
    Case {
        name: "eso-stores",
        args: &["eso-stores.input.yaml"],
        stdin: None,
        code: 0,
    },
    Case {
        name: "eso-cluster-store",
        args: &["eso-cluster-store.input.yaml"],
        stdin: None,
        code: 0,
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
        code: 0,
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
        code: 0,
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
        if code != 0 && !stdout.is_empty() {
            failures.push(format!("{label}: a failed run printed output"));
        }
    }
    assert_eq!(before, snapshot(), "an input file changed");
    assert!(
        failures.is_empty(),
        "{}\n(LATCHKEY_BLESS=1 regenerates the golden files)",
        failures.join("\n\n")
    );
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
        ManifestCatalog::default()
            .add_documents(&path, &text)
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
                    validate::provider(&s.spec.provider, StoreKind::SecretStore).map(|_| ())
                }
                "ClusterSecretStore" => {
                    let s: ClusterSecretStore = serde_norway::from_value(value).expect("schema");
                    validate::provider(&s.spec.provider, StoreKind::ClusterSecretStore).map(|_| ())
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
