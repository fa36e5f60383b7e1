//! Link-time layout of the release `latchkey` binary.
//!
//! Idle RSS is mostly the binary's own code pages: the kernel maps file pages in 64 KiB
//! "fault-around" windows, so what counts is how many windows the code that starts the agent and
//! serves a publish is spread over, not how big the binary is (docs/benchmarks.md, "Memory").
//! `link/hot-functions.order` lists those functions, recorded by `scripts/symbol-order.sh`; lld
//! places them first and together. A name the current build no longer has is skipped silently,
//! so a stale list costs only the layout, never the build. Names go stale with the toolchain and
//! the dependencies, and also when a listed function's signature changes (the hash in a mangled
//! name covers it) or a new function on the publish path is not inlined: either is a function of
//! every publish left out of the packed code, which shows as idle RSS (docs/benchmarks.md, "A
//! lesson on the code layout"). Keep such signatures, or record the list again.
//!
//! Symbols are stripped here (`--strip-all`) instead of by the profile's `strip` setting: the
//! profile is part of every crate's `-C metadata`, hence of every symbol's mangled hash, so the
//! unstripped build that records the list (`LATCHKEY_KEEP_SYMBOLS=1`) must use the same profile
//! as the shipped one for its names to match.
//!
//! Not for debug or test builds: they keep the linker's default layout and their symbols.

use std::env;
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
    let Some(dir) = env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let order = PathBuf::from(dir).join(ORDER_FILE);
    if order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=latchkey=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=latchkey=-Wl,--no-warn-symbol-ordering");
    }
}

/// Only lld reads a symbol-ordering file (GNU ld refuses the flag). rustc links
/// x86_64-unknown-linux-gnu with its own lld from 1.90 on; elsewhere the default layout stays.
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
