//! The functions templates may call beyond the CEL standard library and the encoders extension:
//! `json.parse`, `base64.encode` of a string, the string helpers (`lowerAscii`, `upperAscii`,
//! `trim`, `replace`, `split`, `join`) and the bounded `matches`, their registration in the
//! environment [`ENV`], and [`OWN_FUNCTIONS`], the names whose errors may be shown as they are.
//! Each checks its result size before building it; their error messages are fixed texts (plus
//! type names and limits), never values.
//!
//! Not for `format` (see `format`), nor for the helpers the functions share (see `args`), nor for
//! binding `matches` to a budget (see `context`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use cel::common::types::{
    BYTES_TYPE, CelBool, CelBytes, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull,
    CelString, CelUInt, LIST_TYPE, STRING_TYPE,
};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError};

use super::args::{fail, string_result, text_arg, too_large};
use super::budget::Budget;
use super::format::format;
use super::{ELEMENT_COST, MAX_VALUE_BYTES};

/// Largest compiled regular expression (and lazy DFA cache) of `matches`: 256 KiB.
const REGEX_SIZE_LIMIT: usize = 256 << 10;

/// `matches` spends `text length x (compiled states / REGEX_STATES_PER_UNIT + 1)` before
/// searching: the worst case of a search is proportional to both.
const REGEX_STATES_PER_UNIT: u64 = 16;

/// Functions registered here; their error messages never contain values, so `errors` may show
/// them as they are.
pub(super) const OWN_FUNCTIONS: [&str; 10] = [
    "matches",
    "format",
    "json.parse",
    "base64.encode",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "join",
];

/// The environment: the standard library, the encoders extension and the functions below.
pub(super) static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib().with_optional_support(false);
    let registered = env
        .add_extension(cel::extensions::encoders)
        .and_then(|()| register(&mut env));
    if let Err(e) = registered {
        unreachable!("the template functions are declared once: {e}");
    }
    Arc::new(env)
});

fn register(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_member_overload(
        "format",
        "latchkey_format",
        STRING_TYPE,
        vec![LIST_TYPE],
        format,
    )?;
    env.add_overload(
        "json.parse",
        "latchkey_json_parse_string",
        vec![STRING_TYPE],
        json_parse,
    )?;
    env.add_overload(
        "json.parse",
        "latchkey_json_parse_bytes",
        vec![BYTES_TYPE],
        json_parse,
    )?;
    env.add_overload(
        "base64.encode",
        "latchkey_base64_encode_string",
        vec![STRING_TYPE],
        base64_encode_string,
    )?;
    env.add_member_overload(
        "lowerAscii",
        "latchkey_lower_ascii",
        STRING_TYPE,
        vec![],
        lower_ascii,
    )?;
    env.add_member_overload(
        "upperAscii",
        "latchkey_upper_ascii",
        STRING_TYPE,
        vec![],
        upper_ascii,
    )?;
    env.add_member_overload("trim", "latchkey_trim", STRING_TYPE, vec![], trim)?;
    env.add_member_overload(
        "replace",
        "latchkey_replace",
        STRING_TYPE,
        vec![STRING_TYPE, STRING_TYPE],
        replace,
    )?;
    env.add_member_overload(
        "split",
        "latchkey_split",
        STRING_TYPE,
        vec![STRING_TYPE],
        split,
    )?;
    env.add_member_overload("join", "latchkey_join", LIST_TYPE, vec![], join)?;
    env.add_member_overload(
        "join",
        "latchkey_join_sep",
        LIST_TYPE,
        vec![STRING_TYPE],
        join,
    )?;
    Ok(())
}

/// A `matches` pattern compiled once per evaluation: the regex, and what one byte of text costs
/// to search with it.
pub(super) struct CompiledPattern {
    regex: regex::Regex,
    /// Budget units per byte of text: a search takes up to (compiled states x text) steps.
    cost_per_byte: u64,
}

impl CompiledPattern {
    /// Compiles `pattern`, spending its compiled size, or fails (without quoting it).
    pub(super) fn compile(budget: &Budget, pattern: &str) -> Result<Self, ExecutionError> {
        let invalid = || {
            fail(
                "matches",
                format!(
                    "not a valid regular expression, or one that compiles to more than \
                     {REGEX_SIZE_LIMIT} bytes"
                ),
            )
        };
        budget.spend(pattern.len() as u64)?;
        let nfa = regex_automata::nfa::thompson::NFA::compiler()
            .configure(
                regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(REGEX_SIZE_LIMIT)),
            )
            .build(pattern)
            .map_err(|_| invalid())?;
        let states = nfa.states().len() as u64;
        // Compiling costs about as much as its result is large.
        budget.spend(nfa.memory_usage() as u64)?;
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|_| invalid())?;
        Ok(Self {
            regex,
            cost_per_byte: states / REGEX_STATES_PER_UNIT + 1,
        })
    }

    /// Searches `text`, spending its worst-case cost first. Errors never quote the pattern.
    pub(super) fn is_match(&self, budget: &Budget, text: &str) -> Result<bool, ExecutionError> {
        budget.spend((text.len() as u64).saturating_mul(self.cost_per_byte))?;
        Ok(self.regex.is_match(text))
    }
}

/// `json.parse(string | bytes)`.
fn json_parse<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    const F: &str = "json.parse";
    let [arg] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(1, args.len()));
    };
    let bytes = if let Some(s) = arg.downcast_ref::<CelString>() {
        s.inner().as_bytes()
    } else if let Some(b) = arg.downcast_ref::<CelBytes>() {
        b.inner()
    } else {
        return Err(fail(F, "expected a string or bytes"));
    };
    // Counted before anything is built (a million tiny keys would take ~180 MB as a tree), and
    // the tree's memory held in the node's parse budget until it is converted.
    let items = crate::json::check(bytes).map_err(|why| fail(F, format!("the input {why}")))?;
    let _held = crate::json::Budget::node()
        .hold(crate::json::parsed_cost(bytes.len(), items))
        .map_err(|why| fail(F, format!("the input {why}")))?;
    // serde_json's messages do not quote the input, but only its position is kept anyway.
    let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        fail(
            F,
            format!(
                "the input is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    if json_size(&json) > MAX_VALUE_BYTES {
        return Err(too_large(F));
    }
    Ok(CowVal::Owned(from_json(json)))
}

/// The measured size [`measure`](super::budget::measure) will find for the CEL value of `json`.
fn json_size(json: &serde_json::Value) -> u64 {
    use serde_json::Value as J;
    let mut total = 0u64;
    let mut stack = vec![json];
    while let Some(v) = stack.pop() {
        total += match v {
            J::String(s) => s.len() as u64,
            J::Array(a) => {
                stack.extend(a);
                ELEMENT_COST * a.len() as u64
            }
            J::Object(o) => {
                stack.extend(o.values());
                o.keys().map(|k| ELEMENT_COST + k.len() as u64).sum::<u64>()
            }
            _ => 8,
        };
        if total > MAX_VALUE_BYTES {
            break;
        }
    }
    total
}

fn from_json(json: serde_json::Value) -> Box<dyn Val + 'static> {
    use serde_json::Value as J;
    match json {
        J::Null => Box::new(CelNull),
        J::Bool(b) => Box::new(CelBool::from(b)),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        J::String(s) => Box::new(CelString::from(s)),
        J::Array(a) => Box::new(CelList::from(
            a.into_iter().map(from_json).collect::<Vec<_>>(),
        )),
        J::Object(o) => Box::new(CelMap::from(
            o.into_iter()
                .map(|(k, v)| (CelMapKey::from(k), from_json(v)))
                .collect::<HashMap<_, _>>(),
        )),
    }
}

/// `base64.encode(string)`: the string's UTF-8 bytes (`base64.encode(bytes)` is the extension's).
fn base64_encode_string<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    const F: &str = "base64.encode";
    let [arg] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(1, args.len()));
    };
    let s = text_arg(F, arg.as_ref())?;
    if (s.len() as u64).div_ceil(3) * 4 > MAX_VALUE_BYTES {
        return Err(too_large(F));
    }
    string_result(BASE64_STANDARD.encode(s.as_bytes()))
}

fn lower_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(1, args.len()));
    };
    string_result(text_arg("lowerAscii", this.as_ref())?.to_ascii_lowercase())
}

fn upper_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(1, args.len()));
    };
    string_result(text_arg("upperAscii", this.as_ref())?.to_ascii_uppercase())
}

fn trim<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(1, args.len()));
    };
    string_result(text_arg("trim", this.as_ref())?.trim().to_owned())
}

/// `s.replace(old, new)`: every occurrence; an empty `old` inserts `new` around every character,
/// as in cel-go. The result size is checked before it is built.
fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    const F: &str = "replace";
    let [this, old, new] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(3, args.len()));
    };
    let (s, old, new) = (
        text_arg(F, this.as_ref())?,
        text_arg(F, old.as_ref())?,
        text_arg(F, new.as_ref())?,
    );
    let count = if old.is_empty() {
        s.chars().count() as u64 + 1
    } else {
        s.matches(old).count() as u64
    };
    let size = (s.len() as u64 - count * old.len() as u64)
        .saturating_add(count.saturating_mul(new.len() as u64));
    if size > MAX_VALUE_BYTES {
        return Err(too_large(F));
    }
    if !old.is_empty() {
        return string_result(s.replace(old, new));
    }
    let mut out = String::with_capacity(size as usize);
    out.push_str(new);
    for c in s.chars() {
        out.push(c);
        out.push_str(new);
    }
    string_result(out)
}

/// `s.split(sep)`: an empty separator splits into characters.
fn split<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    const F: &str = "split";
    let [this, sep] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(2, args.len()));
    };
    let (s, sep) = (text_arg(F, this.as_ref())?, text_arg(F, sep.as_ref())?);
    let count = if sep.is_empty() {
        s.chars().count() as u64
    } else {
        s.matches(sep).count() as u64 + 1
    };
    if s.len() as u64 + count * ELEMENT_COST > MAX_VALUE_BYTES {
        return Err(too_large(F));
    }
    let part = |p: &str| -> Box<dyn Val + 'v> { Box::new(CelString::from(p.to_owned())) };
    let parts: Vec<Box<dyn Val + 'v>> = if sep.is_empty() {
        s.chars()
            .map(|c| part(c.encode_utf8(&mut [0; 4])))
            .collect()
    } else {
        s.split(sep).map(part).collect()
    };
    Ok(CowVal::owned(CelList::from(parts)))
}

/// `list.join()` and `list.join(sep)`, for lists of strings.
fn join<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    const F: &str = "join";
    let (list, sep) = match args.as_slice() {
        [list] => (list, ""),
        [list, sep] => (list, text_arg(F, sep.as_ref())?),
        _ => return Err(ExecutionError::invalid_argument_count(2, args.len())),
    };
    let iterable = list
        .as_iterable()
        .ok_or_else(|| fail(F, "the target must be a list"))?;
    let mut parts = Vec::new();
    let mut items = iterable.iter();
    while let Some(v) = items.next() {
        parts.push(text_arg(F, v)?);
    }
    let size = parts.iter().map(|p| p.len() as u64).sum::<u64>()
        + (parts.len().saturating_sub(1) as u64).saturating_mul(sep.len() as u64);
    if size > MAX_VALUE_BYTES {
        return Err(too_large(F));
    }
    string_result(parts.join(sep))
}
