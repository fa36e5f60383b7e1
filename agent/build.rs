//! Link-time layout of the release `latchkey` binary.
//!
//! Idle RSS is mostly the binary's own code pages: the kernel maps file pages in 64 KiB
//! "fault-around" windows, so what counts is how many windows the code that starts the agent and
//! serves a publish is spread over, not how big the binary is (docs/benchmarks.md, "Against the
//! Go plugin").
//! `link/hot-functions.order` lists those functions, recorded by `scripts/symbol-order.sh`, most
//! of them by name without what changes from build to build: the hash a legacy mangled name ends
//! with (`17h<16 hex digits>E`, which covers the crate's `-C metadata`, so every dependency
//! change, the profile and the features), LTO's numbered copies (`.1234`) and the crate hashes in
//! std's v0 names, each left as `*`. Such a name fits `cargo build --release`, `cargo bench`'s
//! build and the image's static build alike, and survives a dependency or toolchain bump. It
//! also stands for every instance of a generic function, so the names of generic functions with
//! many instances are kept whole (hash and all): exact, but for the recorded build only.
//! This script turns the list into a linker script: rustc puts each function in a section of its
//! own (`.text.<symbol>`), and the script gathers the listed ones into `.text.hot`, in the list's
//! order, placed before `.text`.
//!
//! A list that matches little any more still builds, but costs idle RSS (5 MiB once; 7.5 MiB
//! without any list): `scripts/bench-go-csi.sh` compares the size of `.text.hot` with what the
//! list packed when it was recorded, and fails when most of it is gone (code moved or renamed,
//! or a dependency bump for the names kept whole). Record the list again then: one build and
//! half a minute.
//!
//! Symbols are stripped here (`--strip-all`) so that the recording build can keep them
//! (`LATCHKEY_KEEP_SYMBOLS=1`) with everything else the same.
//!
//! Not for debug or test builds: they keep the linker's default layout and their symbols.

use std::env;
use std::fmt::Write;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// The recorded functions, relative to this crate.
const ORDER_FILE: &str = "link/hot-functions.order";

fn main() {
    println!("cargo:rerun-if-changed={ORDER_FILE}");
    println!("cargo:rerun-if-env-changed=LATCHKEY_KEEP_SYMBOLS");
    println!("cargo:rerun-if-env-changed=LATCHKEY_SYMBOL_ORDER");

    if env::var("PROFILE").as_deref() != Ok("release") {
        return;
    }
    if env::var_os("LATCHKEY_KEEP_SYMBOLS").is_none() {
        println!("cargo:rustc-link-arg-bin=latchkey=-Wl,--strip-all");
    }
    if env::var("LATCHKEY_SYMBOL_ORDER").as_deref() == Ok("off") || !links_with_lld() {
        return;
    }
    let (Some(dir), Some(out)) = (env::var_os("CARGO_MANIFEST_DIR"), env::var_os("OUT_DIR")) else {
        return;
    };
    let list = match fs::read_to_string(PathBuf::from(dir).join(ORDER_FILE)) {
        Ok(list) => list,
        Err(e) => {
            println!("cargo:warning={ORDER_FILE}: {e}; the default code layout costs idle RSS");
            return;
        }
    };
    let script = PathBuf::from(out).join("hot-functions.ld");
    if let Err(e) = fs::write(&script, linker_script(&list)) {
        println!("cargo:warning={}: {e}", script.display());
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=latchkey=-Wl,-T,{}",
        script.display()
    );
}

/// A linker script that puts the sections of the listed functions first, in the list's order.
/// Each line is its own input description: within one, lld keeps the input order instead.
/// LLVM names a cold function's section `.text.unlikely.<symbol>` (`RawVec::grow_one`,
/// `RawTable::reserve_rehash`): left out, those 221 functions stayed spread over the binary and
/// idle RSS was 2.6 MiB higher.
fn linker_script(list: &str) -> String {
    let mut script = String::from("SECTIONS\n{\n  .text.hot : {\n");
    let names = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    for name in names {
        // A name that ends in `*` already covers LTO's copies; any other name gets them here.
        let copies: &[&str] = if name.ends_with('*') {
            &[""]
        } else {
            &["", ".*"]
        };
        script.push_str("    *(");
        for prefix in [".text.", ".text.unlikely."] {
            for copy in copies {
                let _ = write!(script, "{prefix}{name}{copy} ");
            }
        }
        script.push_str(")\n");
    }
    script.push_str("  }\n}\nINSERT BEFORE .text;\n");
    script
}

/// Only lld is known to lay this out as measured. rustc links x86_64-unknown-linux-gnu with its
/// own lld from 1.90 on; elsewhere the default layout stays.
fn links_with_lld() -> bool {
    if env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut numbers = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
