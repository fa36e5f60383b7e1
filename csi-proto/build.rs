//! Generates the CSI v1 messages plus tonic clients and servers from
//! `proto/csi.proto`, and the External Secret Store plugin protocol
//! (`ess.proto.v1alpha1`) from `proto/ess.proto`, and the Secrets Store CSI
//! Driver's provider protocol (`v1alpha1`) from
//! `proto/secrets_store_provider.proto`, and Latchkey's own plugin protocol
//! (`latchkey.plugin.v1`) from `proto/latchkey_plugin.proto`.
//!
//! Messages that carry credentials get no derived `Debug`; `src/redact.rs`
//! implements a redacting one instead. The list is derived from the proto
//! itself (every message with a `csi_secret` field, plus
//! `NodePublishVolumeRequest`, whose `volume_context` carries service account
//! tokens; in ess.proto every message with a `bytes` field, which carries secret
//! values; in the provider protocol `MountRequest`, whose `attributes` carry
//! tokens and `secrets` credentials, and `File`, whose `contents` is a value;
//! in latchkey_plugin.proto every message with a `bytes` field plus `Token`)
//! and written to `$OUT_DIR/redacted_types.rs` so the crate's tests can
//! check that each of them has a hand-written impl.

use std::{env, fs, io, path::PathBuf};

const PROTO: &str = "proto/csi.proto";
const ESS_PROTO: &str = "proto/ess.proto";
const SSCSI_PROTO: &str = "proto/secrets_store_provider.proto";
const LATCHKEY_PROTO: &str = "proto/latchkey_plugin.proto";
/// latchkey.plugin.v1 messages that carry a token (besides those with `bytes` fields).
const LATCHKEY_TOKEN_MESSAGES: [&str; 1] = ["Token"];
/// Provider-protocol messages that carry tokens, credentials or values.
const SSCSI_REDACTED: [&str; 2] = ["File", "MountRequest"];

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed={ESS_PROTO}");
    println!("cargo:rerun-if-changed={SSCSI_PROTO}");
    println!("cargo:rerun-if-changed={LATCHKEY_PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let protoc = protoc_bin_vendored::protoc_bin_path().map_err(io::Error::other)?;
    let wkt_include = protoc_bin_vendored::include_path().map_err(io::Error::other)?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { env::set_var("PROTOC", protoc) };

    let mut redacted = secret_messages(&fs::read_to_string(PROTO)?);
    redacted.push("NodePublishVolumeRequest".to_owned());
    redacted.sort();
    redacted.dedup();

    let mut ess_redacted = bytes_messages(&fs::read_to_string(ESS_PROTO)?);
    ess_redacted.sort();

    let mut latchkey_redacted = bytes_messages(&fs::read_to_string(LATCHKEY_PROTO)?);
    latchkey_redacted.extend(LATCHKEY_TOKEN_MESSAGES.map(String::from));
    latchkey_redacted.sort();
    latchkey_redacted.dedup();

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let list =
        |names: &[String]| -> String { names.iter().map(|m| format!("    \"{m}\",\n")).collect() };
    fs::write(
        out_dir.join("redacted_types.rs"),
        format!(
            "/// Messages built without a derived `Debug`.\npub(crate) const SKIP_DEBUG: &[&str] = &[\n{}];\n\
             /// ess.proto messages built without a derived `Debug`.\npub(crate) const SKIP_DEBUG_ESS: &[&str] = &[\n{}];\n\
             /// Provider-protocol messages built without a derived `Debug`.\npub(crate) const SKIP_DEBUG_SSCSI: &[&str] = &[\n{}];\n\
             /// latchkey.plugin.v1 messages built without a derived `Debug`.\npub(crate) const SKIP_DEBUG_LATCHKEY: &[&str] = &[\n{}];\n",
            list(&redacted),
            list(&ess_redacted),
            list(&SSCSI_REDACTED.map(String::from)),
            list(&latchkey_redacted),
        ),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Unserved RPCs answer UNIMPLEMENTED without a hand-written stub for each.
        .generate_default_stubs(true)
        // kubelet's string maps (volume_context, secrets, ...) hold a handful of entries: a
        // BTreeMap decodes them without SipHash-ing every key and looks keys up by comparison,
        // a tenth of a warm publish's request decoding (docs/benchmarks.md at c9d4b4e).
        .btree_map(".csi.v1")
        .skip_debug(
            redacted.iter().map(|m| format!(".csi.v1.{m}")).chain(
                ess_redacted
                    .iter()
                    .map(|m| format!(".ess.proto.v1alpha1.{m}"))
                    .chain(SSCSI_REDACTED.iter().map(|m| format!(".v1alpha1.{m}")))
                    .chain(
                        latchkey_redacted
                            .iter()
                            .map(|m| format!(".latchkey.plugin.v1.{m}")),
                    ),
            ),
        )
        .compile_protos(
            &[
                PathBuf::from(PROTO),
                PathBuf::from(ESS_PROTO),
                PathBuf::from(SSCSI_PROTO),
                PathBuf::from(LATCHKEY_PROTO),
            ],
            &[PathBuf::from("proto"), wkt_include],
        )
}

/// Messages of ess.proto (or latchkey_plugin.proto) with a `bytes` field (a scalar or a map value): these
/// carry secret values. Its messages are flat, one field a line.
fn bytes_messages(proto: &str) -> Vec<String> {
    let mut current: Option<&str> = None;
    let mut found = Vec::new();
    for line in proto.lines() {
        let line = line.split("//").next().unwrap_or_default().trim();
        if let Some(rest) = line.strip_prefix("message ") {
            current = Some(rest.trim_end_matches('{').trim_end_matches('}').trim());
        }
        let bytes_field = line.starts_with("bytes ") || line.contains(", bytes>");
        if let Some(name) = current.filter(|_| bytes_field)
            && !found.iter().any(|f: &String| f == name)
        {
            found.push(name.to_owned());
        }
    }
    found
}

/// Names (dotted for nested messages) of messages with a field marked
/// `[(csi_secret) = true]`. A line-based scan is enough for csi.proto's layout.
fn secret_messages(proto: &str) -> Vec<String> {
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut found = Vec::new();
    for line in proto.lines() {
        let line = line.split("//").next().unwrap_or_default().trim();
        if let Some(rest) = line.strip_prefix("message ") {
            let name = rest.trim_end_matches('{').trim().to_owned();
            stack.push((name, depth + 1));
        }
        if line.contains("(csi_secret) = true") && !stack.is_empty() {
            let path: Vec<&str> = stack.iter().map(|(n, _)| n.as_str()).collect();
            found.push(path.join("."));
        }
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
        while stack.last().is_some_and(|&(_, d)| depth < d) {
            stack.pop();
        }
    }
    found
}
