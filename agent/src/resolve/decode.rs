//! `decodingStrategy`: None, Base64, Base64URL, Auto (decode when it decodes, else keep), as ESO.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};

use super::{Context, ResolveError};
use crate::api::external_secret::DecodingStrategy;
use crate::providers::RemoteKey;
use crate::secret::SecretBytes;

/// Decodes a fetched value as the strategy says; the value itself (not a copy) when it stays
/// as it is: a value may be many MiB, and `property` or `extract` only read it.
pub fn apply<'a>(
    ctx: &Context,
    key: &RemoteKey,
    strategy: Option<DecodingStrategy>,
    raw: &'a SecretBytes,
) -> Result<Cow<'a, SecretBytes>, ResolveError> {
    let fail = |strategy| ResolveError::Decode {
        ctx: ctx.boxed(),
        key: key.clone(),
        strategy,
    };
    let input = raw.expose();
    // A decoded file is still that file: it keeps the mode its backend gave it.
    let new = |bytes: Vec<u8>| Cow::Owned(SecretBytes::new(bytes).with_file_mode(raw.file_mode()));
    match strategy.unwrap_or_default() {
        DecodingStrategy::None => Ok(Cow::Borrowed(raw)),
        DecodingStrategy::Base64 => STANDARD.decode(input).map(new).map_err(|_| fail("Base64")),
        DecodingStrategy::Base64Url => URL_SAFE
            .decode(input)
            .map(new)
            .map_err(|_| fail("Base64URL")),
        DecodingStrategy::Auto => Ok(STANDARD
            .decode(input)
            .or_else(|_| URL_SAFE.decode(input))
            .map(new)
            .unwrap_or(Cow::Borrowed(raw))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let key = RemoteKey {
            key: "k".into(),
            version: None,
        };
        let ctx = super::super::tests::ctx();
        let run = |s, v: &str| {
            apply(&ctx, &key, s, &SecretBytes::from(v))
                .map(|b| b.expose().to_vec())
                .map_err(|e| e.to_string())
        };
        assert_eq!(run(None, "aGk="), Ok(b"aGk=".to_vec()));
        assert_eq!(
            run(Some(DecodingStrategy::Base64), "aGk="),
            Ok(b"hi".to_vec())
        );
        assert_eq!(
            run(Some(DecodingStrategy::Base64Url), "-_8="),
            Ok(vec![0xfb, 0xff])
        );
        assert!(
            run(Some(DecodingStrategy::Base64), "-_8=")
                .unwrap_err()
                .contains("not valid Base64")
        );
        assert_eq!(
            run(Some(DecodingStrategy::Auto), "-_8="),
            Ok(vec![0xfb, 0xff])
        );
        assert_eq!(
            run(Some(DecodingStrategy::Auto), "not base64!"),
            Ok(b"not base64!".to_vec())
        );
    }
}
