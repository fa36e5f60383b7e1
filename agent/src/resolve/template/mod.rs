//! `target.template.data`: output entries computed by CEL expressions (the `cel` crate) over
//! `secret` (the resolved entries: a map of strings, or of bytes where a value is not UTF-8) and,
//! on mounts, `pod` (`{namespace, name, serviceAccountName}`).
//!
//! # Functions
//!
//! The CEL standard library (operators, `size`, `contains`, `startsWith`, `endsWith`,
//! conversions such as `string()`, `bytes()` and `int()`, `has()`, and the macros `all`, `exists`,
//! `exists_one`, `map` and `filter`), plus:
//!
//! * `matches(regex)` (RE2 syntax; the compiled pattern is at most 256 KiB);
//! * `'...'.format(list)`: `%s` (any value), `%d` (int, uint), `%f` and `%.Nf` (number, N ≤ 100),
//!   `%x` / `%X` (int, uint, string, bytes) and `%%`, as in cel-go's strings extension;
//! * `base64.encode(bytes | string)` -> string and `base64.decode(string)` -> bytes (standard
//!   alphabet, padding optional);
//! * `json.parse(string | bytes)` -> map, list, string, number, bool or null (integral numbers are
//!   ints, or uints beyond the int range; others doubles);
//! * on strings: `lowerAscii()`, `upperAscii()`, `trim()`, `replace(old, new)`, `split(sep)`; on
//!   lists of strings: `join()` and `join(sep)`.
//!
//! # Output
//!
//! A string is written as its UTF-8 bytes, bytes as they are, a number or bool as its text, a map
//! or list as JSON (keys sorted; bytes inside as base64); `null` is an error. With the default
//! `mergePolicy: Replace` the entries are only the template keys; `Merge` keeps the resolved
//! entries and lets the template keys override them.
//!
//! # Bounds
//!
//! Templates are written by whoever may create an ExternalSecret, so evaluation is bounded before
//! and while it runs:
//!
//! * before parsing: an expression is at most [`MAX_EXPRESSION_BYTES`] long and nests brackets and
//!   conditionals at most [`MAX_NESTING`] deep (a lexical count, so that no input can exhaust the
//!   parser's stack; parsing and evaluation run on a thread with a large stack, as the parser
//!   needs far more per level than one expects);
//! * after parsing: the syntax tree is at most [`MAX_AST_DEPTH`] deep (this also catches long
//!   operator chains, `a + a + ...`, which nest without brackets) and comprehensions nest at most
//!   [`MAX_COMPREHENSION_NESTING`] deep;
//! * while evaluating: `cel` has no cost tracking, so the syntax tree is instrumented: every node
//!   that produces a value passes it through a hidden function that measures it (string and bytes
//!   length; [`ELEMENT_COST`] per list element or map entry on top of their contents). A value
//!   larger than [`MAX_VALUE_BYTES`] stops evaluation, and so does the sum of all measured values
//!   of all templates of an ExternalSecret exceeding [`COST_BUDGET`]. As every operation available
//!   takes time and space linear in its inputs (the functions registered here check their result
//!   size before building it), this bounds both time and memory, comprehensions included: each
//!   iteration's values are charged as they are produced. The one exception, `matches` (a
//!   regular-expression search takes up to compiled-states x text steps), is replaced by a
//!   version that compiles each distinct pattern once per evaluation, spends the compiled size,
//!   and spends text length x (compiled states / 16 + 1) before each search.
//! * in time: evaluation stops when the publish's wall-clock deadline passes (see
//!   [`crate::compute`]); it runs on the compute pool, never on an async worker.
//! * the output of one key is at most [`MAX_VALUE_BYTES`], of all keys [`MAX_TOTAL_OUTPUT_BYTES`].
//!
//! Errors name the output key and what is wrong, never a value: `cel`'s error messages may embed
//! runtime values, so each error kind is mapped to a fixed text, and names (keys, functions,
//! variables) are only repeated when they appear in the expression itself.
//!
//! # Layout
//!
//! This module holds the public API, the bounds and the flow: compile (`limits` before and after
//! parsing, then `instrument`; compiled programs are kept by `programs`), evaluate against a
//! `context` that charges a shared `budget`, and write the result out (`output`). The functions
//! available to expressions are in `functions` and `format`, and the helpers they share in
//! `args`; `errors` turns `cel` errors into messages without values.
//!
//! Dependencies between these flow one way: `errors` uses none of them; `args` and `output` use
//! `errors`; `format` uses those three; `functions` uses `format`, `args` and `budget`; `context`
//! uses `functions`. Children read the bounds from this module.

mod args;
mod budget;
mod context;
mod errors;
mod format;
mod functions;
mod instrument;
mod limits;
mod output;
mod programs;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use cel::Value;
use cel::common::ast::IdedExpr;

use self::budget::{Budget, Stop};
use self::context::cel_context;
use self::errors::{describe, parse_error};
use self::functions::{ENV, OWN_FUNCTIONS};
use self::instrument::Position;
use super::{Context, ResolveError};
use crate::api::external_secret::{Template, TemplateMergePolicy};
use crate::secret::SecretBytes;

/// Longest expression accepted: 4 KiB is ample for string assembly and keeps every later bound
/// (tree size, literal sizes) small.
pub const MAX_EXPRESSION_BYTES: usize = 4 * 1024;

/// Deepest lexical nesting accepted, counted before parsing: each open `(`, `[` or `{` counts one,
/// and so does each `?` (conditional) inside the innermost open bracket. Real templates nest a
/// handful of levels; the parser recurses several frames per level.
pub const MAX_NESTING: usize = 32;

/// Deepest syntax tree accepted, measured after parsing (before instrumentation, which at most
/// doubles it). Evaluation recurses once or twice per level.
pub const MAX_AST_DEPTH: usize = 64;

/// Deepest nesting of comprehension macros (`map`, `filter`, `all`, `exists`, `exists_one`): one
/// comprehension inside another is accepted, a third level is not. The cost budget bounds the
/// accepted ones anyway; this keeps hostile templates from spending it in one go.
pub const MAX_COMPREHENSION_NESTING: usize = 2;

/// Largest value (intermediate or output) of one template, in measured bytes: 1 MiB, the size
/// limit of a Kubernetes Secret.
pub const MAX_VALUE_BYTES: u64 = 1 << 20;

/// Largest total output of all templates of an ExternalSecret: 4 MiB.
pub const MAX_TOTAL_OUTPUT_BYTES: u64 = 4 << 20;

/// Sum of the measured sizes of all values produced while evaluating all templates of an
/// ExternalSecret: 32 MiB, i.e. at most ~32 passes over a 1 MiB value, or tens of thousands of
/// small operations, which takes milliseconds.
pub const COST_BUDGET: u64 = 32 << 20;

/// Measured size of one list element or map entry on top of its contents: roughly what it takes
/// in memory, so that a list of a million empty strings is not "small".
pub const ELEMENT_COST: u64 = 32;

/// Stack of the thread templates are parsed and evaluated on. The `cel` parser (generated by
/// ANTLR) takes up to ~200 KiB of stack per nesting level in debug builds (less in release), so
/// [`MAX_NESTING`] levels do not fit in a Tokio worker's 2 MiB; only the pages used are committed.
const STACK_BYTES: usize = crate::compute::STACK_BYTES;

/// Deepest value (nested lists and maps) measured or written out; `json.parse` stops at 128.
const MAX_VALUE_DEPTH: usize = 256;

/// The pod a volume is mounted for, as templates see it (`pod`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplatePod {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The pod's service account.
    pub service_account: String,
}

/// Applies the templates to the resolved entries. `pod` is `None` where there is no pod (the
/// mirror controller); templates that use it then fail.
///
/// Runs on the caller's thread when it is a [`crate::compute`] pool thread (which has the
/// stack the parser needs), else on a thread of its own with a 32 MiB stack.
pub fn apply(
    ctx: &Context,
    template: &Template,
    resolved: BTreeMap<String, SecretBytes>,
    pod: Option<&TemplatePod>,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    let fail = |reason: &str| ResolveError::Template {
        ctx: ctx.boxed(),
        key: template.data.keys().next().cloned().unwrap_or_default(),
        reason: reason.to_owned(),
    };
    if crate::compute::on_pool_thread() {
        return apply_here(ctx, template, resolved, pod);
    }
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("latchkey-cel".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, || apply_here(ctx, template, resolved, pod))
            .map_err(|_| fail("could not start a thread to evaluate templates"))?
            .join()
            .map_err(|_| fail("template evaluation failed unexpectedly (a bug in Latchkey)"))?
    })
}

fn apply_here(
    ctx: &Context,
    template: &Template,
    resolved: BTreeMap<String, SecretBytes>,
    pod: Option<&TemplatePod>,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    let fail = |key: &str, reason: String| ResolveError::Template {
        ctx: ctx.boxed(),
        key: key.to_owned(),
        reason,
    };
    let mut programs = Vec::with_capacity(template.data.len());
    for (key, source) in &template.data {
        programs.push((
            key,
            programs::get(source).map_err(|reason| fail(key, reason))?,
        ));
    }
    let outputs = {
        let budget = Arc::new(Budget::default());
        let cel = cel_context(&resolved, pod, &budget);
        let mut outputs = BTreeMap::new();
        let mut total = 0u64;
        for (key, program) in &programs {
            let value = evaluate(program, &cel, &budget, pod.is_some())
                .map_err(|reason| fail(key, reason))?;
            total += value.len() as u64;
            if total > MAX_TOTAL_OUTPUT_BYTES {
                return Err(fail(
                    key,
                    format!(
                        "the templates' output together exceeds {MAX_TOTAL_OUTPUT_BYTES} bytes"
                    ),
                ));
            }
            outputs.insert((*key).clone(), value);
        }
        outputs
    };
    Ok(match template.merge_policy.unwrap_or_default() {
        TemplateMergePolicy::Replace => outputs,
        TemplateMergePolicy::Merge => {
            let mut merged = resolved;
            merged.extend(outputs);
            merged
        }
    })
}

/// A checked, instrumented expression.
struct Program {
    expr: IdedExpr,
    /// Identifiers, fields, function names and string literals of the expression: configuration,
    /// which error messages may repeat.
    names: HashSet<String>,
}

/// Compiles one expression: the bounds before parsing, parsing, the bounds of the tree, and
/// instrumentation.
fn compile(source: &str) -> Result<Program, String> {
    limits::check_source(source)?;
    let expr = ENV
        .parser()
        .max_recursion_depth(MAX_AST_DEPTH as u16)
        .parse(source)
        .map_err(|e| parse_error(&e))?;
    let names = limits::check_tree(&expr)?;
    Ok(Program {
        expr: instrument::instrument(expr, Position::Value, &[]),
        names,
    })
}

/// Evaluates one compiled expression and writes its result out.
fn evaluate(
    program: &Program,
    cel: &cel::Context<'_, '_>,
    budget: &Budget,
    has_pod: bool,
) -> Result<SecretBytes, String> {
    let result = Value::resolve_val(&program.expr, cel);
    // A bound stops evaluation even where CEL would swallow the error (`error || true`).
    match budget.stopped() {
        Stop::None => {}
        Stop::Budget => {
            return Err(format!(
                "evaluation exceeded the cost budget of {COST_BUDGET} (bytes of values \
                 produced, shared by all templates of the ExternalSecret)"
            ));
        }
        Stop::TooLarge => {
            return Err(format!(
                "a value grew larger than the limit of {MAX_VALUE_BYTES} bytes"
            ));
        }
        Stop::TooDeep => {
            return Err(format!(
                "a value is nested more than {MAX_VALUE_DEPTH} deep"
            ));
        }
        Stop::Deadline => {
            return Err(
                "evaluation ran past the publish's time limit (see --compute-timeout)".into(),
            );
        }
    }
    let value = result.map_err(|e| describe(&e, &program.names, &OWN_FUNCTIONS, has_pod))?;
    let bytes = output::output(value.as_ref())?;
    if bytes.len() as u64 > MAX_VALUE_BYTES {
        return Err(format!(
            "the result is {} bytes, more than the limit of {MAX_VALUE_BYTES}",
            bytes.len()
        ));
    }
    Ok(SecretBytes::new(bytes))
}
