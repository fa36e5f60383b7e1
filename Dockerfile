# syntax=docker/dockerfile:1
# The latchkey image: one statically linked binary (glibc, +crt-static) on distroless/static,
# which holds CA certificates (rustls-native-certs reads them for AWS and Vault), /etc/passwd with
# the nonroot user and nothing else: no shell, no libc, no package manager.
#
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/latchkey-dev/latchkey:0.1.0 .
#
# No Docker engine runs on the developers' machines or in CI: this file is reviewed, not built,
# there (docs/install.md). Static glibc (2.36 here) still resolves host names without shared NSS
# libraries, from /etc/hosts and resolv.conf's nameservers, whatever the linker's getaddrinfo
# warning says: checked in a chroot holding only a static binary and /etc.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The release profile (fat LTO, one codegen unit) takes ~11 min on 2 cores; agent/build.rs strips
# the binary and lays out the functions listed in agent/link/hot-functions.order together (this
# exact build is one of the two scripts/symbol-order.sh records, so its names are in the list).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p latchkey --target x86_64-unknown-linux-gnu \
 && cp target/x86_64-unknown-linux-gnu/release/latchkey /latchkey \
 && /latchkey --version

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="latchkey" \
      org.opencontainers.image.description="Secrets from external secret managers, mounted as files by a CSI node agent" \
      org.opencontainers.image.source="https://github.com/latchkey-dev/latchkey" \
      org.opencontainers.image.url="https://github.com/latchkey-dev/latchkey" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /latchkey /usr/local/bin/latchkey
# Non-root for the mirror controller (its Deployment also sets runAsNonRoot). The node
# DaemonSet overrides this with runAsUser: 0 and privileged: true: mounting tmpfs volumes into
# kubelet's pod directories needs both.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/latchkey"]
