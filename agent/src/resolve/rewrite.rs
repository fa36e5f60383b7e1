//! `dataFrom[].rewrite`: renaming a source's entries, step by step, with the work and the
//! names it builds bounded (a step like `{source: "^(.*)$", target: "$1$1"}` doubles a name).

use std::collections::BTreeMap;

use regex::{Regex, RegexBuilder};

use super::{Context, ResolveError};
use crate::api::external_secret::DataFrom;
use crate::secret::SecretBytes;

/// Largest compiled `rewrite` regular expression.
const MAX_REWRITE_REGEX_BYTES: usize = 256 << 10;

/// Longest entry name a rewrite may produce, checked while the name is built (a step like
/// `{source: "^(.*)$", target: "$1$1"}` doubles it each time).
pub const MAX_REWRITTEN_NAME_BYTES: usize = 1024;

/// Most rewrite applications (entry names x steps) of one ExternalSecret.
pub const MAX_REWRITE_APPLICATIONS: usize = 50_000;

/// Applies a source's `rewrite` steps, in order, to each entry name it produced. `applied`
/// counts (name, step) applications across the ExternalSecret, against
/// [`MAX_REWRITE_APPLICATIONS`].
pub(super) fn rewrite(
    ctx: &Context,
    index: usize,
    source: &DataFrom,
    entries: BTreeMap<String, SecretBytes>,
    applied: &mut usize,
) -> Result<BTreeMap<String, SecretBytes>, ResolveError> {
    if source.rewrite.is_empty() {
        return Ok(entries);
    }
    let mut steps = Vec::new();
    for r in source.rewrite.iter().filter_map(|r| r.regexp.as_ref()) {
        let re = RegexBuilder::new(&r.source)
            .size_limit(MAX_REWRITE_REGEX_BYTES)
            .dfa_size_limit(MAX_REWRITE_REGEX_BYTES)
            .build()
            .map_err(|_| ResolveError::BadRewrite {
                ctx: ctx.boxed(),
                index,
                source_regexp: r.source.clone(),
            })?;
        steps.push((re, r.target.as_str()));
    }
    let bound = |reason: String| ResolveError::Bound {
        ctx: ctx.boxed(),
        reason: format!("spec.dataFrom[{index}].rewrite: {reason}"),
    };
    let mut out = BTreeMap::new();
    for (mut name, v) in entries {
        for (re, target) in &steps {
            *applied += 1;
            if *applied > MAX_REWRITE_APPLICATIONS {
                return Err(bound(format!(
                    "more than {MAX_REWRITE_APPLICATIONS} renames (entries x steps)"
                )));
            }
            if crate::compute::deadline_passed() {
                return Err(ResolveError::Deadline { ctx: ctx.boxed() });
            }
            name =
                replace_bounded(re, &name, target, MAX_REWRITTEN_NAME_BYTES).ok_or_else(|| {
                    bound(format!(
                        "a rewritten name grows beyond {MAX_REWRITTEN_NAME_BYTES} bytes"
                    ))
                })?;
        }
        out.insert(name, v);
    }
    Ok(out)
}

/// `re.replace_all(name, target)`, or `None` as soon as the result exceeds `max` bytes.
pub(super) fn replace_bounded(re: &Regex, name: &str, target: &str, max: usize) -> Option<String> {
    let mut out = String::new();
    let mut last = 0;
    for caps in re.captures_iter(name) {
        // Group 0 (the whole match) is always present.
        let whole = caps.get(0)?;
        out.push_str(&name[last..whole.start()]);
        caps.expand(target, &mut out);
        if out.len() > max {
            return None;
        }
        last = whole.end();
    }
    out.push_str(&name[last..]);
    (out.len() <= max).then_some(out)
}
