# syntax=docker/dockerfile:1
# The latchkey image: one statically linked binary (glibc, +crt-static) and the few files it
# reads: CA certificates (rustls-native-certs reads them for AWS and Vault), /etc/passwd and
# /etc/group with root and the nonroot user 65532, nsswitch.conf and /tmp. No shell, no libc, no
# package manager, no base image: `FROM scratch` builds offline, from the build context alone.
#
# The context is made by scripts/image.sh (target/image/): dist/<arch>/latchkey per platform and
# rootfs/. It builds the image with podman or buildah, or only lays out the context
# (`--context-only`) for a registry build of several platforms from this same file:
#
#   scripts/image.sh --context-only --target x86_64-unknown-linux-gnu --target aarch64-unknown-linux-gnu
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=0.1.0 \
#     -t ghcr.io/latchkey-dev/latchkey:0.1.0 --push -f Dockerfile target/image
#
# Static glibc (2.36 here) still resolves host names without shared NSS libraries, from
# /etc/hosts and resolv.conf's nameservers, whatever the linker's getaddrinfo warning says:
# checked in a chroot holding only a static binary and /etc.

FROM scratch
# Set by BuildKit, podman and buildah from --platform: amd64, arm64.
ARG TARGETARCH
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="latchkey" \
      org.opencontainers.image.description="Secrets from external secret managers, mounted as files by a CSI node agent" \
      org.opencontainers.image.source="https://github.com/latchkey-dev/latchkey" \
      org.opencontainers.image.url="https://github.com/latchkey-dev/latchkey" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY rootfs/ /
COPY dist/${TARGETARCH}/latchkey /usr/local/bin/latchkey
# Non-root for the mirror controller (its Deployment also sets runAsNonRoot). The node
# DaemonSet overrides this with runAsUser: 0 and privileged: true: mounting tmpfs volumes into
# kubelet's pod directories needs both.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/latchkey"]
