//! Durations in CRD fields (`refreshInterval`, `timeout`, the fake provider's `latency`) read
//! exactly as Go's `time.ParseDuration` reads them, which is what ESO, the API server's CEL
//! `duration()` and the CRD pattern accept: `1h30m`, `1.5h`, `.5h`, `300ms`, `0`.
//!
//! Not `humantime`: it accepts forms Go refuses (`1 h`, days) and refuses some Go accepts
//! (`0.001h` overflows inside it), so an object the API server admitted could fail at mount.

use std::time::Duration;

/// Go's units and their length in nanoseconds.
const UNITS: [(&str, u64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Go's `time.ParseDuration`, in nanoseconds; `None` where Go returns an error (including
/// anything beyond what an `int64` of nanoseconds holds).
pub fn go_nanos(text: &str) -> Option<i64> {
    const LIMIT: u64 = 1 << 63;
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let (negative, mut s) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let (int, rest) = s.split_at(digits(s));
        let (frac, rest) = match rest.strip_prefix('.') {
            Some(r) => r.split_at(digits(r)),
            None => ("", rest),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let (unit, rest) = rest.split_at(
            rest.find(|c: char| c == '.' || c.is_ascii_digit())
                .unwrap_or(rest.len()),
        );
        let &(_, scale) = UNITS.iter().find(|(u, _)| *u == unit)?;
        let whole: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
        if whole > LIMIT / scale {
            return None;
        }
        let mut v = whole * scale;
        if !frac.is_empty() {
            // Go scales the fraction in floating point too.
            let f: f64 = format!("0.{frac}").parse().ok()?;
            v += (f * scale as f64) as u64;
        }
        total = total.checked_add(v).filter(|t| *t <= LIMIT)?;
        s = rest;
    }
    if negative {
        Some((-i128::from(total)) as i64)
    } else {
        i64::try_from(total).ok()
    }
}

/// A non-negative duration as Go reads it; `None` for what Go refuses or a negative one.
pub fn parse(text: &str) -> Option<Duration> {
    let nanos = u64::try_from(go_nanos(text)?).ok()?;
    Some(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_as_go_does() {
        let h = 3_600_000_000_000;
        for (text, want) in [
            ("0", Some(0)),
            ("1h30m", Some(h + h / 2)),
            ("1.5h", Some(h + h / 2)),
            (".5h", Some(h / 2)),
            ("5.h", Some(5 * h)),
            ("0.001h", Some(h / 1000)),
            ("0.251h", Some(903_600_000_000)),
            ("-1h", Some(-h)),
            ("+1h", Some(h)),
            ("1\u{3bc}s", Some(1_000)),
            ("2562047h", Some(2_562_047 * h)),
            ("2562048h", None),
            ("1", None),
            ("00", None),
            ("1d", None),
            (".", None),
            ("", None),
            ("1h 30m", None),
        ] {
            assert_eq!(go_nanos(text), want, "{text:?}");
        }
        assert_eq!(parse("-1h"), None);
        assert_eq!(parse("15m"), Some(Duration::from_secs(900)));
    }
}
