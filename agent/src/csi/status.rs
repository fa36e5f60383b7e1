//! The one place where domain errors become gRPC status codes (see DESIGN.md, "The CSI contract").

use tonic::{Code, Status};

use super::request::RequestError;
use crate::catalog::{BindingError, CatalogError};
use crate::compute::ComputeError;
use crate::generators::GeneratorError;
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

fn provider_code(e: &ProviderError) -> Code {
    match e {
        ProviderError::CannotFind
        | ProviderError::NotFound
        | ProviderError::Config(_)
        | ProviderError::Unsupported(_) => Code::FailedPrecondition,
        ProviderError::PermissionDenied(_) => Code::PermissionDenied,
        ProviderError::Unavailable(_) => Code::Unavailable,
        ProviderError::Throttled(_) | ProviderError::TooLarge(_) => Code::ResourceExhausted,
        ProviderError::Timeout(_) => Code::DeadlineExceeded,
    }
}

fn code(e: &PublishError) -> Code {
    match e {
        PublishError::Binding(b) => match b {
            BindingError::ExternalSecretNotFound { .. }
            | BindingError::InvalidExternalSecret { .. }
            | BindingError::StoreNotFound { .. }
            | BindingError::InvalidStore { .. }
            | BindingError::ProviderNotFound { .. }
            | BindingError::GeneratorNotFound { .. }
            | BindingError::InvalidGenerator { .. } => Code::FailedPrecondition,
            BindingError::NotAdmitted { .. } | BindingError::GeneratorNotAdmitted { .. } => {
                Code::PermissionDenied
            }
            BindingError::Catalog {
                source:
                    CatalogError::Unusable { .. }
                    | CatalogError::NotLoaded { .. }
                    | CatalogError::ProviderCrdMissing { .. },
                ..
            } => Code::FailedPrecondition,
            BindingError::Catalog { .. } => Code::Unavailable,
        },
        PublishError::Provider { source, .. } => provider_code(source),
        PublishError::Generator { source, .. } => match source {
            GeneratorError::Backend(p) => provider_code(p),
            GeneratorError::Invalid(_) | GeneratorError::Unimplemented(_) => {
                Code::FailedPrecondition
            }
        },
        PublishError::GeneratorState { .. } => Code::Unavailable,
        PublishError::Resolve(r) => match r {
            ResolveError::Files { .. } => Code::InvalidArgument,
            ResolveError::Template { .. } => Code::InvalidArgument,
            ResolveError::NotFetched { .. } => Code::Internal,
            ResolveError::Bound { .. } => Code::ResourceExhausted,
            ResolveError::Deadline { .. } => Code::DeadlineExceeded,
            ResolveError::PropertyNotFound { .. }
            | ResolveError::NotJson { .. }
            | ResolveError::NotAnObject { .. }
            | ResolveError::Decode { .. }
            | ResolveError::BadRewrite { .. }
            | ResolveError::BadFind { .. }
            | ResolveError::NotGenerated { .. }
            | ResolveError::Unsupported { .. } => Code::FailedPrecondition,
        },
        PublishError::Volume { source, .. } => volume_code(source),
        PublishError::Compute { source, .. } => match source {
            ComputeError::TimedOut(_) => Code::DeadlineExceeded,
            ComputeError::Busy => Code::ResourceExhausted,
            ComputeError::Panicked => Code::Internal,
        },
        PublishError::Internal(_) => Code::Internal,
    }
}

fn volume_code(e: &VolumeError) -> Code {
    match e.class() {
        ErrorClass::InvalidArgument => Code::InvalidArgument,
        ErrorClass::ResourceExhausted => Code::ResourceExhausted,
        ErrorClass::FailedPrecondition => Code::FailedPrecondition,
        ErrorClass::Internal => Code::Internal,
    }
}
