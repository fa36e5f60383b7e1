//! The `Password` generator, with ESO's semantics (sethvargo/go-password): `length` characters
//! of which `digits` are digits and `symbols` symbols, the rest letters; with `allowRepeat`
//! false no character appears twice. Drawn from the OS CSPRNG without modulo bias, positions
//! shuffled. No state, no lease: nothing to renew or clean up.

use std::collections::BTreeMap;

use async_trait::async_trait;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::{Generated, Generator, GeneratorError};
use crate::api::generator::PasswordSpec;
use crate::api::rules::MAX_PASSWORD_LENGTH;
use crate::secret::SecretBytes;

/// ESO's (and go-password's) default symbols.
pub const DEFAULT_SYMBOLS: &str = "~!@#$%^&*()_+`-={}|[]\\:\"<>?,./";
const LOWER: &str = "abcdefghijklmnopqrstuvwxyz";
const UPPER: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const DIGITS: &str = "0123456789";
/// Most distinct symbol characters: the CRD's bound on `symbolCharacters`, re-checked here (a
/// manifest in standalone mode has no schema in front of it).
const MAX_SYMBOL_CHARACTERS: usize = 256;

/// A validated `Password` spec.
#[derive(Debug)]
pub struct Password {
    length: usize,
    digits: usize,
    symbols: usize,
    letters: Vec<char>,
    digit_chars: Vec<char>,
    symbol_chars: Vec<char>,
    allow_repeat: bool,
}

impl Password {
    /// Checks `spec` and resolves its defaults (ESO: a quarter of the length each, rounded
    /// down, for digits and symbols).
    pub fn new(spec: &PasswordSpec) -> Result<Self, GeneratorError> {
        let invalid = |m: String| Err(GeneratorError::Invalid(m));
        if spec.length == 0 || spec.length > MAX_PASSWORD_LENGTH {
            return invalid(format!(
                "Password length {} is not between 1 and {MAX_PASSWORD_LENGTH}",
                spec.length
            ));
        }
        let length = spec.length as usize;
        let digits = spec.digits.map_or(length / 4, |d| d as usize);
        let symbols = spec.symbols.map_or(length / 4, |s| s as usize);
        if digits.saturating_add(symbols) > length {
            return invalid(format!(
                "Password digits ({digits}) + symbols ({symbols}) exceed its length ({length})"
            ));
        }
        let letters: Vec<char> = if spec.no_upper {
            LOWER.chars().collect()
        } else {
            LOWER.chars().chain(UPPER.chars()).collect()
        };
        let digit_chars: Vec<char> = DIGITS.chars().collect();
        let symbol_text = spec.symbol_characters.as_deref().unwrap_or(DEFAULT_SYMBOLS);
        let mut symbol_chars: Vec<char> = Vec::new();
        for c in symbol_text.chars() {
            // Distinct characters only: a duplicate would make one symbol likelier than the
            // others. With no repeats allowed, a letter or digit listed as a symbol could
            // appear twice (once per class), so it does not count as a symbol then.
            let taken = !spec.allow_repeat && (letters.contains(&c) || digit_chars.contains(&c));
            if !symbol_chars.contains(&c) && !taken && !c.is_control() {
                symbol_chars.push(c);
            }
            if symbol_chars.len() > MAX_SYMBOL_CHARACTERS {
                return invalid(format!(
                    "Password symbolCharacters has more than {MAX_SYMBOL_CHARACTERS} characters"
                ));
            }
        }
        let letter_count = length - digits - symbols;
        if symbols > 0 && symbol_chars.is_empty() {
            return invalid("Password symbolCharacters holds no usable symbol".into());
        }
        if !spec.allow_repeat {
            for (class, wanted, available) in [
                ("letters", letter_count, letters.len()),
                ("digits", digits, digit_chars.len()),
                ("symbols", symbols, symbol_chars.len()),
            ] {
                if wanted > available {
                    return invalid(format!(
                        "Password needs {wanted} distinct {class} but only {available} exist; \
                         set allowRepeat: true or ask for fewer"
                    ));
                }
            }
        }
        Ok(Self {
            length,
            digits,
            symbols,
            letters,
            digit_chars,
            symbol_chars,
            allow_repeat: spec.allow_repeat,
        })
    }

    /// A new password.
    pub fn make(&self) -> Result<Zeroizing<String>, GeneratorError> {
        let mut rng = Draws::new();
        let mut chars: Zeroizing<Vec<char>> = Zeroizing::new(Vec::with_capacity(self.length));
        let letters = self.length - self.digits - self.symbols;
        for (alphabet, count) in [
            (&self.letters, letters),
            (&self.digit_chars, self.digits),
            (&self.symbol_chars, self.symbols),
        ] {
            if self.allow_repeat {
                for _ in 0..count {
                    chars.push(alphabet[rng.below(alphabet.len())?]);
                }
            } else {
                // The first `count` of a partial Fisher-Yates shuffle: distinct, each subset
                // equally likely.
                let mut pool: Zeroizing<Vec<char>> = Zeroizing::new(alphabet.clone());
                for i in 0..count {
                    let j = i + rng.below(pool.len() - i)?;
                    pool.swap(i, j);
                    chars.push(pool[i]);
                }
            }
        }
        // Where the digits and symbols sit must be as random as which they are.
        for i in (1..chars.len()).rev() {
            let j = rng.below(i + 1)?;
            chars.swap(i, j);
        }
        Ok(Zeroizing::new(chars.iter().collect()))
    }
}

#[async_trait]
impl Generator for Password {
    async fn generate(&self) -> Result<Generated, GeneratorError> {
        let password = self.make()?;
        let mut values = BTreeMap::new();
        values.insert(
            "password".to_string(),
            SecretBytes::new(password.as_bytes().to_vec()),
        );
        Ok(Generated {
            values,
            state: None,
            lease: None,
        })
    }
}

/// Uniform draws from the OS CSPRNG, fetched a block at a time.
struct Draws {
    rng: SystemRandom,
    block: Zeroizing<[u8; 256]>,
    used: usize,
}

impl Draws {
    fn new() -> Self {
        Self {
            rng: SystemRandom::new(),
            block: Zeroizing::new([0; 256]),
            used: 256,
        }
    }

    fn next_u32(&mut self) -> Result<u32, GeneratorError> {
        if self.used + 4 > self.block.len() {
            self.rng.fill(&mut self.block[..]).map_err(|_| {
                GeneratorError::Backend(crate::providers::ProviderError::Unavailable(
                    "the system's random number generator failed".into(),
                ))
            })?;
            self.used = 0;
        }
        let mut word = [0u8; 4];
        word.copy_from_slice(&self.block[self.used..self.used + 4]);
        self.used += 4;
        Ok(u32::from_le_bytes(word))
    }

    /// A uniform draw in `0..n` (`n` > 0): draws past the largest multiple of `n` are
    /// rejected, so no value is likelier than another.
    fn below(&mut self, n: usize) -> Result<usize, GeneratorError> {
        let n = n as u64;
        let zone = (1u64 << 32) / n * n;
        loop {
            let x = u64::from(self.next_u32()?);
            if x < zone {
                return Ok((x % n) as usize);
            }
        }
    }
}

#[cfg(test)]
#[path = "password_tests.rs"]
mod tests;
