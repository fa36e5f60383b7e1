//! Makes text that came from outside (a backend's error message, a name from a manifest) safe to
//! put in a log line, an error or an Event: control characters are escaped, so a tenant-run
//! backend cannot forge log lines (`\n... INFO published`) or send terminal escapes, and the
//! text is bounded.

use std::fmt::Write;

/// `text` with control characters (C0, DEL, C1), line and paragraph separators and bidirectional
/// overrides written as `\u{..}` escapes (`\n`, `\r`, `\t` as themselves escaped), cut to
/// `max_chars` characters (an ellipsis marks the cut).
pub fn printable(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars * 2));
    for (i, c) in text.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped_and_text_is_bounded() {
        let forged = "denied\n2026-11-23T00:00:00Z  INFO latchkey: published\x1b[2J\u{202e}x";
        let p = printable(forged, 200);
        assert!(!p.chars().any(char::is_control), "{p:?}");
        assert!(p.contains("denied\\n2026") && p.contains("\\u{1b}[2J") && p.contains("\\u{202e}"));
        assert_eq!(printable("abcdef", 3), "abc…");
        assert_eq!(printable("plain: ok", 100), "plain: ok");
    }
}
