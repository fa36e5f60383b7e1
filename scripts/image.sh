#!/usr/bin/env bash
# Builds the latchkey image from the Dockerfile, offline, with Debian's podman (or buildah): the
# Dockerfile is `FROM scratch` and copies only what this script lays out in its build context,
# target/image/:
#   dist/<arch>/latchkey   a static binary per platform (amd64, arm64)
#   rootfs/                /etc/passwd and /etc/group (root, nonroot 65532), nsswitch.conf, the
#                          host's CA bundle (/etc/ssl/certs/ca-certificates.crt), /tmp
#
# Usage: scripts/image.sh [--target TRIPLE]... [--binary PATH] [--tag NAME] [--context-only]
#   --target TRIPLE  build for this Rust target (repeatable; default: the host's). Each is built
#                    as the release image is: `cargo build --release --locked -p latchkey
#                    --target TRIPLE` with RUSTFLAGS="-C target-feature=+crt-static" (~11 min on
#                    2 cores: fat LTO). Another architecture needs `rustup target add` and a
#                    cross linker (CARGO_TARGET_<TRIPLE>_LINKER).
#   --binary PATH    use this already built static binary instead (one target only); CI feeds a
#                    cheap static debug build this way (scripts/test.sh).
#   --tag NAME       default ghcr.io/latchkey-dev/latchkey:<Cargo.toml version>. With several
#                    targets NAME is a manifest list holding one image per platform.
#   --context-only   lay out target/image/ and stop: for a registry build with BuildKit.
#
# The registry build (multi-arch) uses the same Dockerfile on the context this script makes:
#   scripts/image.sh --context-only --target x86_64-unknown-linux-gnu --target aarch64-unknown-linux-gnu
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=<version> \
#     --build-arg REVISION="$(git rev-parse HEAD)" -t ghcr.io/latchkey-dev/latchkey:<version> \
#     --push -f Dockerfile target/image
# (or, here: scripts/image.sh --target ... --target ... and `podman manifest push`).
#
# Runs as root (podman stores images in /var/lib/containers). Installs podman from Debian's
# packages when neither podman nor buildah is there: a missing builder fails, it never skips.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0" >&2; exit "$1"; }

targets=() binary="" tag="" context_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --target) targets+=("${2:?--target needs a triple}"); shift 2 ;;
    --binary) binary=$(cd "$caller_dir" && realpath -e "${2:?--binary needs a path}"); shift 2 ;;
    --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
    --context-only) context_only=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "scripts/image.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("$(uname -m)-unknown-linux-gnu")
if [ -n "$binary" ] && [ ${#targets[@]} -ne 1 ]; then
  echo "scripts/image.sh: --binary is one binary for one target, got ${#targets[@]}" >&2
  exit 2
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
tag="${tag:-ghcr.io/latchkey-dev/latchkey:$version}"

# The platform's architecture as OCI (and the Dockerfile's TARGETARCH) names it.
arch_of() {
  case "${1%%-*}" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    *) echo "scripts/image.sh: no image architecture known for target $1" >&2; exit 2 ;;
  esac
}

# The image holds no libc: a dynamically linked binary would not even start.
require_static() {
  if ! ldd "$1" 2>&1 | grep -qE 'statically linked|not a dynamic executable'; then
    echo "scripts/image.sh: $1 is not statically linked (build it with" \
         "RUSTFLAGS='-C target-feature=+crt-static' and --target)" >&2
    exit 1
  fi
}

ctx=target/image
rm -rf "$ctx"
mkdir -p "$ctx/rootfs/etc/ssl/certs" "$ctx/rootfs/tmp"
chmod 1777 "$ctx/rootfs/tmp"

platforms=()
for triple in "${targets[@]}"; do
  arch=$(arch_of "$triple")
  mkdir -p "$ctx/dist/$arch"
  if [ -n "$binary" ]; then
    built="$binary"
  else
    echo "==> cargo build --release --target $triple (static)"
    RUSTFLAGS="-C target-feature=+crt-static" \
      cargo build --release --locked -p latchkey --target "$triple"
    built="target/$triple/release/latchkey"
  fi
  # ldd cannot read another architecture's binary; those are checked by the target's linker.
  [ "$arch" != "$(arch_of "$(uname -m)-")" ] || require_static "$built"
  cp "$built" "$ctx/dist/$arch/latchkey"
  platforms+=("linux/$arch")
done

if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
  echo "==> apt-get install ca-certificates (the image's CA bundle)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates >/dev/null
fi
cp /etc/ssl/certs/ca-certificates.crt "$ctx/rootfs/etc/ssl/certs/"
# Root for the node agent (its DaemonSet runs as 0), nonroot for the controller, as distroless
# names them; no login shell exists.
cat > "$ctx/rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$ctx/rootfs/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
echo 'hosts: files dns' > "$ctx/rootfs/etc/nsswitch.conf"
chmod 0644 "$ctx/rootfs/etc/"{passwd,group,nsswitch.conf} "$ctx/rootfs/etc/ssl/certs/ca-certificates.crt"

if [ "$context_only" = 1 ]; then
  echo "==> build context in $ctx for ${platforms[*]}"
  exit 0
fi

if ! command -v podman >/dev/null && ! command -v buildah >/dev/null; then
  echo "==> apt-get install podman"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null
fi
builder=(podman build)
command -v podman >/dev/null || builder=(buildah build)
platform_list=$(IFS=,; echo "${platforms[*]}")
if [ ${#platforms[@]} -eq 1 ]; then
  name=(--tag "$tag")
else
  # A manifest list is added to, not replaced: start it afresh.
  "${builder[0]}" manifest rm "$tag" >/dev/null 2>&1 || true
  name=(--manifest "$tag")
fi
echo "==> ${builder[*]} --platform $platform_list $tag"
# No RUN step: nothing runs during the build, so it needs no network, cgroups or emulation.
"${builder[@]}" --quiet --network=none --platform "$platform_list" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  "${name[@]}" -f Dockerfile "$ctx" >/dev/null
if [ ${#platforms[@]} -eq 1 ]; then
  echo "==> $tag: $("${builder[0]}" images --format '{{.Size}}' "$tag" | head -1)"
else
  echo "==> $tag: manifest list for $platform_list"
fi
