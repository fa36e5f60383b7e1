//! How a template's result is written: a string as its UTF-8 bytes, bytes as they are, a number
//! or bool as its text, a map or list as JSON (keys sorted, bytes inside as base64); also the
//! scalar and key texts `format` shares.
//!
//! Not for the size limit of the result (the evaluation in `mod.rs` checks it).

use std::collections::BTreeMap;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use cel::common::types::{
    CelBool, CelBytes, CelDouble, CelInt, CelList, CelMap, CelNull, CelString, CelUInt,
};
use cel::common::value::Val;

use super::MAX_VALUE_DEPTH;
use super::errors::type_name;

/// The bytes a template's result is written as.
pub(super) fn output(v: &dyn Val) -> Result<Vec<u8>, String> {
    if let Some(s) = v.downcast_ref::<CelString>() {
        return Ok(s.inner().as_bytes().to_vec());
    }
    if let Some(b) = v.downcast_ref::<CelBytes>() {
        return Ok(b.inner().to_vec());
    }
    if v.downcast_ref::<CelNull>().is_some() {
        return Err("the result is null".to_owned());
    }
    if let Some(text) = scalar_text(v) {
        return Ok(text.into_bytes());
    }
    if v.downcast_ref::<CelList>().is_some()
        || v.downcast_ref::<CelMap>().is_some()
        || v.as_iterable().is_some()
    {
        let json = to_json(v, 0)?;
        return serde_json::to_vec(&json)
            .map_err(|_| "the result cannot be written as JSON".into());
    }
    Err(format!(
        "the result is a {}, which cannot be written to a file",
        type_name(v.get_type().name())
    ))
}

/// The text of an int, uint, double or bool.
pub(super) fn scalar_text(v: &dyn Val) -> Option<String> {
    if let Some(i) = v.downcast_ref::<CelInt>() {
        Some(i.inner().to_string())
    } else if let Some(u) = v.downcast_ref::<CelUInt>() {
        Some(u.inner().to_string())
    } else if let Some(d) = v.downcast_ref::<CelDouble>() {
        Some(double_text(*d.inner()))
    } else {
        v.downcast_ref::<CelBool>().map(|b| b.inner().to_string())
    }
}

pub(super) fn double_text(d: f64) -> String {
    if d.is_nan() {
        "NaN".to_owned()
    } else if d.is_infinite() {
        if d > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
    } else {
        d.to_string()
    }
}

/// A map key as JSON object key or `%s` text.
pub(super) fn key_text(k: &dyn Val) -> String {
    match k.downcast_ref::<CelString>() {
        Some(s) => s.inner().to_owned(),
        None => scalar_text(k).unwrap_or_default(),
    }
}

fn to_json(v: &dyn Val, depth: usize) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    if depth > MAX_VALUE_DEPTH {
        return Err(format!(
            "the result is nested more than {MAX_VALUE_DEPTH} deep"
        ));
    }
    if let Some(s) = v.downcast_ref::<CelString>() {
        return Ok(J::String(s.inner().to_owned()));
    }
    if let Some(b) = v.downcast_ref::<CelBytes>() {
        return Ok(J::String(BASE64_STANDARD.encode(b.inner())));
    }
    if v.downcast_ref::<CelNull>().is_some() {
        return Ok(J::Null);
    }
    if let Some(i) = v.downcast_ref::<CelInt>() {
        return Ok(J::from(*i.inner()));
    }
    if let Some(u) = v.downcast_ref::<CelUInt>() {
        return Ok(J::from(*u.inner()));
    }
    if let Some(b) = v.downcast_ref::<CelBool>() {
        return Ok(J::Bool(*b.inner()));
    }
    if let Some(d) = v.downcast_ref::<CelDouble>() {
        return serde_json::Number::from_f64(*d.inner())
            .map(J::Number)
            .ok_or_else(|| {
                "the result contains NaN or an infinity, which JSON cannot hold".into()
            });
    }
    if let Some(m) = v.downcast_ref::<CelMap>() {
        let mut sorted = BTreeMap::new();
        for (k, e) in m.inner() {
            sorted.insert(key_text(k.inner()), to_json(e.as_ref(), depth + 1)?);
        }
        return Ok(J::Object(sorted.into_iter().collect()));
    }
    if let Some(iterable) = v.as_iterable() {
        let mut out = Vec::new();
        let mut items = iterable.iter();
        while let Some(e) = items.next() {
            out.push(to_json(e, depth + 1)?);
        }
        return Ok(J::Array(out));
    }
    Err(format!(
        "the result contains a {}, which JSON cannot hold",
        type_name(v.get_type().name())
    ))
}
