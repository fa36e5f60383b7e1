//! Error messages without values: `cel`'s parse and evaluation errors turned into fixed texts
//! that name only what the expression itself contains (keys, functions, variables) and type
//! names, never a runtime value.
//!
//! Not for the errors of the functions registered here (they build value-free messages
//! themselves, see `args`), nor for bounds (see `limits` and `budget`). The names of those
//! functions come in as an argument of [`describe`] rather than an import, so that the functions
//! can build on this module without a cycle.

use std::collections::HashSet;

use cel::{ExecutionError, ParseErrors, Value};

/// The message for an expression that does not parse: the parser's first messages (which quote
/// the expression, never a value), with their positions.
pub(super) fn parse_error(e: &ParseErrors) -> String {
    let mut reason = String::from("the expression does not parse: ");
    for (i, e) in e.errors.iter().take(3).enumerate() {
        if i > 0 {
            reason.push_str("; ");
        }
        // The message may quote the expression: configuration, not a value.
        if e.pos.0 > 0 {
            reason.push_str(&format!("line {}, column {}: ", e.pos.0, e.pos.1));
        }
        reason.push_str(&e.msg);
    }
    if reason.len() > 512 {
        let mut end = 512;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    // Every error carries the parsed source (configuration, not a value). A Go template there is
    // the usual mistake of an ESO manifest ported as is, and the parser's message alone does not
    // say so.
    let source = e.errors.iter().find_map(|e| e.source_info.as_deref());
    if source.is_some_and(|info| looks_like_go_template(&info.source)) {
        reason.push_str(GO_TEMPLATE_HINT);
    }
    reason
}

/// Appended to the parse error of an expression written as a Go template.
const GO_TEMPLATE_HINT: &str = "; this looks like a Go template (`{{ ... }}`, as in External \
     Secrets Operator), but templates in Latchkey are CEL expressions, e.g. `secret.password` or \
     `'%s:%s'.format([secret.user, secret.password])`: see the templates part of \
     README.md#using-it-from-a-pod";

/// True when `source` has `{{` outside CEL string literals. That is never valid CEL worth writing
/// (a map literal whose key is a map), while it opens every Go template action.
fn looks_like_go_template(source: &str) -> bool {
    let bytes = source.as_bytes();
    // The delimiter of the string literal being skipped: `'`, `"`, `'''` or `"""`.
    let mut delimiter: Option<&[u8]> = None;
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        match delimiter {
            Some(d) if rest.starts_with(d) => {
                delimiter = None;
                i += d.len();
            }
            // An escape: the next byte cannot close the literal. (Raw strings have no escapes;
            // misreading one only affects this hint.)
            Some(_) if rest[0] == b'\\' => i += 2,
            Some(_) => i += 1,
            None if rest.starts_with(b"{{") => return true,
            None if rest[0] == b'\'' || rest[0] == b'"' => {
                let d = &rest[..if rest.starts_with(b"'''") || rest.starts_with(b"\"\"\"") {
                    3
                } else {
                    1
                }];
                delimiter = Some(d);
                i += d.len();
            }
            None => i += 1,
        }
    }
    false
}

/// A type name as `cel` reports it; anything else is not repeated.
pub(super) fn type_name(name: &str) -> &str {
    let plain = name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.()<>, ".contains(c));
    if plain { name } else { "value" }
}

fn value_type(v: &Value) -> String {
    v.type_of().to_string()
}

/// A fixed description of a `cel` error: its messages may embed runtime values. `names` are the
/// expression's own names, which may be repeated; the messages of `own_functions` are value-free
/// and shown as they are.
pub(super) fn describe(
    e: &ExecutionError,
    names: &HashSet<String>,
    own_functions: &[&str],
    has_pod: bool,
) -> String {
    let named = |n: &str| names.contains(n);
    match e {
        ExecutionError::UndeclaredReference(n) if n.as_str() == "pod" && !has_pod => {
            "unknown variable \"pod\": pod fields are only available when a pod mounts the volume"
                .to_owned()
        }
        ExecutionError::UndeclaredReference(n) if named(n) => {
            format!("unknown variable or function \"{n}\"")
        }
        ExecutionError::UndeclaredReference(_) => "unknown variable or function".to_owned(),
        ExecutionError::NoSuchKey(k) if named(k) => format!("no such key \"{k}\""),
        ExecutionError::NoSuchKey(_) => {
            "no such key (computed at run time, so not shown)".to_owned()
        }
        ExecutionError::NoSuchOverload(o) => {
            let function = if named(o.function()) {
                format!(" '{}'", o.function())
            } else {
                String::new()
            };
            let types: Vec<&str> = o.argument_types().iter().map(|t| type_name(t)).collect();
            format!(
                "no overload of function{function} takes arguments of type ({})",
                types.join(", ")
            )
        }
        ExecutionError::InvalidArgumentCount { expected, actual } => {
            format!("wrong number of arguments: expected {expected}, got {actual}")
        }
        ExecutionError::UnsupportedTargetType { target } => {
            format!("unsupported target of type {}", value_type(target))
        }
        ExecutionError::NotSupportedAsMethod { method, target } if named(method) => format!(
            "function \"{method}\" cannot be called on a {}",
            value_type(target)
        ),
        ExecutionError::NotSupportedAsMethod { target, .. } => {
            format!("function cannot be called on a {}", value_type(target))
        }
        ExecutionError::UnsupportedKeyType(v) => {
            format!("a {} cannot be a map key", value_type(v))
        }
        ExecutionError::UnexpectedType { got, want } => {
            format!(
                "type error: got {}, want {}",
                type_name(got),
                type_name(want)
            )
        }
        ExecutionError::MissingArgumentOrTarget => "missing argument or target".to_owned(),
        ExecutionError::ValuesNotComparable(a, b) => format!(
            "a {} cannot be compared to a {}",
            value_type(a),
            value_type(b)
        ),
        ExecutionError::UnsupportedBinaryOperator(op, a, b) => format!(
            "operator \"{op}\" does not apply to {} and {}",
            value_type(a),
            value_type(b)
        ),
        ExecutionError::UnsupportedIndex(i, v) => format!(
            "a {} cannot be indexed by a {}",
            value_type(v),
            value_type(i)
        ),
        ExecutionError::FunctionError { function, message }
            if own_functions.contains(&function.as_str()) =>
        {
            format!("{function}: {message}")
        }
        ExecutionError::FunctionError { function, .. } if function == "base64.decode" => {
            "base64.decode: the input is not valid base64".to_owned()
        }
        ExecutionError::FunctionError { function, .. } if named(function) => {
            format!(
                "function \"{function}\" failed (details are not shown: they may contain values)"
            )
        }
        ExecutionError::FunctionError { .. } => {
            "a function failed (details are not shown: they may contain values)".to_owned()
        }
        ExecutionError::DivisionByZero(_) => "division by zero".to_owned(),
        ExecutionError::RemainderByZero(_) => "remainder by zero".to_owned(),
        ExecutionError::Overflow(op, _, _) => format!("integer overflow in \"{op}\""),
        ExecutionError::IndexOutOfBounds(_) => "list index out of bounds".to_owned(),
        ExecutionError::DuplicateKey(_) => "a map literal repeats a key".to_owned(),
        _ => "evaluation failed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of an expression that does not parse, through the same compile step as
    /// templates.
    fn parse_reason(source: &str) -> String {
        match super::super::compile(source) {
            Ok(_) => panic!("{source} parses"),
            Err(reason) => reason,
        }
    }

    #[test]
    fn go_templates_get_a_hint_that_templates_are_cel() {
        for source in [
            "{{ .password }}",
            "{{ .password | toString }}",
            "postgres://{{ .user }}:{{ .password }}@db/shop",
            "{{- .config | b64dec -}}",
        ] {
            let reason = parse_reason(source);
            assert!(
                reason.starts_with("the expression does not parse"),
                "{reason}"
            );
            assert!(reason.contains("Go template"), "{source}: {reason}");
            assert!(reason.contains("CEL"), "{reason}");
            assert!(reason.contains("README.md#using-it-from-a-pod"), "{reason}");
        }
    }

    #[test]
    fn other_parse_errors_get_no_go_template_hint() {
        for source in [
            "secret.password +",
            "'{{ .x }}' +",
            "\"\"\"{{\"\"\" + '\\'{{' +",
        ] {
            let reason = parse_reason(source);
            assert!(!reason.contains("Go template"), "{source}: {reason}");
        }
    }

    #[test]
    fn go_template_detection_skips_string_literals() {
        assert!(looks_like_go_template("x + {{ .y }}"));
        assert!(looks_like_go_template("'a' + {{"));
        assert!(!looks_like_go_template("'{{ .y }}'"));
        assert!(!looks_like_go_template("\"a\\\"{{\""));
        assert!(!looks_like_go_template("'''it's {{ here'''"));
        assert!(!looks_like_go_template("{'a': {'b': 1}}"));
        assert!(looks_like_go_template("'unterminated' + {{ x"));
    }
}
