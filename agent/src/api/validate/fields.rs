//! The field checks every validator shares: names, patterns, modes, list lengths.

use std::fmt::Display;

use super::Invalid;
use crate::api::rules::{self, Pattern};
use crate::api::store::SecretKeySelector;

/// The `name` of the credential Secret `selector` (at `path`) points at.
pub(super) fn secret_name(path: impl Display, selector: &SecretKeySelector) -> Result<(), Invalid> {
    name(format_args!("{path}.name"), &selector.name)
}

/// The names of the options that are set.
pub(super) fn set_names<'a>(options: &[(&'a str, bool)]) -> Vec<&'a str> {
    options
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect()
}

/// A string whose schema has a `maxLength` (counted in characters, as the API server does) and a
/// `pattern`.
pub(super) fn shaped(
    path: impl Display,
    s: &str,
    max_len: usize,
    pattern: &Pattern,
) -> Result<(), Invalid> {
    if s.chars().count() > max_len {
        return Err(Invalid::schema(path, rules::too_long(max_len)));
    }
    if !pattern.is_match(s) {
        return Err(Invalid::pattern(path, pattern));
    }
    Ok(())
}

/// The name of a store, Secret or service account.
pub(super) fn name(path: impl Display, s: &str) -> Result<(), Invalid> {
    shaped(path, s, rules::MAX_NAME_LEN, &rules::DNS_SUBDOMAIN)
}

pub(super) fn file_mode(path: impl Display, mode: Option<i32>) -> Result<(), Invalid> {
    match mode {
        Some(m) if !(0..=0o777).contains(&m) => Err(Invalid::rule(path, &rules::FILE_MODE)),
        _ => Ok(()),
    }
}

pub(super) fn not_empty(path: impl Display, s: &str) -> Result<(), Invalid> {
    if s.is_empty() {
        return Err(Invalid::rule(path, &rules::NOT_EMPTY));
    }
    Ok(())
}

pub(super) fn max_items(path: impl Display, len: usize, max: usize) -> Result<(), Invalid> {
    if len > max {
        return Err(Invalid::schema(path, rules::too_many_items(max)));
    }
    Ok(())
}
