//! `string.format(list)`, as in cel-go's strings extension: `%s` (any value), `%d`, `%f` and
//! `%.Nf`, `%x` / `%X` and `%%`, with the result bounded as it grows.
//!
//! Not for the other functions and their registration (see `functions`).

use cel::ExecutionError;
use cel::common::types::{CelBytes, CelDouble, CelInt, CelMap, CelNull, CelString, CelUInt};
use cel::common::value::{CowVal, Val};

use super::args::{fail, string_result, text_arg, too_large};
use super::errors::type_name;
use super::output::{double_text, key_text, scalar_text};
use super::{MAX_VALUE_BYTES, MAX_VALUE_DEPTH};

/// `string.format(list)`.
pub(super) fn format<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    const F: &str = "format";
    let [this, list] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(2, args.len()));
    };
    let template = text_arg(F, this.as_ref())?;
    let iterable = list
        .as_iterable()
        .ok_or_else(|| fail(F, "the argument must be a list"))?;
    let mut values = Vec::new();
    let mut items = iterable.iter();
    while let Some(v) = items.next() {
        values.push(v);
    }
    let mut out = Out::default();
    let mut rest = template;
    let mut next = 0;
    while let Some(at) = rest.find('%') {
        out.push(&rest[..at])?;
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('%') {
            out.push("%")?;
            rest = after;
            continue;
        }
        let mut precision = None;
        if let Some(after) = rest.strip_prefix('.') {
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let p: usize = after[..digits]
                .parse()
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| fail(F, "a precision must be a number from 0 to 100"))?;
            precision = Some(p);
            rest = &after[digits..];
        }
        let mut chars = rest.chars();
        let verb = chars
            .next()
            .ok_or_else(|| fail(F, "the format string ends inside a clause"))?;
        rest = chars.as_str();
        let arg = values
            .get(next)
            .ok_or_else(|| fail(F, format!("clause {} has no argument", next + 1)))?;
        next += 1;
        let got = || type_name(arg.get_type().name()).to_owned();
        match verb {
            's' => out.value(*arg, 0)?,
            'd' => {
                if let Some(i) = arg.downcast_ref::<CelInt>() {
                    out.push(&i.inner().to_string())?;
                } else if let Some(u) = arg.downcast_ref::<CelUInt>() {
                    out.push(&u.inner().to_string())?;
                } else {
                    return Err(fail(F, format!("%d needs an int or uint, got a {}", got())));
                }
            }
            'f' => {
                let d = if let Some(i) = arg.downcast_ref::<CelInt>() {
                    *i.inner() as f64
                } else if let Some(u) = arg.downcast_ref::<CelUInt>() {
                    *u.inner() as f64
                } else if let Some(d) = arg.downcast_ref::<CelDouble>() {
                    *d.inner()
                } else {
                    return Err(fail(F, format!("%f needs a number, got a {}", got())));
                };
                let p = precision.unwrap_or(6);
                if d.is_finite() {
                    out.push(&format!("{d:.p$}"))?;
                } else {
                    out.push(&double_text(d))?;
                }
            }
            'x' | 'X' => {
                let hex = if let Some(i) = arg.downcast_ref::<CelInt>() {
                    let sign = if *i.inner() < 0 { "-" } else { "" };
                    format!("{sign}{:x}", i.inner().unsigned_abs())
                } else if let Some(u) = arg.downcast_ref::<CelUInt>() {
                    format!("{:x}", u.inner())
                } else {
                    let bytes = if let Some(s) = arg.downcast_ref::<CelString>() {
                        s.inner().as_bytes()
                    } else if let Some(b) = arg.downcast_ref::<CelBytes>() {
                        b.inner()
                    } else {
                        return Err(fail(
                            F,
                            format!("%x needs an int, uint, string or bytes, got a {}", got()),
                        ));
                    };
                    if bytes.len() as u64 * 2 > MAX_VALUE_BYTES {
                        return Err(too_large(F));
                    }
                    bytes.iter().map(|b| format!("{b:02x}")).collect()
                };
                out.push(&if verb == 'X' {
                    hex.to_ascii_uppercase()
                } else {
                    hex
                })?;
            }
            _ => {
                return Err(fail(
                    F,
                    "unsupported clause: use %s, %d, %f, %.Nf, %x, %X or %%",
                ));
            }
        }
    }
    out.push(rest)?;
    string_result(out.0)
}

/// `format`'s result, bounded as it grows.
#[derive(Default)]
struct Out(String);

impl Out {
    fn push(&mut self, s: &str) -> Result<(), ExecutionError> {
        if (self.0.len() + s.len()) as u64 > MAX_VALUE_BYTES {
            return Err(too_large("format"));
        }
        self.0.push_str(s);
        Ok(())
    }

    /// `%s` of any value: lists as `[a, b]`, maps as `{k: v}` with sorted keys.
    fn value(&mut self, v: &dyn Val, depth: usize) -> Result<(), ExecutionError> {
        if depth > MAX_VALUE_DEPTH {
            return Err(fail("format", "an argument is nested too deeply"));
        }
        if let Some(s) = v.downcast_ref::<CelString>() {
            return self.push(s.inner());
        }
        if let Some(b) = v.downcast_ref::<CelBytes>() {
            let s = std::str::from_utf8(b.inner()).map_err(|_| {
                fail(
                    "format",
                    "%s of bytes that are not UTF-8; use base64.encode()",
                )
            })?;
            return self.push(s);
        }
        if v.downcast_ref::<CelNull>().is_some() {
            return self.push("null");
        }
        if let Some(text) = scalar_text(v) {
            return self.push(&text);
        }
        if let Some(m) = v.downcast_ref::<CelMap>() {
            let mut entries: Vec<_> = m.inner().iter().collect();
            entries.sort_by_cached_key(|(k, _)| key_text(k.inner()));
            self.push("{")?;
            for (i, (k, e)) in entries.into_iter().enumerate() {
                if i > 0 {
                    self.push(", ")?;
                }
                self.value(k.inner(), depth + 1)?;
                self.push(": ")?;
                self.value(e.as_ref(), depth + 1)?;
            }
            return self.push("}");
        }
        if let Some(iterable) = v.as_iterable() {
            self.push("[")?;
            let mut items = iterable.iter();
            let mut first = true;
            while let Some(e) = items.next() {
                if !first {
                    self.push(", ")?;
                }
                first = false;
                self.value(e, depth + 1)?;
            }
            return self.push("]");
        }
        Err(fail(
            "format",
            format!("%s cannot format a {}", type_name(v.get_type().name())),
        ))
    }
}
