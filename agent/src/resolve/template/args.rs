//! What the functions registered for templates share: reading a string argument, returning a
//! string, and building their errors, which are fixed texts (plus type names and limits), never
//! values. Used by `functions`, `format` and the `matches` binding in `context`.
//!
//! Not for the functions themselves (see `functions` and `format`), nor for describing `cel`'s own
//! errors (see `errors`).

use cel::ExecutionError;
use cel::common::types::CelString;
use cel::common::value::{CowVal, Val};

use super::MAX_VALUE_BYTES;
use super::errors::type_name;

/// The error of `function`, with a message that must not contain a value.
pub(super) fn fail(function: &str, message: impl Into<String>) -> ExecutionError {
    ExecutionError::function_error(function, message.into())
}

/// The error of `function` when its result would exceed [`MAX_VALUE_BYTES`].
pub(super) fn too_large(function: &str) -> ExecutionError {
    fail(
        function,
        format!("the result would be larger than {MAX_VALUE_BYTES} bytes"),
    )
}

/// `v` as a string, or an error of `function` naming only the type it got.
pub(super) fn text_arg<'a>(function: &str, v: &'a dyn Val) -> Result<&'a str, ExecutionError> {
    v.downcast_ref::<CelString>()
        .map(|s| s.inner())
        .ok_or_else(|| {
            fail(
                function,
                format!(
                    "expected a string, got a {}",
                    type_name(v.get_type().name())
                ),
            )
        })
}

/// A function's string result.
pub(super) fn string_result<'b, 'v>(s: String) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(CelString::from(s)))
}
