//! Validation of the relative file paths that a request asks us to write inside a volume.
//!
//! A [`FilePath`] can only be built by [`FilePath::parse`], so holding one proves the path stays
//! below the volume root when joined to it: it is relative, has no `.`/`..`/empty segments, and no
//! segment starts with `..` (that prefix is reserved for the writer's `..data` link and its
//! timestamped directories). [`check_set`] adds the rules that concern a whole set of paths.
//!
//! Not for deciding what a key *means* (that is the resolver's job) nor for touching the disk.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Longest accepted segment, in bytes; leaves room below NAME_MAX (255) for temporary names.
pub const MAX_SEGMENT_BYTES: usize = 253;
/// Longest accepted path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Most segments a path may have.
pub const MAX_SEGMENTS: usize = 16;

/// Error messages quote at most this many characters of the offending key, so a hostile
/// multi-megabyte key cannot flood a log line or a gRPC status.
const QUOTE_CHARS: usize = 96;

/// A validated relative file path inside a volume, e.g. `password` or `db/url`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FilePath(String);

impl FilePath {
    /// Validates `raw` against the rules in the module documentation.
    pub fn parse(raw: &str) -> Result<Self, PathError> {
        let reject = |reason| {
            Err(PathError {
                key: quote(raw),
                reason,
            })
        };
        if raw.is_empty() {
            return reject(Reason::Empty);
        }
        if raw.len() > MAX_PATH_BYTES {
            return reject(Reason::TooLong(raw.len()));
        }
        if raw.starts_with('/') {
            return reject(Reason::Absolute);
        }
        if raw.contains('\\') {
            return reject(Reason::Backslash);
        }
        // `char::is_control` covers ASCII controls (NUL included), DEL and the C1 range: none of
        // them belongs in a file name, and all of them can corrupt a terminal or a log line.
        if raw.chars().any(char::is_control) {
            return reject(Reason::ControlCharacter);
        }
        let mut count = 0;
        for segment in raw.split('/') {
            count += 1;
            if count > MAX_SEGMENTS {
                return reject(Reason::TooManySegments);
            }
            match segment {
                "" => return reject(Reason::EmptySegment),
                "." | ".." => return reject(Reason::DotSegment),
                s if s.starts_with("..") => return reject(Reason::ReservedPrefix),
                s if s.len() > MAX_SEGMENT_BYTES => return reject(Reason::SegmentTooLong(s.len())),
                _ => {}
            }
        }
        Ok(Self(raw.to_owned()))
    }

    /// The path as given, with `/` separators.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `/`-separated segments, first to last.
    pub fn segments(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.split('/')
    }

    /// The first segment: the name that appears directly in the volume root.
    pub fn top_level(&self) -> &str {
        // Invariant: a FilePath is never empty, so `split` yields at least one item.
        self.0.split('/').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for FilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for FilePath {
    type Err = PathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl AsRef<str> for FilePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A single path was rejected; the message names the key and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid file path {key}: {reason}")]
pub struct PathError {
    /// The offending key, quoted and escaped, shortened when very long.
    pub key: String,
    /// Which rule it broke.
    pub reason: Reason,
}

/// The rule a rejected path broke.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Reason {
    /// The path is the empty string.
    #[error("it is empty")]
    Empty,
    /// The path starts with `/`.
    #[error("it must be relative (no leading '/')")]
    Absolute,
    /// The path contains `//` or ends with `/`.
    #[error("it has an empty segment ('//' or a trailing '/')")]
    EmptySegment,
    /// A segment is `.` or `..`.
    #[error("'.' and '..' segments are not allowed")]
    DotSegment,
    /// A segment starts with `..`.
    #[error("segments starting with '..' are reserved for the volume's own bookkeeping")]
    ReservedPrefix,
    /// The path contains a control character.
    #[error("it contains a control character")]
    ControlCharacter,
    /// The path contains `\`.
    #[error("it contains a backslash")]
    Backslash,
    /// A segment is longer than [`MAX_SEGMENT_BYTES`].
    #[error("a segment is {0} bytes long, the maximum is {MAX_SEGMENT_BYTES}")]
    SegmentTooLong(usize),
    /// The path is longer than [`MAX_PATH_BYTES`].
    #[error("it is {0} bytes long, the maximum is {MAX_PATH_BYTES}")]
    TooLong(usize),
    /// The path has more than [`MAX_SEGMENTS`] segments.
    #[error("it has more than {MAX_SEGMENTS} segments")]
    TooManySegments,
}

/// Two paths of one set collide; the message names both.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathConflict {
    /// The same path was requested twice.
    #[error("file path {0:?} is requested twice")]
    Duplicate(String),
    /// One path is a file and another needs it to be a directory.
    #[error(
        "file path {file:?} conflicts with {nested:?}: it cannot be both a file and a directory"
    )]
    FileAndDirectory {
        /// The path that would be a file.
        file: String,
        /// The path that needs `file` to be a directory.
        nested: String,
    },
}

/// Checks that a set of paths can coexist in one volume: no duplicates, and no path is a proper
/// prefix (by segments) of another. The first conflict in sorted order is reported.
pub fn check_set<'a>(paths: impl IntoIterator<Item = &'a FilePath>) -> Result<(), PathConflict> {
    let mut sorted: Vec<&str> = paths.into_iter().map(FilePath::as_str).collect();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(PathConflict::Duplicate(pair[0].to_owned()));
    }
    let all: HashSet<&str> = sorted.iter().copied().collect();
    for path in &sorted {
        // Every proper prefix ending at a '/' must not itself be a requested file.
        for (index, _) in path.match_indices('/') {
            let prefix = &path[..index];
            if all.contains(prefix) {
                return Err(PathConflict::FileAndDirectory {
                    file: prefix.to_owned(),
                    nested: (*path).to_owned(),
                });
            }
        }
    }
    Ok(())
}

/// `raw` as a Rust-escaped quoted string, cut to [`QUOTE_CHARS`] characters.
fn quote(raw: &str) -> String {
    match raw.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &raw[..cut], raw.len()),
        None => format!("{raw:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Component, Path};

    use proptest::prelude::*;

    use super::*;

    fn reason(raw: &str) -> Reason {
        FilePath::parse(raw).expect_err(raw).reason
    }

    #[test]
    fn accepts_ordinary_paths() {
        for ok in [
            "password",
            "db/url",
            "a/b/c",
            ".hidden",
            "a.b",
            "x..y",
            "a/.b",
            "key with spaces",
            "ключ/値",
            "-dash",
            "UPPER_lower-09",
        ] {
            let p = FilePath::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(p.as_str(), ok);
            assert_eq!(p.to_string(), ok);
        }
    }

    #[test]
    fn rejects_named_cases() {
        let cases: &[(&str, Reason)] = &[
            ("", Reason::Empty),
            ("/etc/passwd", Reason::Absolute),
            ("/", Reason::Absolute),
            ("a//b", Reason::EmptySegment),
            ("a/", Reason::EmptySegment),
            (".", Reason::DotSegment),
            ("..", Reason::DotSegment),
            ("../x", Reason::DotSegment),
            ("a/../../x", Reason::DotSegment),
            ("a/./b", Reason::DotSegment),
            ("..data", Reason::ReservedPrefix),
            ("a/..data", Reason::ReservedPrefix),
            ("..2026_01_01_00_00_00.1", Reason::ReservedPrefix),
            ("...", Reason::ReservedPrefix),
            ("a\0b", Reason::ControlCharacter),
            ("a\nb", Reason::ControlCharacter),
            ("tab\there", Reason::ControlCharacter),
            ("del\u{7f}", Reason::ControlCharacter),
            ("c1\u{85}", Reason::ControlCharacter),
            ("a\\b", Reason::Backslash),
            ("..\\x", Reason::Backslash),
        ];
        for (raw, want) in cases {
            assert_eq!(&reason(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn length_limits() {
        let seg = "s".repeat(MAX_SEGMENT_BYTES);
        assert!(FilePath::parse(&seg).is_ok());
        assert_eq!(
            reason(&format!("{seg}s")),
            Reason::SegmentTooLong(MAX_SEGMENT_BYTES + 1)
        );
        // Multi-byte characters count in bytes, not characters.
        let wide = "é".repeat(127);
        assert_eq!(reason(&wide), Reason::SegmentTooLong(254));

        let four = [seg.as_str(); 4].join("/");
        assert_eq!(four.len(), 1015);
        assert!(FilePath::parse(&four).is_ok());
        let too_long = format!("{four}/abcdefghi");
        assert_eq!(too_long.len(), 1025);
        assert_eq!(reason(&too_long), Reason::TooLong(1025));

        let sixteen = ["a"; MAX_SEGMENTS].join("/");
        assert!(FilePath::parse(&sixteen).is_ok());
        assert_eq!(reason(&format!("{sixteen}/a")), Reason::TooManySegments);
    }

    #[test]
    fn accessors() {
        let p = FilePath::parse("db/primary/url").unwrap();
        assert_eq!(p.top_level(), "db");
        assert_eq!(p.segments().collect::<Vec<_>>(), ["db", "primary", "url"]);
        assert_eq!(FilePath::parse("x").unwrap().top_level(), "x");
        assert_eq!("db/url".parse::<FilePath>().unwrap().as_str(), "db/url");
    }

    #[test]
    fn messages_name_the_key_and_escape_it() {
        let err = FilePath::parse("../etc/shadow").unwrap_err().to_string();
        assert!(err.contains("\"../etc/shadow\""), "{err}");
        assert!(err.contains("'..'"), "{err}");
        let err = FilePath::parse("bad\nkey").unwrap_err().to_string();
        assert!(err.contains(r#""bad\nkey""#), "{err}");
        assert!(!err.contains('\n'));
        let huge = format!("/{}", "x".repeat(10_000));
        let err = FilePath::parse(&huge).unwrap_err().to_string();
        assert!(err.len() < 300, "{}", err.len());
        assert!(err.contains("10001 bytes"), "{err}");
    }

    fn set(paths: &[&str]) -> Result<(), PathConflict> {
        let parsed: Vec<FilePath> = paths.iter().map(|p| FilePath::parse(p).unwrap()).collect();
        check_set(&parsed)
    }

    #[test]
    fn set_rules() {
        assert_eq!(set(&[]), Ok(()));
        assert_eq!(set(&["a", "b", "c/d", "c/e", "ab/c", "a.b"]), Ok(()));
        assert_eq!(
            set(&["a", "b", "a"]),
            Err(PathConflict::Duplicate("a".into()))
        );
        assert_eq!(
            set(&["a/b/c", "x", "a/b"]),
            Err(PathConflict::FileAndDirectory {
                file: "a/b".into(),
                nested: "a/b/c".into()
            })
        );
        assert_eq!(
            set(&["a/b", "a"]),
            Err(PathConflict::FileAndDirectory {
                file: "a".into(),
                nested: "a/b".into()
            })
        );
        // A shared string prefix is not a directory prefix.
        assert_eq!(set(&["ab", "a/b", "abc/d"]), Ok(()));
        let msg = set(&["a", "a/b"]).unwrap_err().to_string();
        assert!(msg.contains("\"a\"") && msg.contains("\"a/b\""), "{msg}");
    }

    /// Building blocks chosen to hit every rule, glued together in random order.
    fn hostile() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("/".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("\0".to_owned()),
            Just("\\".to_owned()),
            Just("é".to_owned()),
            Just("\u{202e}".to_owned()),
            Just("💥".to_owned()),
            Just("\n".to_owned()),
            "[a-z]{1,4}",
            "[a-z]{250,256}",
            any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    fn assert_stays_under_root(path: &FilePath) {
        let root = Path::new("/volume/root");
        let joined = root.join(path.as_str());
        assert!(joined.starts_with(root), "{joined:?}");
        let rest = joined.strip_prefix(root).unwrap();
        let mut count = 0;
        for component in rest.components() {
            count += 1;
            assert!(
                matches!(component, Component::Normal(_)),
                "{path:?} has component {component:?}"
            );
        }
        assert_eq!(count, path.segments().count(), "{path:?}");
        assert!(
            path.segments()
                .all(|s| !s.is_empty() && !s.starts_with(".."))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn accepted_paths_stay_under_the_root(raw in prop_oneof![hostile(), any::<String>(), "[a-z./]{0,12}"]) {
            if let Ok(path) = FilePath::parse(&raw) {
                assert_stays_under_root(&path);
                prop_assert!(path.as_str().len() <= MAX_PATH_BYTES);
                prop_assert!(path.segments().count() <= MAX_SEGMENTS);
                prop_assert!(!raw.contains('\\') && !raw.contains('\0'));
            }
        }

        #[test]
        fn dot_dot_segments_and_absolute_paths_are_rejected(
            prefix in hostile(),
            suffix in hostile(),
            absolute in any::<bool>(),
        ) {
            let traversal = format!("{prefix}/../{suffix}");
            prop_assert!(FilePath::parse(&traversal).is_err(), "{:?}", traversal);
            let leading = format!("../{suffix}");
            prop_assert!(FilePath::parse(&leading).is_err(), "{:?}", leading);
            let trailing = format!("{prefix}/..");
            prop_assert!(FilePath::parse(&trailing).is_err(), "{:?}", trailing);
            let rooted = if absolute { format!("/{suffix}") } else { format!("//{prefix}") };
            prop_assert!(FilePath::parse(&rooted).is_err(), "{:?}", rooted);
        }

        #[test]
        fn verdict_matches_the_rules(raw in hostile()) {
            let has_dot_dot = raw.split('/').any(|s| s == "..");
            if has_dot_dot || raw.starts_with('/') {
                prop_assert!(FilePath::parse(&raw).is_err());
            }
        }
    }
}
