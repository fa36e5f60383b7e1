//! `spec.template` of a PushSecret: the source Secret's keys turned into the keys that
//! `data[].match.secretKey` picks, by the CEL templates of ExternalSecrets (the same evaluator,
//! bounds and cost budget, [`crate::resolve::template`]): the templates see the Secret's keys as
//! `secret`, as they see an ExternalSecret's resolved entries. `mergePolicy: Replace` (default)
//! keeps only the template's keys, `Merge` the Secret's keys plus the template's (which win).
//! Evaluation runs on the compute pool, never on an async worker, within its time limit.

use std::collections::BTreeMap;

use crate::api::StoreKind;
use crate::api::push_secret::PushSecretTemplate;
use crate::compute::{ComputeError, Pool};
use crate::resolve::{Context, ResolveError, template};
use crate::secret::SecretBytes;

/// Why a template gave no keys. Names the PushSecret and the template key, never a value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// An expression is invalid, fails, or exceeds a bound.
    #[error("PushSecret {push_secret}: spec.template.data[{key:?}]: {reason}")]
    Failed {
        /// `namespace/name` of the PushSecret.
        push_secret: String,
        /// The template key.
        key: String,
        /// What is wrong (the evaluator's text, which holds no value).
        reason: String,
    },
    /// The evaluation did not run to its end (time limit, busy pool).
    #[error("PushSecret {push_secret}: spec.template: {reason}")]
    Compute {
        /// `namespace/name` of the PushSecret.
        push_secret: String,
        /// Why.
        reason: ComputeError,
    },
}

/// The keys the PushSecret `namespace/name` pushes from, given its source's `data`: `data`
/// itself without a template (or one without keys, as for ExternalSecrets), else what the
/// template computes from it.
pub async fn apply(
    pool: &Pool,
    namespace: &str,
    name: &str,
    template: Option<&PushSecretTemplate>,
    data: BTreeMap<String, SecretBytes>,
) -> Result<BTreeMap<String, SecretBytes>, TemplateError> {
    let Some(t) = template.filter(|t| !t.template.data.is_empty()) else {
        return Ok(data);
    };
    let push_secret = format!("{namespace}/{name}");
    let ctx = Context {
        namespace: namespace.to_string(),
        external_secret: name.to_string(),
        store_kind: StoreKind::SecretStore,
        store_name: String::new(),
    };
    let t = t.template.clone();
    // No `pod`: a PushSecret has none, and a template that reads it fails, naming it.
    let run = pool
        .run_fallible(namespace, move || template::apply(&ctx, &t, data, None))
        .await;
    match run {
        Ok(Ok(keys)) => Ok(keys),
        Ok(Err(ResolveError::Template { key, reason, .. })) => Err(TemplateError::Failed {
            push_secret,
            key,
            reason: reason.replace("of the ExternalSecret", "of the PushSecret"),
        }),
        // The evaluator reports nothing else; kept apart so a new kind is not silently renamed.
        Ok(Err(other)) => Err(TemplateError::Failed {
            push_secret,
            key: String::new(),
            reason: other.to_string(),
        }),
        Err(reason) => Err(TemplateError::Compute {
            push_secret,
            reason,
        }),
    }
}

#[cfg(test)]
mod tests;
