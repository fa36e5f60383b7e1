//! Container Storage Interface (CSI) v1 protocol for Latchkey.
//!
//! Rust types for the CSI spec v1.12 protobuf (`csi.v1`) with tonic servers
//! and clients for the Identity, Controller and Node services (plus the
//! GroupController and SnapshotMetadata services), generated at build time
//! from `proto/csi.proto`. Requests that carry credentials have a redacting
//! `Debug` implementation (see [`redact`]), so they are safe to log.
//!
//! Also the External Secret Store plugin protocol (`ess.proto.v1alpha1`, from
//! `proto/ess.proto`), which Latchkey speaks to out-of-tree secret-store
//! plugins: see [`ess`]. And the Secrets Store CSI Driver's provider protocol
//! (`v1alpha1.CSIDriverProvider`, from `proto/secrets_store_provider.proto`),
//! which Latchkey speaks to that driver's provider pods: see [`secrets_store`].
//! And Latchkey's own plugin protocol (`latchkey.plugin.v1`, from
//! `proto/latchkey_plugin.proto`): see [`latchkey_plugin`].

/// Generated CSI v1 messages, servers (`*_server`) and clients (`*_client`).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

/// The External Secret Store plugin protocol, as Crossplane defined it.
pub mod ess {
    /// Generated `ess.proto.v1alpha1` messages, server and client.
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1alpha1 {
        tonic::include_proto!("ess.proto.v1alpha1");
    }
}

/// The Secrets Store CSI Driver's provider protocol.
pub mod secrets_store {
    /// Generated `v1alpha1` messages (the driver's package name), server and client.
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
}

/// Latchkey's own secret-store plugin protocol: identity, listing, versions, handshake.
pub mod latchkey_plugin {
    /// Generated `latchkey.plugin.v1` messages, server and client.
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1 {
        tonic::include_proto!("latchkey.plugin.v1");
    }

    /// Full name of the `latchkey.plugin.v1` service, as a `VersionResponse` lists it.
    pub const SERVICE: &str = "latchkey.plugin.v1.SecretStorePlugin";
    /// Full name of the ESS service, as a `VersionResponse` lists it.
    pub const ESS_SERVICE: &str = "ess.proto.v1alpha1.ExternalSecretStorePluginService";
}

pub mod redact;
