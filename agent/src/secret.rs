//! Types that carry secret material. They zeroize on drop and never print their contents, so a
//! value cannot leak through `Debug`, a log line or an error message by accident.

use std::fmt;

use zeroize::Zeroizing;

/// Bytes of a secret value; `Debug` prints only the length (and the file mode, if any).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretBytes {
    bytes: Zeroizing<Vec<u8>>,
    /// The file mode the backend gave the value (only providers that return files do), kept
    /// beside the bytes so it travels through the cache and resolution unchanged; the
    /// ExternalSecret's own `target.files` modes win over it.
    file_mode: Option<u32>,
}

impl SecretBytes {
    /// Wraps bytes that must be treated as secret.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self {
            bytes: Zeroizing::new(bytes),
            file_mode: None,
        }
    }

    /// The same value, with the file mode its backend gave it (already made safe by the caller).
    pub fn with_file_mode(mut self, mode: Option<u32>) -> Self {
        self.file_mode = mode;
        self
    }

    /// The file mode the backend gave this value, if any.
    pub fn file_mode(&self) -> Option<u32> {
        self.file_mode
    }

    /// The raw bytes, for writing into a volume or parsing.
    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl From<&str> for SecretBytes {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes().to_vec())
    }
}

impl From<String> for SecretBytes {
    fn from(s: String) -> Self {
        Self::new(s.into_bytes())
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.file_mode {
            Some(mode) => write!(
                f,
                "SecretBytes(<redacted, {} bytes>, mode {mode:#o})",
                self.bytes.len()
            ),
            None => write!(f, "SecretBytes(<redacted, {} bytes>)", self.bytes.len()),
        }
    }
}

/// A secret string (a token, a password); `Debug` prints only the length.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretString(Zeroizing<String>);

impl SecretString {
    /// Wraps a string that must be treated as secret.
    pub fn new(s: String) -> Self {
        Self(Zeroizing::new(s))
    }

    /// The raw string, for sending to the one backend that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretString(<redacted, {} bytes>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = SecretBytes::from("hunter2-super-secret");
        let printed = format!("{s:?} {s:#?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("20 bytes"));
        let moded = SecretBytes::from("hunter2").with_file_mode(Some(0o440));
        assert_eq!(
            format!("{moded:?}"),
            "SecretBytes(<redacted, 7 bytes>, mode 0o440)"
        );
        assert_eq!(moded.file_mode(), Some(0o440));
        let t = SecretString::new("eyJhbGciOi.token".into());
        assert!(!format!("{t:?} {t:#?}").contains("eyJ"));
        assert_eq!(t.expose(), "eyJhbGciOi.token");
    }
}
