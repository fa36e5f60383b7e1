//! The CSI edge: the only module that knows gRPC. It parses requests into domain types, calls the
//! publish path, and maps domain errors to status codes in one place ([`status`]).

pub mod client;
pub mod connection;
pub mod controller;
pub mod endpoint;
pub mod identity;
pub mod node;
pub mod request;
pub mod server;
pub mod status;

/// The driver version reported to kubelet.
pub const DRIVER_VERSION: &str = env!("CARGO_PKG_VERSION");
