//! Bounded JSON: what an untrusted answer may make the agent build, not only how many bytes it
//! may send. A backend a tenant runs can answer 14 MB holding a million tiny keys, under the
//! 16 MiB byte cap; parsed into a tree that took ~180 MB, and the agent runs in 128Mi.
//!
//! Two bounds, both checked before anything is built:
//! - [`Counter`] counts the keys and elements of a JSON text and its nesting depth as the bytes
//!   arrive (a byte scan, no allocation), and refuses past [`MAX_ITEMS`] or [`MAX_DEPTH`]; a
//!   parse follows only for texts it let through, whose tree is then at most its bytes plus a
//!   small fixed cost per item.
//! - [`Budget`]: the bytes of answers being held and parsed, node-wide. Each answer holds its
//!   share from its first chunk until what it became is built (and the answer dropped); past the
//!   budget it is refused, never waited for, so that answers of several tenants cannot add up
//!   and no holder can block another. The first [`FREE_BYTES`] of each are not charged, so a
//!   budget taken by hostile answers never refuses other tenants' ordinary secrets.
//!
//! The bottom of the crate: imports nothing of it.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::de::DeserializeOwned;

/// Most keys and array elements (together, at any depth) one JSON answer or value may hold.
pub const MAX_ITEMS: usize = 10_000;

/// Deepest nesting of objects and arrays one JSON answer or value may have.
pub const MAX_DEPTH: usize = 32;

/// What one parsed item may cost beyond its text (a map node, a `Value`, a `String` header):
/// charged per item, so that [`MAX_ITEMS`] small items are accounted for.
pub const ITEM_COST: usize = 128;

/// Bytes that answers being held and parsed may take at once, node-wide: room for one answer
/// at the byte cap (16 MiB, charged twice: its text and what is built from it).
pub const NODE_BUDGET_BYTES: usize = 32 << 20;

/// The first bytes of every hold, never charged: typical secrets are far smaller, so while
/// hostile answers take the whole budget other tenants' publishes are still never refused.
/// What this lets through is bounded by the calls in flight (kubelet's publishes, the
/// mirror's workers), a few MiB at most.
pub const FREE_BYTES: usize = 64 << 10;

/// Why a JSON text is not parsed. Never carries any of the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// More keys and elements than [`MAX_ITEMS`].
    #[error("holds more than {MAX_ITEMS} JSON keys and elements (the agent's limit)")]
    TooManyItems,
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("nests JSON objects and arrays deeper than {MAX_DEPTH} levels (the agent's limit)")]
    TooDeep,
    /// The node-wide [`Budget`] is taken by other answers being parsed.
    #[error(
        "needs {needed} bytes to be parsed while answers being parsed already hold {held} of the \
         agent's {limit} bytes for them; retried later"
    )]
    Busy {
        /// What this answer asked for.
        needed: usize,
        /// What other answers held then.
        held: usize,
        /// The budget.
        limit: usize,
    },
}

/// Counts the items (keys and elements) and nesting of a JSON text fed in pieces, without
/// parsing it: commas and brackets outside strings. An object or array of `n` items has
/// `n - 1` commas, so commas plus containers is the number of items (plus one per empty
/// container). Syntax is the parser's business, after the count passed.
#[derive(Debug, Default, Clone)]
pub struct Counter {
    items: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Counter {
    /// Counts `bytes`, the next piece of the text; refuses once a bound is passed.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), Refused> {
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth += 1;
                    self.items += 1;
                    if self.depth > MAX_DEPTH {
                        return Err(Refused::TooDeep);
                    }
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b',' => self.items += 1,
                _ => continue,
            }
            if self.items > MAX_ITEMS {
                return Err(Refused::TooManyItems);
            }
        }
        Ok(())
    }

    /// Items counted so far.
    pub fn items(&self) -> usize {
        self.items
    }
}

/// Counts a whole text (see [`Counter`]); returns its items.
pub fn check(bytes: &[u8]) -> Result<usize, Refused> {
    let mut counter = Counter::default();
    counter.feed(bytes)?;
    Ok(counter.items())
}

/// What parsing a text of `len` bytes and `items` items into a tree may take, beside the text.
pub fn parsed_cost(len: usize, items: usize) -> usize {
    len.saturating_add(items.saturating_mul(ITEM_COST))
}

/// Why [`parse`] gave no value. Never carries any of the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A bound was passed; nothing was built.
    #[error("{0}")]
    Refused(#[from] Refused),
    /// Not JSON of the expected shape (serde's message is left out: it may quote the text).
    #[error("is not JSON of the expected shape")]
    Invalid,
}

/// Parses `bytes` as `T` once [`check`] passed and its tree's cost is held in the node's
/// budget. The returned [`Held`] is that cost: keep it until the value is converted or dropped.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, Held<'static>), ParseError> {
    let items = check(bytes)?;
    let held = Budget::node().hold(parsed_cost(bytes.len(), items))?;
    let value = serde_json::from_slice(bytes).map_err(|_| ParseError::Invalid)?;
    Ok((value, held))
}

/// A byte budget shared by the answers being held and parsed (see the module comment).
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    held: AtomicUsize,
}

static NODE: Budget = Budget::new(NODE_BUDGET_BYTES);

impl Budget {
    /// A budget of `limit` bytes.
    pub const fn new(limit: usize) -> Self {
        Self {
            limit,
            held: AtomicUsize::new(0),
        }
    }

    /// The node-wide budget of [`NODE_BUDGET_BYTES`].
    pub fn node() -> &'static Budget {
        &NODE
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Holds `bytes` until the returned guard is dropped; refused when that would pass the
    /// limit.
    pub fn hold(&self, bytes: usize) -> Result<Held<'_>, Refused> {
        let mut held = Held {
            budget: self,
            bytes: 0,
            charged: 0,
        };
        held.grow(bytes)?;
        Ok(held)
    }

    fn take(&self, bytes: usize) -> Result<(), Refused> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
            .map_err(|held| Refused::Busy {
                needed: bytes,
                held,
                limit: self.limit,
            })
    }
}

/// Bytes held in a [`Budget`]; given back when dropped.
#[derive(Debug)]
pub struct Held<'a> {
    budget: &'a Budget,
    /// All bytes held, the first [`FREE_BYTES`] included.
    bytes: usize,
    /// What the budget was charged.
    charged: usize,
}

impl Held<'_> {
    /// Holds `bytes` more (the next chunk of an answer); refused when that would pass the limit.
    pub fn grow(&mut self, bytes: usize) -> Result<(), Refused> {
        let free = FREE_BYTES.saturating_sub(self.bytes).min(bytes);
        self.budget.take(bytes - free)?;
        self.charged += bytes - free;
        self.bytes += bytes;
        Ok(())
    }

    /// Bytes this guard holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.charged, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> String {
        let members: Vec<String> = (0..n).map(|i| format!("\"k{i}\":\"v\"")).collect();
        format!("{{{}}}", members.join(","))
    }

    #[test]
    fn items_and_depth_are_counted_outside_strings() {
        assert_eq!(check(br#"{"a":1,"b":[1,2,3],"c":{}}"#), Ok(7));
        // Brackets, commas and escaped quotes inside strings are text.
        assert_eq!(check(br#"{"a,[{":"x\",{[,","b":"\\"}"#), Ok(2));
        assert_eq!(check(b"\"just a string, with a comma\""), Ok(0));
        assert_eq!(check(keys(MAX_ITEMS).as_bytes()), Ok(MAX_ITEMS));
        assert_eq!(
            check(keys(MAX_ITEMS + 1).as_bytes()),
            Err(Refused::TooManyItems)
        );
        let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(check(deep.as_bytes()).is_ok());
        let deeper = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(check(deeper.as_bytes()), Err(Refused::TooDeep));
    }

    #[test]
    fn a_million_keys_are_refused_after_a_few_of_them() {
        let mut counter = Counter::default();
        let text = keys(1_000_000);
        let mut read = 0;
        let refused = text.as_bytes().chunks(4096).find_map(|chunk| {
            read += chunk.len();
            counter.feed(chunk).err()
        });
        assert_eq!(refused, Some(Refused::TooManyItems));
        assert!(read < 200 << 10, "read {read} bytes of {}", text.len());
    }

    #[test]
    fn pieces_split_inside_escapes_count_the_same() {
        let text = br#"{"a\"b":"c\\","d":["e\"",1]}"#;
        let whole = check(text).unwrap();
        for at in 0..text.len() {
            let mut counter = Counter::default();
            counter.feed(&text[..at]).unwrap();
            counter.feed(&text[at..]).unwrap();
            assert_eq!(counter.items(), whole, "split at {at}");
        }
    }

    #[test]
    fn the_budget_is_shared_refused_past_its_limit_and_given_back() {
        let budget = Budget::new(100);
        let mut first = budget.hold(FREE_BYTES + 60).unwrap();
        assert_eq!(budget.held(), 60, "the first FREE_BYTES are not charged");
        let err = budget.hold(FREE_BYTES + 50).unwrap_err();
        assert_eq!(
            err,
            Refused::Busy {
                needed: 50,
                held: 60,
                limit: 100
            }
        );
        assert!(first.grow(40).is_ok());
        assert!(first.grow(1).is_err(), "growing past the limit");
        assert_eq!((first.bytes(), budget.held()), (FREE_BYTES + 100, 100));
        // A full budget still lets small answers through, chunk by chunk.
        let mut small = budget.hold(0).unwrap();
        for _ in 0..16 {
            small.grow(FREE_BYTES / 16).unwrap();
        }
        assert!(small.grow(1).is_err());
        drop((first, small));
        assert_eq!(budget.held(), 0);
        assert!(budget.hold(FREE_BYTES + 100).is_ok());
    }

    #[test]
    fn parse_refuses_before_building_and_never_quotes_the_text() {
        let err = parse::<serde_json::Value>(keys(MAX_ITEMS + 1).as_bytes()).unwrap_err();
        assert_eq!(err, ParseError::Refused(Refused::TooManyItems));
        let err = parse::<serde_json::Value>(b"{\"password\": hunter2-secret}").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let (value, held) = parse::<serde_json::Value>(br#"{"a":"b"}"#).unwrap();
        assert_eq!(value["a"], "b");
        assert_eq!(held.bytes(), parsed_cost(9, 1));
    }
}
