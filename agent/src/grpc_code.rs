//! gRPC status codes by name: the CSI edge labels its metrics with them and the plugin provider
//! names a plugin's answer with them, so the mapping lives below both.

use tonic::Code;

/// A gRPC code as a bounded metrics label (`failed_precondition`, ...).
pub fn label(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The gRPC name of a code (`PERMISSION_DENIED`).
pub fn name(code: Code) -> String {
    label(code).to_ascii_uppercase()
}
