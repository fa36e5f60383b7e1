#!/usr/bin/env bash
# Side-by-side benchmark, driven from outside with the Go CSI bindings: Latchkey's warm
# NodePublishVolume against a minimal Go CSI node plugin that mounts a tmpfs and writes the same 3
# files with no resolution at all (agent/benches/go-csi/README.md says what and why).
#
#   scripts/bench-go-csi.sh                     # as root; latchkey from target/release/latchkey
#   TMPDIR=/dev/shm scripts/bench-go-csi.sh     # target directories on tmpfs, not on the disk
#   scripts/bench-go-csi.sh --go-only           # the Go plugin alone (no latchkey binary needed)
#   scripts/bench-go-csi.sh --strace            # then also count both servers' system calls
#                                               # (strace -f -c) over 200 publishes, 200 unpublishes
#
# Environment: LATCHKEY_BIN (default target/release/latchkey, copied before it is started),
# GO_LAYOUT (flat: the Go plugin writes the 3 files straight into its tmpfs, the issue's baseline;
# atomic: it writes them in kubelet's ..data layout, the same volume system calls as Latchkey's),
# BENCH_CONNECTION (shared: every call of the benchmark on one connection per server; per-call:
# each timed call dials a connection of its own and closes it after the answer, as kubelet does
# for every operation), BENCH_VOLUMES (1000: volumes each server then keeps mounted while its RSS
# is read; 0 skips it), BENCH_ROUNDS (10), BENCH_PER_ROUND (200), BENCH_WARMUP (50), BENCH_JSON (default
# target/bench/go-csi.json), BENCH_LAYOUT_CHECK (1: fail when the binary's code layout list is
# stale, see agent/build.rs; 0: run anyway), TMPDIR (where the scratch directory and the targets
# go; the build directory is below /var/tmp, on disk, so the binaries are file pages whatever
# TMPDIR says).
#
# Installs the Debian packages it needs if they are missing (Go, grpc-go, golang/protobuf,
# protoc, protoc-gen-go, protoc-gen-go-grpc), generates the CSI Go bindings from
# csi-proto/proto/csi.proto into the build directory (there is no Go module proxy to fetch
# github.com/container-storage-interface/spec from), builds the plugin and the client in GOPATH
# mode, starts both servers, runs the client, and on every exit path stops what it started,
# detaches any mount left below the scratch directory and removes both directories.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
GO_ONLY=0
STRACE=0
for arg in "$@"; do
  case "$arg" in
    --go-only) GO_ONLY=1 ;;
    --strace) STRACE=1 ;;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-go-csi.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "bench-go-csi.sh: must run as root (every volume is a tmpfs mount)" >&2
  exit 1
fi

LATCHKEY_BIN="${LATCHKEY_BIN:-$REPO/target/release/latchkey}"
GO_LAYOUT="${GO_LAYOUT:-flat}"
case "$GO_LAYOUT" in
  flat) GO_LABEL="minimal Go plugin" ;;
  atomic) GO_LABEL="Go plugin, atomic layout" ;;
  *) echo "bench-go-csi.sh: GO_LAYOUT must be flat or atomic, not $GO_LAYOUT" >&2; exit 2 ;;
esac
CONNECTION="${BENCH_CONNECTION:-shared}"
case "$CONNECTION" in
  shared | per-call) ;;
  *) echo "bench-go-csi.sh: BENCH_CONNECTION must be shared or per-call, not $CONNECTION" >&2; exit 2 ;;
esac
ROUNDS="${BENCH_ROUNDS:-10}"
PER_ROUND="${BENCH_PER_ROUND:-200}"
WARMUP="${BENCH_WARMUP:-50}"
JSON="${BENCH_JSON:-$REPO/target/bench/go-csi.json}"
if [ "$GO_ONLY" = 0 ] && [ ! -x "$LATCHKEY_BIN" ]; then
  echo "bench-go-csi.sh: no latchkey binary at $LATCHKEY_BIN (set LATCHKEY_BIN, or --go-only)" >&2
  exit 1
fi

say() { echo "==> $*" >&2; }

# --- Code layout -----------------------------------------------------------------------------------
# Idle RSS depends on the listed functions being packed together (agent/build.rs): a list whose
# names no longer match most of the code (moved or renamed modules) costs MiBs and nothing else
# says so. The size of .text.hot against what the list packed when recorded tells.
if [ "$GO_ONLY" = 0 ] && [ "${BENCH_LAYOUT_CHECK:-1}" = 1 ]; then
  ORDER="$REPO/agent/link/hot-functions.order"
  recorded=$(awk '/^# hot-bytes: / {print $3}' "$ORDER")
  packed=$(readelf -SW "$LATCHKEY_BIN" | awk '$2 == ".text.hot" {print $6}')
  [ -n "$packed" ] && packed=$((16#$packed))
  if [ -z "$packed" ] || [ -z "$recorded" ]; then
    echo "bench-go-csi.sh: $LATCHKEY_BIN has no .text.hot (built with LATCHKEY_SYMBOL_ORDER=off, or not by lld?); idle RSS would not compare. BENCH_LAYOUT_CHECK=0 runs anyway" >&2
    exit 1
  fi
  say "code layout: .text.hot $((packed / 1024)) KiB, $((packed * 100 / recorded))% of the $((recorded / 1024)) KiB recorded"
  # A fresh list packs ~100%. Names kept with their hash fit only the recorded build (`cargo
  # build --release`), and a list without the agent crate's own names packed 83%.
  if [ $((packed * 100 / recorded)) -lt 75 ]; then
    echo "bench-go-csi.sh: the code layout list is stale (most listed functions are gone): run scripts/symbol-order.sh, rebuild; BENCH_LAYOUT_CHECK=0 runs anyway" >&2
    exit 1
  elif [ $((packed * 100 / recorded)) -lt 90 ]; then
    echo "bench-go-csi.sh: WARNING: the code layout list is going stale (or this is not a cargo build --release binary); idle RSS may be higher than with a fresh list (scripts/symbol-order.sh)" >&2
  fi
fi

# --- Debian packages -----------------------------------------------------------------------------
GOCODE=/usr/share/gocode/src
need_packages() {
  for cmd in go protoc protoc-gen-go protoc-gen-go-grpc; do
    command -v "$cmd" >/dev/null || return 0
  done
  for dir in google.golang.org/grpc github.com/golang/protobuf/proto google.golang.org/protobuf/proto; do
    [ -d "$GOCODE/$dir" ] || return 0
  done
  [ "$STRACE" = 1 ] && ! command -v strace >/dev/null && return 0
  return 1
}
if need_packages; then
  PACKAGES=(golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-goprotobuf-dev
    protobuf-compiler protoc-gen-go-grpc)
  [ "$STRACE" = 1 ] && PACKAGES+=(strace)
  say "installing ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${PACKAGES[@]}" >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq "${PACKAGES[@]}" >/dev/null; }
fi

# --- Scratch directory and cleanup ---------------------------------------------------------------
# WORK (below $TMPDIR): sockets, manifests, logs, target directories. BUILD (below /var/tmp,
# on disk whatever TMPDIR says): generated bindings and the three binaries. Binaries on a tmpfs
# would be counted as RssShmem instead of RssFile, and idle RSS would not compare across
# TMPDIR choices.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/latchkey-go-csi.XXXXXX")"
WORK="$(cd "$WORK" && pwd -P)"
BUILD="$(mktemp -d /var/tmp/latchkey-go-csi-build.XXXXXX)"
PIDS=()       # the servers
CLIENT_PID="" # the client, while it runs

stop_pid() { # SIGTERM, then SIGKILL after 10 s
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid mp
  trap - EXIT INT TERM
  [ -n "$CLIENT_PID" ] && stop_pid "$CLIENT_PID"
  [ -n "$STRACE_PID" ] && stop_pid "$STRACE_PID"
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  # Whatever was left mounted below the scratch directory, innermost first, detached lazily.
  while read -r mp; do
    umount -l "$mp" 2>/dev/null || true
  done < <(awk -v root="$WORK/" 'index($5, root) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  if awk -v root="$WORK/" 'index($5, root) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    echo "bench-go-csi.sh: mounts are still left below $WORK; not removing it" >&2
  else
    rm -rf --one-file-system "$WORK"
  fi
  rm -rf --one-file-system "$BUILD"
  exit "$rc"
}
STRACE_PID=""
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs the client in the background and waits for it: a trapped signal interrupts `wait` (it
# would not interrupt a foreground command), and cleanup stops the client first.
client() {
  "$CLIENT" "$@" &
  CLIENT_PID=$!
  local rc=0
  wait "$CLIENT_PID" || rc=$?
  CLIENT_PID=""
  return "$rc"
}

# --- Bindings and builds -------------------------------------------------------------------------
GOPATH_DIR="$BUILD/gopath"
CSI_PKG="github.com/container-storage-interface/spec/lib/go/csi"
CSI_DIR="$GOPATH_DIR/src/$CSI_PKG"
mkdir -p "$CSI_DIR" "$BUILD/bin"
say "generating the CSI Go bindings from csi-proto/proto/csi.proto ($(protoc --version))"
# protoc-gen-go 1.3.5 (github.com/golang/protobuf, Debian's protoc-gen-go-1-3) for the messages,
# with the well-known types mapped to that module's packages; protoc-gen-go-grpc (grpc-go 1.33)
# for the services.
WKT="Mgoogle/protobuf/descriptor.proto=github.com/golang/protobuf/protoc-gen-go/descriptor"
WKT="$WKT,Mgoogle/protobuf/timestamp.proto=github.com/golang/protobuf/ptypes/timestamp"
WKT="$WKT,Mgoogle/protobuf/wrappers.proto=github.com/golang/protobuf/ptypes/wrappers"
protoc -I "$REPO/csi-proto/proto" -I /usr/include \
  --go_out="$WKT,paths=source_relative:$CSI_DIR" \
  --go-grpc_out="paths=source_relative:$CSI_DIR" \
  "$REPO/csi-proto/proto/csi.proto"

export GO111MODULE=off GOPROXY=off GOFLAGS= GOPATH="$GOPATH_DIR:/usr/share/gocode"
say "building the Go plugin and the client ($(go version | cut -d' ' -f3))"
(cd "$REPO" && go build -trimpath -ldflags='-s -w' -o "$BUILD/bin/go-csi-plugin" ./agent/benches/go-csi/plugin)
(cd "$REPO" && go build -trimpath -o "$BUILD/bin/go-csi-client" ./agent/benches/go-csi/client)
CLIENT="$BUILD/bin/go-csi-client"

# --- Servers -------------------------------------------------------------------------------------
TARGETS="$WORK/targets"
mkdir -p "$TARGETS"

# Both binaries leave the page cache before they start, as on a node after a reboot or
# reclaim: their code then comes in by the page faults' read-around. How a file came into the
# page cache (written by a linker, copied, read in one go) decides the size of its folios, which
# the kernel maps whole, so the same latchkey binary idled at 7.5 to 9.9 MiB depending on it.
# latchkey runs from a copy, so that a rebuild during the run does not change the binary.
if [ "$GO_ONLY" = 0 ]; then cp "$LATCHKEY_BIN" "$BUILD/bin/latchkey"; fi
for bin in "$BUILD/bin/go-csi-plugin" "$BUILD/bin/latchkey"; do
  [ -f "$bin" ] || continue
  sync "$bin"
  dd if="$bin" iflag=nocache count=0 status=none
done

# Both servers' output goes through a pipe, as a container's does (the runtime's shim reads it
# and writes the log file): straight into a file below $TMPDIR, each of Latchkey's log lines was
# a write to the filesystem under test (ext4 on /tmp), which no node makes it pay.
GO_SOCK="$WORK/go/csi.sock"
"$BUILD/bin/go-csi-plugin" -endpoint "unix://$GO_SOCK" -node-id bench -volume-size-limit $((4 << 20)) \
  -layout "$GO_LAYOUT" > >(cat >"$WORK/go-plugin.log") 2>&1 &
GO_PID=$!
PIDS+=("$GO_PID")

LK_ARGS=()
if [ "$GO_ONLY" = 0 ]; then
  "$CLIENT" -write-manifests "$WORK/manifests"
  LK_SOCK="$WORK/lk/csi.sock"
  METRICS_PORT="$("$CLIENT" -free-port)"
  env -u RUST_LOG "$BUILD/bin/latchkey" node --endpoint "unix://$LK_SOCK" --node-id bench \
    --volume-size-limit 4Mi --manifests "$WORK/manifests" --metrics-addr "127.0.0.1:$METRICS_PORT" \
    >/dev/null 2> >(cat >"$WORK/latchkey.log") &
  LK_PID=$!
  PIDS+=("$LK_PID")
  LK_ARGS=(-latchkey-socket "$LK_SOCK" -latchkey-pid "$LK_PID")
fi

# Ready: both sockets exist and latchkey's /readyz answers 200 (the client then waits for Probe).
ready() {
  [ -S "$GO_SOCK" ] || return 1
  [ "$GO_ONLY" = 1 ] && return 0
  [ -S "$LK_SOCK" ] || return 1
  curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$METRICS_PORT/readyz"
}
deadline=$((SECONDS + 30))
until ready 2>/dev/null; do
  for pid in "${PIDS[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench-go-csi.sh: a server exited early; logs:" >&2
      tail -n 40 "$WORK"/*.log >&2
      exit 1
    fi
  done
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "bench-go-csi.sh: the servers did not become ready in 30 s; logs:" >&2
    tail -n 40 "$WORK"/*.log >&2
    exit 1
  fi
  sleep 0.02
done

# --- Benchmark -----------------------------------------------------------------------------------
say "running the client (TMPDIR=${TMPDIR:-/tmp})"
client -go-socket "$GO_SOCK" -go-pid "$GO_PID" -go-label "$GO_LABEL" "${LK_ARGS[@]}" -targets "$TARGETS" \
  -rounds "$ROUNDS" -per-round "$PER_ROUND" -warmup "$WARMUP" -connection "$CONNECTION" -json "$JSON"

# --- RSS at 1,000 volumes ------------------------------------------------------------------------
# Each server then publishes BENCH_VOLUMES new volumes (untimed) and keeps them mounted while its
# VmRSS is read: what a node full of pods costs, beside the idle figure above. 0: skipped.
VOLUMES="${BENCH_VOLUMES:-1000}"
rss_line() { # <label> <pid>
  awk -v label="$1" '/^(VmRSS|RssAnon|RssFile):/ { v[$1] = sprintf("%.1f", $2 / 1024) }
    END { printf "%s: VmRSS %s MiB (RssAnon %s, RssFile %s)\n", label, v["VmRSS:"], v["RssAnon:"], v["RssFile:"] }' "/proc/$2/status"
}
if [ "$VOLUMES" -gt 0 ]; then
  say "publishing $VOLUMES volumes on each server and reading its RSS with them mounted"
  echo
  client -go-socket "$GO_SOCK" -go-pid "$GO_PID" -go-label "$GO_LABEL" -targets "$TARGETS" \
    -connection "$CONNECTION" -mode publish -count "$VOLUMES" -prefix many >/dev/null
  sleep 1
  rss_line "$GO_LABEL, $VOLUMES volumes mounted" "$GO_PID"
  if [ "$GO_ONLY" = 0 ]; then
    client -latchkey-socket "$LK_SOCK" -latchkey-pid "$LK_PID" -targets "$TARGETS" \
      -connection "$CONNECTION" -mode publish -count "$VOLUMES" -prefix many >/dev/null
    sleep 1
    rss_line "latchkey, $VOLUMES volumes mounted" "$LK_PID"
  fi
fi

# --- System calls (optional) ---------------------------------------------------------------------
# strace -f -c attached to a running server, over 200 publishes and then over their 200
# unpublishes. The counts include what the server does while idle during those calls (Go's
# sysmon, tokio's timers), and strace slows every call down: counts only, no times.
trace_phase() { # <server key> <pid> <socket flag> <socket> <mode>
  local key="$1" pid="$2" flag="$3" sock="$4" mode="$5" out="$WORK/strace-$1-$5.txt"
  strace -f -c -o "$out" -p "$pid" 2>/dev/null &
  STRACE_PID=$!
  sleep 0.5 # attached to every thread before the first call
  client "$flag" "$sock" -"$key"-pid "$pid" -targets "$TARGETS" -connection "$CONNECTION" -mode "$mode" -count 200 -prefix strace
  kill -INT "$STRACE_PID"
  wait "$STRACE_PID" 2>/dev/null || true
  STRACE_PID=""
  echo
  echo "strace -f -c, $key, 200 x $mode:"
  cat "$out"
}
if [ "$STRACE" = 1 ]; then
  say "counting system calls (strace -f -c), 200 publishes and 200 unpublishes per server"
  trace_phase go "$GO_PID" -go-socket "$GO_SOCK" publish
  trace_phase go "$GO_PID" -go-socket "$GO_SOCK" unpublish
  if [ "$GO_ONLY" = 0 ]; then
    trace_phase latchkey "$LK_PID" -latchkey-socket "$LK_SOCK" publish
    trace_phase latchkey "$LK_PID" -latchkey-socket "$LK_SOCK" unpublish
  fi
fi
