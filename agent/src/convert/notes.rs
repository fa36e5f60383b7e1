//! What could not be carried over, per input object: each note names the object, the field path
//! and why. Notes become `# latchkey convert:` comments in the output and lines on stderr.

use std::fmt;

/// The longest quoted input text in a note; anything longer is cut with `…`.
const MAX_QUOTED: usize = 160;

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
}

impl Notes {
    /// Notes about `subject` (e.g. `SecretProviderClass shop/db`).
    pub fn new(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            list: Vec::new(),
        }
    }

    /// Records that `path` could not be carried over (or needs attention), and why.
    pub fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.list.push(Note {
            path: path.into(),
            message: message.into(),
        });
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
    fn quoted_text_stays_on_one_line() {
        assert_eq!(quoted("a\nb"), r#""a\nb""#);
        assert_eq!(quoted("say \"hi\""), r#""say \"hi\"""#);
        assert!(!quoted(&"x".repeat(1000)).contains(&"x".repeat(200)));
    }
}
