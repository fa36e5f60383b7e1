//! Types that carry secret material. They zeroize on drop and never print their contents, so a
//! value cannot leak through `Debug`, a log line or an error message by accident.

use std::fmt;

use zeroize::Zeroizing;

/// Bytes of a secret value; `Debug` prints only the length.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretBytes(Zeroizing<Vec<u8>>);

impl SecretBytes {
    /// Wraps bytes that must be treated as secret.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The raw bytes, for writing into a volume or parsing.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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
        write!(f, "SecretBytes(<redacted, {} bytes>)", self.0.len())
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
        let t = SecretString::new("eyJhbGciOi.token".into());
        assert!(!format!("{t:?} {t:#?}").contains("eyJ"));
        assert_eq!(t.expose(), "eyJhbGciOi.token");
    }
}
