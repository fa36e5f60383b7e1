//! A plugin's `Secret.data` as one value: a JSON object with one member per entry, so that
//! `remoteRef.property` picks an entry and `dataFrom.extract` yields all of them, with the
//! resolution code every provider shares.
//!
//! An entry whose bytes are UTF-8 is a JSON string of that text. Bytes that are not UTF-8 cannot
//! be a JSON string: when such an entry is the only one, the value is its bytes as they are (a
//! `remoteRef` without `property` mounts them unchanged); among several entries it becomes the
//! standard, padded base64 of its bytes.

use std::collections::HashMap;

use base64::Engine;
use zeroize::Zeroize;

use crate::secret::SecretBytes;

/// The value of `data`: its one entry's bytes when they are not UTF-8, else the JSON object of
/// the entries, members sorted by name. The entries are zeroized on the way.
pub(super) fn from_data(mut data: HashMap<String, Vec<u8>>) -> SecretBytes {
    if data.len() == 1
        && let Some(only) = data.values_mut().next()
        && std::str::from_utf8(only).is_err()
    {
        return SecretBytes::new(std::mem::take(only));
    }
    let mut names: Vec<String> = data.keys().cloned().collect();
    names.sort();
    // Sized up front (escapes aside) so the buffer holding values rarely moves.
    let guess: usize = data
        .iter()
        .map(|(k, v)| k.len() + v.len() * 4 / 3 + 8)
        .sum();
    let mut buf = zeroize::Zeroizing::new(Vec::with_capacity(guess + 2));
    buf.push(b'{');
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        push_json_string(&mut buf, name);
        buf.push(b':');
        if let Some(value) = data.get_mut(name) {
            match std::str::from_utf8(value) {
                Ok(text) => push_json_string(&mut buf, text),
                Err(_) => {
                    let mut encoded = base64::engine::general_purpose::STANDARD.encode(&*value);
                    push_json_string(&mut buf, &encoded);
                    encoded.zeroize();
                }
            }
            value.zeroize();
        }
    }
    buf.push(b'}');
    // Moves the bytes out (no copy); the emptied buffer is zeroized on drop.
    SecretBytes::new(std::mem::take(&mut *buf))
}

/// Appends `s` as a JSON string.
fn push_json_string(buf: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_become_a_sorted_json_object() {
        let data: HashMap<String, Vec<u8>> = [
            ("user".to_string(), b"shop".to_vec()),
            ("pass\"word".to_string(), b"a\"b\n".to_vec()),
            ("bin".to_string(), vec![0xff, 0x00, 0x80]),
        ]
        .into();
        let value = from_data(data);
        let text = std::str::from_utf8(value.expose()).unwrap();
        assert_eq!(
            text,
            r#"{"bin":"/wCA","pass\"word":"a\"b\n","user":"shop"}"#
        );
        assert_eq!(from_data(HashMap::new()).expose(), b"{}");
        let single: HashMap<String, Vec<u8>> = [("value".to_string(), vec![0xff, 0x00])].into();
        assert_eq!(from_data(single).expose(), [0xff, 0x00]);
        let text: HashMap<String, Vec<u8>> = [("value".to_string(), b"plain".to_vec())].into();
        assert_eq!(from_data(text).expose(), br#"{"value":"plain"}"#);
    }
}
