//! The one place where domain errors become gRPC status codes (see DESIGN.md, "The CSI contract").

use tonic::{Code, Status};

use super::request::RequestError;
use crate::catalog::BindingError;
use crate::providers::ProviderError;
use crate::publish::PublishError;
use crate::resolve::ResolveError;
use crate::volume::{ErrorClass, VolumeError};

/// A malformed request.
pub fn from_request(e: &RequestError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// A failed publish or unpublish.
pub fn from_publish(e: &PublishError) -> Status {
    Status::new(code(e), e.to_string())
}

fn code(e: &PublishError) -> Code {
    match e {
        PublishError::Binding(b) => match b {
            BindingError::ExternalSecretNotFound { .. }
            | BindingError::InvalidExternalSecret { .. }
            | BindingError::StoreNotFound { .. }
            | BindingError::InvalidStore { .. } => Code::FailedPrecondition,
            BindingError::NotAdmitted { .. } => Code::PermissionDenied,
            BindingError::Catalog { .. } => Code::Unavailable,
        },
        PublishError::Provider { source, .. } => match source {
            ProviderError::NotFound | ProviderError::Unsupported(_) => Code::FailedPrecondition,
            ProviderError::PermissionDenied(_) => Code::PermissionDenied,
            ProviderError::Unavailable(_) => Code::Unavailable,
            ProviderError::Throttled(_) => Code::ResourceExhausted,
            ProviderError::Timeout(_) => Code::DeadlineExceeded,
        },
        PublishError::Resolve(r) => match r {
            ResolveError::Files { .. } => Code::InvalidArgument,
            ResolveError::NotFetched { .. } => Code::Internal,
            ResolveError::PropertyNotFound { .. }
            | ResolveError::NotJson { .. }
            | ResolveError::NotAnObject { .. }
            | ResolveError::Decode { .. }
            | ResolveError::BadRewrite { .. }
            | ResolveError::Unsupported { .. } => Code::FailedPrecondition,
        },
        PublishError::Volume { source, .. } => volume_code(source),
        PublishError::Internal(_) => Code::Internal,
    }
}

fn volume_code(e: &VolumeError) -> Code {
    match e.class() {
        ErrorClass::InvalidArgument => Code::InvalidArgument,
        ErrorClass::ResourceExhausted => Code::ResourceExhausted,
        ErrorClass::Internal => Code::Internal,
    }
}
