#!/usr/bin/env bash
# Records which functions of the release `latchkey` binary run while the agent starts and serves
# publishes, and writes them to agent/link/hot-functions.order; agent/build.rs turns that list
# into a linker script that places those functions first and together. Idle RSS is mostly code
# pages mapped in 64 KiB windows, so packing the code that runs into few windows is what lowers
# it (docs/benchmarks.md, "Against the Go plugin").
#
# The names are kept without what changes from build to build (agent/build.rs says which parts),
# so one recording serves `cargo build --release`, `cargo bench` and the image's static build, and
# a dependency or toolchain bump leaves the list valid. What does make it stale is code that moves
# or is renamed (a module path is part of every name): scripts/bench-go-csi.sh compares the
# packed code with the size recorded here and fails when most of it no longer matches. Then:
#
#   scripts/symbol-order.sh            # as root (it mounts tmpfs); one release build + ~3 min
#
# The build keeps its symbols (LATCHKEY_KEEP_SYMBOLS=1: the same code, only not stripped) and
# runs under valgrind's callgrind, in manifest mode on fake-provider stores. Callgrind's first
# dump holds what starting the agent ran (until /readyz answers) and what an idle agent runs
# (probes, metric scrapes, a second of idling); the second what publishing ran: first and
# repeated publishes with and without a template, a refresh that is due, unpublishes, a refused
# request; the third what a mount storm adds: 40 pods at once on a store with a backend latency
# (the shared fetch, the blocking pool, the concurrent unpublish) and the quiet period after it
# (the pool's threads exiting, the heap trim). What only start-up runs comes first, then what
# start-up and publishing both run (the gRPC stack, the runtime, logging), then what only
# publishing runs, then what only the storm runs. So start-up's code is one stretch, which an
# idle agent maps in few windows, and the publish path's is one stretch too, overlapping it in
# the middle.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/symbol-order.sh: mounting tmpfs needs root; re-running in a user+mount namespace" >&2
  exec unshare --user --map-root-user --mount -- "$0" "$@"
fi
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
ORDER=agent/link/hot-functions.order
WORK="$(mktemp -d)"
AGENT_PID=""
cleanup() {
  [ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
  { grep -o " $WORK/[^ ]*" /proc/self/mounts | xargs -r -n1 umount -l; } 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/manifests" "$WORK/pods"
# What the publish path meets in use: property, extract, a CEL template with files items, a
# refresh that falls due within the recording (1s), and the cache.
cat > "$WORK/manifests/order.yaml" <<'YAML'
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {name: store, namespace: shop}
spec:
  provider:
    fake:
      data:
      - {key: shop/database, value: '{"host": "db", "port": 5432, "username": "shop", "password": "not-a-secret"}'}
      - {key: shop/api-key, value: not-a-secret-either}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: plain, namespace: shop}
spec:
  secretStoreRef: {name: store}
  refreshInterval: 1h
  data:
  - {secretKey: username, remoteRef: {key: shop/database, property: username}}
  - {secretKey: api-key, remoteRef: {key: shop/api-key}}
  dataFrom:
  - extract: {key: shop/database}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: fast, namespace: shop}
spec:
  secretStoreRef: {name: store}
  refreshInterval: 1s
  data:
  - {secretKey: api-key, remoteRef: {key: shop/api-key}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: templated, namespace: shop}
spec:
  secretStoreRef: {name: store}
  dataFrom:
  - extract: {key: shop/database}
  target:
    template:
      data:
        url: "'postgres://%s:%s@%s:%s/shop'.format([secret.username, secret.password, secret.host, secret.port])"
        app: "'%s/%s'.format([pod.namespace, pod.name]).lowerAscii()"
    files:
      items:
      - {key: url, path: db/url, mode: 0400}
      - {key: app, path: app}
---
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {name: slow, namespace: shop}
spec:
  provider:
    fake:
      latency: 5ms
      data:
      - {key: shop/slow, value: not-a-secret-at-all}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: slow, namespace: shop}
spec:
  secretStoreRef: {name: slow}
  data:
  - {secretKey: value, remoteRef: {key: shop/slow}}
YAML
# Callgrind names each function once per dump file, at its first mention: "fn=(id) name" for
# a function that ran, or "cfn=(id) name" for one called; later mentions are "fn=(id)" alone.
names() {
  python3 - "$1" <<'PY'
import re, sys
named, ran = {}, set()
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(c?)fn=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
    if not m:
        continue
    if m.group(3):
        named[m.group(2)] = m.group(3)
    if not m.group(1):
        ran.add(m.group(2))
print("\n".join(sorted({named[i] for i in ran if i in named})))
PY
}
in_order() { awk 'NR == FNR {want[$0]; next} $0 in want' "$1" "$WORK/defined"; }

# Records what binary $1 runs at start-up only, at start-up and when publishing, when publishing
# only and in a storm only, into $WORK/$2.start, .shared, .publish and .storm, each in the
# binary's own address order (neighbours stay neighbours).
record() {
  local BIN=$1 name=$2
  rm -rf "$WORK/pods" "$WORK"/cg.out*; mkdir -p "$WORK/pods"
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  SOCK="$WORK/csi.sock"

  echo "==> recording $name under callgrind"
  valgrind --tool=callgrind --demangle=no --dump-instr=no --callgrind-out-file="$WORK/cg.out" \
    "$BIN" node --endpoint "unix://$SOCK" --node-id symbol-order --manifests "$WORK/manifests" \
    --metrics-addr "127.0.0.1:$PORT" 2> "$WORK/agent.log" &
  AGENT_PID=$!

  ready() { python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/readyz', timeout=2)" 2>/dev/null; }
  for _ in $(seq 600); do ready && break; kill -0 "$AGENT_PID" || { cat "$WORK/agent.log"; exit 1; }; sleep 0.2; done
  ready || { echo "the agent did not become ready under callgrind" >&2; tail "$WORK/agent.log" >&2; exit 1; }
  # What an idle agent on a node keeps running: kubelet's registration and the livenessprobe
  # sidecar (GetPluginInfo, Probe, NodeGetInfo), Prometheus scrapes and health checks.
  "$BIN" probe --endpoint "unix://$SOCK" >/dev/null
  for path in metrics healthz readyz; do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/$path', timeout=5).read()"
  done
  sleep 1
  callgrind_control --dump=start-up "$AGENT_PID" >/dev/null

  pub() { "$BIN" publish --endpoint "unix://$SOCK" --target "$WORK/pods/$1" --namespace shop --external-secret "$2" >/dev/null; }
  unpub() { "$BIN" unpublish --endpoint "unix://$SOCK" --target "$WORK/pods/$1" >/dev/null; }
  for es in plain fast templated; do
    pub "$es-a" "$es"; pub "$es-b" "$es"; pub "$es-a" "$es"
  done
  sleep 1.2
  pub fast-a fast
  pub missing no-such-external-secret 2>/dev/null || true
  for d in "$WORK"/pods/*; do unpub "$(basename "$d")"; done
  callgrind_control --dump=publish "$AGENT_PID" >/dev/null
  # A storm: more calls in flight at once than agent/src/memory.rs's burst, one shared fetch.
  local i pids=()
  for i in $(seq 40); do pub "storm-$i" slow & pids+=($!); done
  for i in "${pids[@]}"; do wait "$i"; done
  pids=()
  for i in $(seq 40); do unpub "storm-$i" & pids+=($!); done
  for i in "${pids[@]}"; do wait "$i"; done
  # The blocking threads' keep-alive (10 s) and the trim after it (2 s later).
  sleep 14
  callgrind_control --dump=storm "$AGENT_PID" >/dev/null
  kill "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null || true; AGENT_PID=""
  local start_file publish_file storm_file
  start_file=$(grep -l '^desc: Trigger: .*start-up' "$WORK"/cg.out* | head -n1)
  publish_file=$(grep -l '^desc: Trigger: .*publish' "$WORK"/cg.out* | head -n1)
  storm_file=$(grep -l '^desc: Trigger: .*storm' "$WORK"/cg.out* | head -n1)
  [ -n "$start_file" ] && [ -n "$publish_file" ] && [ -n "$storm_file" ] ||
    { echo "callgrind wrote no dumps" >&2; exit 1; }
  nm --defined-only --numeric-sort "$BIN" | awk '$2 ~ /^[tTwW]$/ && !seen[$3]++ {print $3}' > "$WORK/defined"
  names "$start_file" | sort > "$WORK/ran-start"
  names "$publish_file" | sort > "$WORK/ran-publish"
  comm -23 "$WORK/ran-start" "$WORK/ran-publish" > "$WORK/ran-start-only"
  comm -12 "$WORK/ran-start" "$WORK/ran-publish" > "$WORK/ran-shared"
  comm -13 "$WORK/ran-start" "$WORK/ran-publish" > "$WORK/ran-publish-only"
  in_order "$WORK/ran-start-only" > "$WORK/$name.start"
  in_order "$WORK/ran-shared" > "$WORK/$name.shared"
  in_order "$WORK/ran-publish-only" > "$WORK/$name.publish"
  names "$storm_file" | sort | comm -23 - <(sort -mu "$WORK/ran-start" "$WORK/ran-publish") > "$WORK/ran-storm"
  in_order "$WORK/ran-storm" > "$WORK/$name.storm"
  echo "    $name: $(wc -l < "$WORK/$name.start") start-up only, $(wc -l < "$WORK/$name.shared") start-up and publish, $(wc -l < "$WORK/$name.publish") publish only and $(wc -l < "$WORK/$name.storm") storm functions"
}

echo "==> cargo build --release, symbols kept"
LATCHKEY_KEEP_SYMBOLS=1 cargo build --release --locked -p latchkey
BIN="$TARGET_DIR/release/latchkey"
record "$BIN" host

# Start-up only, then what start-up and publishing share, then publishing only: start-up's code
# and the publish path's are each one stretch (they overlap in the middle), so an idle agent maps
# few windows and a warm publish runs through one stretch of code.
cat "$WORK/host.start" "$WORK/host.shared" "$WORK/host.publish" "$WORK/host.storm" > "$WORK/ran"
nm --defined-only -S "$BIN" | awk 'NF == 4 && $3 ~ /^[tTwW]$/ {print $2, $4}' > "$WORK/sizes"
# Each name without what changes from build to build (agent/build.rs): a legacy name's hash and
# any suffix after it, the crate hashes of a v0 name, LTO's numbered copies of any other name.
# Such a name stands for every instance of a generic function, and the hot code of most generic
# ones is one or two instances among dozens (`<&T as Debug>::fmt` has 1,370, 0.7 MB): with all
# of them packed, idle RSS was 13 MiB instead of 8. So a name that stands for more than
# SHARED_AT_MOST functions of this build is kept whole, hash and all: exact, but only for this
# build, and stale after a dependency change, when scripts/bench-go-csi.sh says so.
python3 - "$WORK/ran" "$WORK/sizes" "$WORK/hot-bytes" > "$WORK/list" <<'PY'
import collections, re, sys
SHARED_AT_MOST = 3
def pattern(name):
    m = re.match(r"(_ZN.*17h)[0-9a-f]{16}E", name)
    if m:
        return m.group(1) + "*"
    if name.startswith("_R"):
        name = re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", name)
    return re.sub(r"\.(llvm\.)?[0-9]+$", "", name)
sizes = [(int(size, 16), name) for size, name in (l.split() for l in open(sys.argv[2]))]
shared = collections.Counter(pattern(name) for _, name in sizes)
listed, seen = [], set()
for name in open(sys.argv[1]).read().split():
    entry = pattern(name) if shared[pattern(name)] <= SHARED_AT_MOST else name
    if entry not in seen:
        seen.add(entry)
        listed.append(entry)
print("\n".join(listed))
# What the list packs in this build, for scripts/bench-go-csi.sh to tell a stale list by.
hot = sum(size for size, name in sizes if name in seen or pattern(name) in seen)
open(sys.argv[3], "w").write(str(hot))
PY
HOT_BYTES=$(cat "$WORK/hot-bytes")
{
  echo "# Functions of the release latchkey binary that run at start-up only, at start-up and on the"
  echo "# publish path, on the publish path only, then in a mount storm only; most names without"
  echo "# their hashes (agent/build.rs). Written by scripts/symbol-order.sh on $(date -u +%F) with"
  echo "# $(rustc --version); read by agent/build.rs."
  echo "# hot-bytes: $HOT_BYTES"
  cat "$WORK/list"
} > "$ORDER.tmp"
mv "$ORDER.tmp" "$ORDER"
echo "==> $ORDER: $(grep -vc '^#' "$ORDER") names ($(grep -c '\*$' "$ORDER") without hash), $((HOT_BYTES / 1024)) KiB of code; rebuild to use it (cargo build --release -p latchkey)"
