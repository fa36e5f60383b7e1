//! Latchkey: a CSI node agent that resolves ExternalSecret references with the pod's identity and
//! writes the values as files into a fresh tmpfs.
//!
//! Data flows one way: CSI request ([`csi`]) -> pod identity ([`identity`]) -> catalog binding
//! ([`catalog`]) -> fetch through the shared cache ([`fetch`], [`cache`]) from the providers
//! ([`providers`]) -> resolution ([`resolve`]) -> volume ([`volume`]); [`publish`] strings the
//! steps together.

pub mod api;
pub mod cache;
pub mod catalog;
pub mod cluster_external_secret;
pub mod cmd;
pub mod compute;
pub mod convert;
pub mod csi;
pub mod events;
pub mod fetch;
pub mod generator_gc;
pub mod generators;
pub mod grpc_code;
pub mod identity;
pub mod json;
pub mod memory;
pub mod mirror;
pub mod provider_status;
pub mod providers;
pub mod publish;
pub mod push_secret;
pub mod resolve;
pub mod secret;
pub mod telemetry;
pub mod tls;
pub mod volume;
