//! What could not be carried over, per input object: each note names the object, the field path
//! and why. Notes become `# latchkey convert:` comments in the output and lines on stderr.

use std::fmt;

/// The longest quoted input text in a note; anything longer is cut with `…`.
const MAX_QUOTED: usize = 160;

/// The longest line written as a comment or a stderr message; notes are far shorter, so only a
/// line made long by input text is cut.
const MAX_LINE: usize = 4096;

/// A line of the output or of stderr as it is written: nothing in it can end it early (control
/// characters, and the line breaks YAML also knows: NEL, LS, PS, are escaped), so no input text
/// put in a note can start a YAML document or forge a message. Every comment and message goes
/// through here, whatever it quotes.
pub fn one_line(text: &str) -> String {
    crate::telemetry::escape::printable(text, MAX_LINE)
}

/// A field name as a segment of a note's path: as it is when short and plain, else quoted.
pub fn segment(key: &str) -> String {
    let plain = key.chars().count() <= MAX_QUOTED
        && !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '-' | '_'));
    if plain { key.to_string() } else { quoted(key) }
}

/// An input string made safe for a one-line note: control characters escaped (a newline must not
/// end a YAML comment early), long text cut.
pub fn quoted(text: &str) -> String {
    let safe = crate::telemetry::escape::printable(text, MAX_QUOTED);
    format!("\"{}\"", safe.replace('"', "\\\""))
}

/// One field that could not be carried over, or a step the user must take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Field path in the input object (`spec.parameters.objects[1].objectType`); may be empty.
    pub path: String,
    /// What happened and why; never contains secret values.
    pub message: String,
}

/// The notes of one input object.
#[derive(Debug, Default)]
pub struct Notes {
    /// `Kind namespace/name` of the input object.
    pub subject: String,
    /// In the order they were found.
    pub list: Vec<Note>,
    /// Paths of fields the conversion does not know (typos, or fields of a newer version): the
    /// object cannot be converted, since what it means is unknown.
    pub unknown: Vec<String>,
}

impl Notes {
    /// Notes about `subject` (e.g. `SecretProviderClass shop/db`).
    pub fn new(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            ..Default::default()
        }
    }

    /// Records that `path` could not be carried over (or needs attention), and why.
    pub fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.list.push(Note {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Why the object is not converted when it has fields the conversion does not know.
    pub fn unknown_fields(&self) -> Option<String> {
        let (first, rest) = self.unknown.split_first()?;
        let named = if rest.is_empty() {
            format!("unknown field {first}")
        } else {
            format!("unknown fields {first}, {}", rest.join(", "))
        };
        Some(format!(
            "{named}: latchkey convert does not know it (a typo, or a field of a newer version), \
             so it cannot tell what the object means; nothing of the object is converted"
        ))
    }

    /// The notes as single lines: `subject: path: message`.
    pub fn lines(&self) -> impl Iterator<Item = String> + '_ {
        self.list.iter().map(|n| self.line(n))
    }

    /// One note as a single line.
    pub fn line(&self, note: &Note) -> String {
        Line {
            subject: &self.subject,
            path: &note.path,
            message: &note.message,
        }
        .to_string()
    }
}

/// `subject: path: message`, without the path when there is none.
pub struct Line<'a> {
    /// The object.
    pub subject: &'a str,
    /// The field path.
    pub path: &'a str,
    /// Why.
    pub message: &'a str,
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.subject, self.message)
        } else {
            write!(f, "{}: {}: {}", self.subject, self.path, self.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_object_and_path() {
        let mut n = Notes::new("SecretProviderClass shop/db");
        n.warn(
            "spec.parameters.objects[1].objectType",
            "ssmparameter has no Latchkey equivalent",
        );
        n.warn("", "whole object");
        let lines: Vec<_> = n.lines().collect();
        assert_eq!(
            lines,
            [
                "SecretProviderClass shop/db: spec.parameters.objects[1].objectType: ssmparameter \
                 has no Latchkey equivalent",
                "SecretProviderClass shop/db: whole object"
            ]
        );
    }

    #[test]
    fn lines_and_segments_cannot_break() {
        for text in ["a\n---\nb", "a\rb", "a\u{85}b", "a\u{2028}b", "a\u{2029}b"] {
            let line = one_line(text);
            assert!(
                !line.contains(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}']),
                "{line:?}"
            );
            assert!(!segment(text).contains(['\n', '\r']), "{text:?}");
        }
        assert_eq!(segment("objects"), "objects");
        assert_eq!(
            segment("csi.storage.k8s.io/pod.name"),
            "csi.storage.k8s.io/pod.name"
        );
        assert_eq!(segment("a b"), r#""a b""#);
        assert!(segment(&"x".repeat(1000)).chars().count() < 200);
    }

    #[test]
    fn quoted_text_stays_on_one_line() {
        assert_eq!(quoted("a\nb"), r#""a\nb""#);
        assert_eq!(quoted("say \"hi\""), r#""say \"hi\"""#);
        assert!(!quoted(&"x".repeat(1000)).contains(&"x".repeat(200)));
    }
}
