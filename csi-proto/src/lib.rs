//! Container Storage Interface (CSI) v1 protocol for Latchkey.
//!
//! Rust types for the CSI spec v1.12 protobuf (`csi.v1`) with tonic servers
//! and clients for the Identity, Controller and Node services (plus the
//! GroupController and SnapshotMetadata services), generated at build time
//! from `proto/csi.proto`. Requests that carry credentials have a redacting
//! `Debug` implementation (see [`redact`]), so they are safe to log.

/// Generated CSI v1 messages, servers (`*_server`) and clients (`*_client`).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

pub mod redact;
