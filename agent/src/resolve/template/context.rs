//! The evaluation context of one ExternalSecret's templates: the variables `secret` and `pod`,
//! and the hidden functions bound to its [`Budget`] (`@charge`, which the instrumentation wraps
//! values in, and `@matches`, the bounded `matches`).
//!
//! Not for the functions that need no per-evaluation state (see `functions`), nor for the
//! budget's accounting (see `budget`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use cel::common::types::{CelBool, CelBytes, CelMap, CelMapKey, CelString};
use cel::common::value::{CowVal, Val};
use cel::{ExecutionError, FunctionContext};

use super::TemplatePod;
use super::args::text_arg;
use super::budget::Budget;
use super::functions::{CompiledPattern, ENV};
use super::instrument::{CHARGE, MATCHES};
use crate::secret::SecretBytes;

/// Distinct `matches` patterns kept compiled per evaluation; more are compiled on every call
/// (and charged each time).
const MAX_COMPILED_PATTERNS: usize = 64;

type ContextFn = Box<
    dyn for<'c, 'v> Fn(&mut FunctionContext<'c, 'v>) -> Result<CowVal<'c, 'v>, ExecutionError>
        + Send
        + Sync,
>;

/// The evaluation context: `secret` borrows the resolved values, `pod` is set when known.
pub(super) fn cel_context<'v>(
    resolved: &'v BTreeMap<String, SecretBytes>,
    pod: Option<&TemplatePod>,
    budget: &Arc<Budget>,
) -> cel::Context<'v, 'v> {
    let mut cel = cel::Context::with_env(Arc::clone(&ENV));
    let secret: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = resolved
        .iter()
        .map(|(k, v)| {
            let value: Box<dyn Val + 'v> = match std::str::from_utf8(v.expose()) {
                Ok(s) => Box::new(CelString::from(s)),
                Err(_) => Box::new(CelBytes::from(v.expose())),
            };
            (CelMapKey::from(k.as_str()), value)
        })
        .collect();
    cel.add_variable_as_val("secret", Box::new(CelMap::from(secret)));
    if let Some(pod) = pod {
        let fields: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = [
            ("namespace", &pod.namespace),
            ("name", &pod.name),
            ("serviceAccountName", &pod.service_account),
        ]
        .into_iter()
        .map(|(k, v)| {
            let v: Box<dyn Val + 'v> = Box::new(CelString::from(v.clone()));
            (CelMapKey::from(k), v)
        })
        .collect();
        cel.add_variable_as_val("pod", Box::new(CelMap::from(fields)));
    }
    let b = Arc::clone(budget);
    let charge: ContextFn = Box::new(move |ftx| {
        let v = ftx
            .args
            .pop()
            .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
        b.charge(v.as_ref())?;
        Ok(v)
    });
    let b = Arc::clone(budget);
    // Each distinct pattern is compiled once per evaluation, however often it is called.
    let compiled: Mutex<HashMap<String, Arc<CompiledPattern>>> = Mutex::default();
    let matches: ContextFn = Box::new(move |ftx| {
        let [text, pattern] = ftx.args.as_slice() else {
            return Err(ExecutionError::invalid_argument_count(2, ftx.args.len()));
        };
        let text = text_arg("matches", text.as_ref())?;
        let pattern = text_arg("matches", pattern.as_ref())?;
        let known = compiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pattern)
            .cloned();
        let regex = match known {
            Some(r) => r,
            None => {
                let r = Arc::new(CompiledPattern::compile(&b, pattern)?);
                let mut cache = compiled.lock().unwrap_or_else(|p| p.into_inner());
                if cache.len() < MAX_COMPILED_PATTERNS {
                    cache.insert(pattern.to_owned(), Arc::clone(&r));
                }
                r
            }
        };
        let found = regex.is_match(&b, text)?;
        Ok(CowVal::owned(CelBool::from(found)))
    });
    for (name, function) in [(CHARGE, charge), (MATCHES, matches)] {
        if let Err(e) = cel.add_function(name, function) {
            unreachable!("{name} is no overload: {e}");
        }
    }
    cel
}
