//! Bounds on what a YAML text may make the parser build, checked before it is deserialized.
//!
//! serde_norway loads a whole document's events before building a value, expands every alias by
//! copying what it names, and its scanner is quadratic in the nesting of flow collections. So a
//! small text could take gigabytes (500 aliases of a 1 MB scalar took 498 MB) or minutes (500 KB
//! of nested `[` took 51 s). This check streams the same parser's events (libyaml, as
//! serde_norway uses it), keeps only a stack and the size of each anchored node, and stops at the
//! first bound passed, before any of that is built: in time and memory linear in what it reads
//! up to the bound.

use std::collections::HashMap;
use std::mem::MaybeUninit;

use unsafe_libyaml_norway as unsafe_yaml;

/// How much a YAML text may hold, and expand to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the whole text.
    pub bytes: usize,
    /// Nesting of collections (a document's root collection is level 1).
    pub depth: usize,
    /// Nodes of the whole text (all its documents are held at once), every alias counted as
    /// the nodes it names.
    pub nodes: u64,
    /// Bytes of the scalars of the whole text, every alias counted as the bytes it names.
    pub expanded_bytes: u64,
}

impl Limits {
    /// `latchkey convert`: an admin's `kubectl get -A -o yaml` of a large cluster fits (a List of
    /// 10,000 ExternalSecrets is ~5 MB and ~600,000 nodes); the worst text within them (a million
    /// one-letter scalars, 2 MB) takes ~250 MB, as the List of 10,000 takes ~200 MB.
    pub const CONVERT: Limits = Limits {
        bytes: 32 << 20,
        depth: 64,
        nodes: 1_000_000,
        expanded_bytes: 32 << 20,
    };

    /// `latchkey node --manifests`: one file of the agent's manifest directory, read by the node
    /// agent at start inside its memory limit. Room for fake stores with a few MiB of demo
    /// values; the worst file within them takes ~50 MB while it is parsed.
    pub const MANIFESTS: Limits = Limits {
        bytes: 8 << 20,
        depth: 64,
        nodes: 100_000,
        expanded_bytes: 8 << 20,
    };
}

/// The bound a text passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Exceeded {
    /// The text is too long.
    #[error("longer than the limit of {limit} bytes")]
    Bytes {
        /// The limit.
        limit: usize,
    },
    /// Collections nest too deeply.
    #[error("collections nested more than {limit} levels deep")]
    Depth {
        /// The limit.
        limit: usize,
    },
    /// Too many nodes, aliases expanded.
    #[error("more than {limit} nodes, aliases expanded")]
    Nodes {
        /// The limit.
        limit: u64,
    },
    /// Scalars too long in total, aliases expanded.
    #[error("more than {limit} bytes of scalars, aliases expanded")]
    ExpandedBytes {
        /// The limit.
        limit: u64,
    },
    /// An alias names a collection it is inside of (an endless value).
    #[error("an alias names a collection it is part of")]
    Recursive,
}

/// A text refused: which document (1-based) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 1-based document number (0 for the whole text).
    pub document: usize,
    /// The bound passed.
    pub exceeded: Exceeded,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.document > 0 {
            write!(f, "document {}: ", self.document)?;
        }
        write!(f, "refused before parsing: {}", self.exceeded)
    }
}

impl std::error::Error for Refused {}

/// Reads `reader` as UTF-8 text of at most `limits.bytes`: a longer text is refused (an
/// `InvalidData` error) after reading one byte more than the limit, never held in memory whole.
pub fn read_bounded(reader: impl std::io::Read, limits: &Limits) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let mut bytes = Vec::new();
    reader
        .take(limits.bytes as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > limits.bytes {
        return Err(Error::new(
            ErrorKind::InvalidData,
            Exceeded::Bytes {
                limit: limits.bytes,
            },
        ));
    }
    String::from_utf8(bytes).map_err(|e| Error::new(ErrorKind::InvalidData, e.utf8_error()))
}

/// What a node expands to.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    nodes: u64,
    bytes: u64,
}

impl Size {
    fn add(&mut self, other: Size) {
        self.nodes = self.nodes.saturating_add(other.nodes);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

/// An open collection: its anchor and what it holds so far.
struct Frame {
    anchor: Option<Vec<u8>>,
    size: Size,
}

/// Checks `text` against `limits`. A YAML syntax error is not reported here: the check stops
/// there, and the deserializer, which stops at the same place, reports it.
pub fn check(text: &str, limits: &Limits) -> Result<(), Refused> {
    if text.len() > limits.bytes {
        return Err(Refused {
            document: 0,
            exceeded: Exceeded::Bytes {
                limit: limits.bytes,
            },
        });
    }
    let mut parser = Parser::new(text);
    let mut document = 0;
    let mut walk = Walk::new(limits);
    loop {
        let event = match parser.next() {
            Some(event) => event,
            None => return Ok(()),
        };
        let step = match event {
            Event::StreamEnd => return Ok(()),
            Event::DocumentStart => {
                document += 1;
                // Anchors are per document; the count is not.
                walk.anchors.clear();
                walk.stack.clear();
                Ok(())
            }
            Event::Scalar { anchor, len } => walk.node(
                anchor,
                Size {
                    nodes: 1,
                    bytes: len,
                },
            ),
            Event::Start { anchor } => walk.open(anchor),
            Event::End => walk.close(),
            Event::Alias { anchor } => walk.alias(&anchor),
            Event::Other => Ok(()),
        };
        step.map_err(|exceeded| Refused { document, exceeded })?;
    }
}

/// The walk over a text: the open collections and anchored sizes of the current document, and
/// the running total of the whole text.
struct Walk<'l> {
    limits: &'l Limits,
    stack: Vec<Frame>,
    /// Anchored nodes: `None` while the collection is still open.
    anchors: HashMap<Vec<u8>, Option<Size>>,
    total: Size,
}

impl<'l> Walk<'l> {
    fn new(limits: &'l Limits) -> Self {
        Self {
            limits,
            stack: Vec::new(),
            anchors: HashMap::new(),
            total: Size::default(),
        }
    }

    /// Charges `size` to the document and to every open collection.
    fn charge(&mut self, size: Size) -> Result<(), Exceeded> {
        self.total.add(size);
        if self.total.nodes > self.limits.nodes {
            return Err(Exceeded::Nodes {
                limit: self.limits.nodes,
            });
        }
        if self.total.bytes > self.limits.expanded_bytes {
            return Err(Exceeded::ExpandedBytes {
                limit: self.limits.expanded_bytes,
            });
        }
        if let Some(top) = self.stack.last_mut() {
            top.size.add(size);
        }
        Ok(())
    }

    fn node(&mut self, anchor: Option<Vec<u8>>, size: Size) -> Result<(), Exceeded> {
        if let Some(anchor) = anchor {
            self.anchors.insert(anchor, Some(size));
        }
        self.charge(size)
    }

    fn open(&mut self, anchor: Option<Vec<u8>>) -> Result<(), Exceeded> {
        self.charge(Size { nodes: 1, bytes: 0 })?;
        if self.stack.len() >= self.limits.depth {
            return Err(Exceeded::Depth {
                limit: self.limits.depth,
            });
        }
        if let Some(anchor) = &anchor {
            self.anchors.insert(anchor.clone(), None);
        }
        self.stack.push(Frame {
            anchor,
            size: Size { nodes: 1, bytes: 0 },
        });
        Ok(())
    }

    fn close(&mut self) -> Result<(), Exceeded> {
        let Some(frame) = self.stack.pop() else {
            return Ok(());
        };
        if let Some(anchor) = frame.anchor {
            self.anchors.insert(anchor, Some(frame.size));
        }
        // The frame's content was charged to the total as it came; only the parent is behind.
        if let Some(top) = self.stack.last_mut() {
            top.size.add(frame.size);
        }
        Ok(())
    }

    fn alias(&mut self, anchor: &[u8]) -> Result<(), Exceeded> {
        match self.anchors.get(anchor) {
            Some(Some(size)) => {
                let size = *size;
                self.charge(size)
            }
            Some(None) => Err(Exceeded::Recursive),
            // An unknown anchor: the deserializer refuses the document.
            None => Ok(()),
        }
    }
}

/// The parts of a libyaml event the check needs.
enum Event {
    StreamEnd,
    DocumentStart,
    Scalar { anchor: Option<Vec<u8>>, len: u64 },
    Start { anchor: Option<Vec<u8>> },
    End,
    Alias { anchor: Vec<u8> },
    Other,
}

/// libyaml's event parser over a borrowed text (as serde_norway drives it, minus the copies).
struct Parser<'t> {
    sys: Box<MaybeUninit<unsafe_yaml::yaml_parser_t>>,
    /// The parser reads `text` through a raw pointer: it must outlive the parser.
    _text: &'t str,
    failed: bool,
}

impl<'t> Parser<'t> {
    fn new(text: &'t str) -> Self {
        let mut sys = Box::new(MaybeUninit::<unsafe_yaml::yaml_parser_t>::uninit());
        let ptr = sys.as_mut_ptr();
        // SAFETY: `ptr` points to memory owned by `sys`, which lives (boxed, so never moved) as
        // long as the parser; initialize fills the struct before anything reads it. The input
        // pointer and length are those of `text`, which outlives the parser (`_text`).
        let ok = unsafe {
            let ok = unsafe_yaml::yaml_parser_initialize(ptr).ok;
            if ok {
                unsafe_yaml::yaml_parser_set_encoding(ptr, unsafe_yaml::YAML_UTF8_ENCODING);
                unsafe_yaml::yaml_parser_set_input_string(ptr, text.as_ptr(), text.len() as u64);
            }
            ok
        };
        Self {
            sys,
            _text: text,
            // libyaml's initialization returns a failure only for allocation failures (which abort
            // in this port); were it to, nothing would be checked, and the deserializer, which
            // initializes the same way, would fail too.
            failed: !ok,
        }
    }

    /// The next event; `None` after a syntax error (or once the stream has ended).
    fn next(&mut self) -> Option<Event> {
        if self.failed {
            return None;
        }
        let mut event = MaybeUninit::<unsafe_yaml::yaml_event_t>::uninit();
        let ptr = event.as_mut_ptr();
        // SAFETY: the parser was initialized (`failed` is false) and is not used elsewhere;
        // `yaml_parser_parse` fills `event` when it succeeds, and only then is it read and then
        // deleted, once. The anchor pointers are NUL-terminated strings owned by the event.
        unsafe {
            if unsafe_yaml::yaml_parser_parse(self.sys.as_mut_ptr(), ptr).fail {
                self.failed = true;
                return None;
            }
            let e = &*ptr;
            let out = match e.type_ {
                unsafe_yaml::YAML_STREAM_END_EVENT => {
                    self.failed = true;
                    Event::StreamEnd
                }
                unsafe_yaml::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
                unsafe_yaml::YAML_SCALAR_EVENT => Event::Scalar {
                    anchor: anchor(e.data.scalar.anchor),
                    len: e.data.scalar.length,
                },
                unsafe_yaml::YAML_SEQUENCE_START_EVENT => Event::Start {
                    anchor: anchor(e.data.sequence_start.anchor),
                },
                unsafe_yaml::YAML_MAPPING_START_EVENT => Event::Start {
                    anchor: anchor(e.data.mapping_start.anchor),
                },
                unsafe_yaml::YAML_SEQUENCE_END_EVENT | unsafe_yaml::YAML_MAPPING_END_EVENT => {
                    Event::End
                }
                unsafe_yaml::YAML_ALIAS_EVENT => Event::Alias {
                    anchor: anchor(e.data.alias.anchor).unwrap_or_default(),
                },
                _ => Event::Other,
            };
            unsafe_yaml::yaml_event_delete(ptr);
            Some(out)
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: `new` initialized the parser (initialization zeroes the struct before anything
        // else, so even a failed one is safe to delete: its null buffers free nothing).
        unsafe { unsafe_yaml::yaml_parser_delete(self.sys.as_mut_ptr()) }
    }
}

/// A copy of a NUL-terminated anchor name, `None` for a null pointer.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string that stays valid during the call.
unsafe fn anchor(ptr: *const u8) -> Option<Vec<u8>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: as the caller promises.
    Some(
        unsafe { std::ffi::CStr::from_ptr(ptr.cast()) }
            .to_bytes()
            .to_vec(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Limits = Limits {
        bytes: 10_000,
        depth: 8,
        nodes: 100,
        expanded_bytes: 1_000,
    };

    fn refused(text: &str) -> Option<Exceeded> {
        check(text, &SMALL).err().map(|r| r.exceeded)
    }

    #[test]
    fn ordinary_documents_pass() {
        assert_eq!(
            refused("a: 1\nb: [x, y, {c: d}]\n---\ne: &x f\ng: *x\n"),
            None
        );
        assert_eq!(refused(""), None);
        // A syntax error is the deserializer's to report.
        assert_eq!(refused("a: [1\n"), None);
    }

    #[test]
    fn each_bound_is_enforced() {
        assert!(matches!(
            refused(&"a".repeat(10_001)),
            Some(Exceeded::Bytes { .. })
        ));
        assert_eq!(
            refused(&format!("{}{}", "[".repeat(9), "]".repeat(9))),
            Some(Exceeded::Depth { limit: 8 })
        );
        assert_eq!(
            refused(&"[".repeat(5_000)),
            Some(Exceeded::Depth { limit: 8 })
        );
        let many = format!("[{}]", vec!["x"; 100].join(","));
        assert_eq!(refused(&many), Some(Exceeded::Nodes { limit: 100 }));
        let long = format!("a: &a {}\nb: [*a, *a]\n", "x".repeat(400));
        assert_eq!(
            refused(&long),
            Some(Exceeded::ExpandedBytes { limit: 1_000 })
        );
    }

    #[test]
    fn nested_aliases_are_counted_expanded() {
        // Billion laughs: each level doubles; the text stays tiny.
        let mut text = String::from("a0: &a0 [x, x]\n");
        for i in 1..10 {
            text.push_str(&format!("a{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1));
        }
        assert_eq!(refused(&text), Some(Exceeded::Nodes { limit: 100 }));
        assert_eq!(refused("a: &a [*a]\n"), Some(Exceeded::Recursive));
    }

    #[test]
    fn a_large_clusters_list_fits_the_convert_limits() {
        // As `kubectl get externalsecrets -A -o yaml` prints 10,000 of them (labels, two entries).
        let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
        for i in 0..10_000 {
            text.push_str(&format!(
                "- apiVersion: external-secrets.io/v1\n  kind: ExternalSecret\n  metadata:\n    \
                 name: es-{i}\n    namespace: ns-{}\n    uid: 0b5d7f7e-0000-4000-8000-{i:012}\n    \
                 resourceVersion: \"{i}\"\n    labels: {{app: a{i}, team: t}}\n  spec:\n    \
                 refreshInterval: 1h\n    secretStoreRef: {{name: vault, kind: \
                 ClusterSecretStore}}\n    target: {{name: es-{i}, creationPolicy: Owner}}\n    \
                 data:\n    - secretKey: password\n      remoteRef: {{key: apps/es-{i}, property: \
                 password}}\n    - secretKey: user\n      remoteRef: {{key: apps/es-{i}, property: \
                 user}}\n",
                i % 50
            ));
        }
        assert_eq!(check(&text, &Limits::CONVERT), Ok(()));
    }

    #[test]
    fn reading_stops_past_the_limit() {
        let ok = read_bounded(&b"a: 1\n"[..], &SMALL).unwrap();
        assert_eq!(ok, "a: 1\n");
        let big = vec![b'a'; 20_000];
        let err = read_bounded(&big[..], &SMALL).unwrap_err();
        assert_eq!(err.to_string(), "longer than the limit of 10000 bytes");
        // An endless reader is not read to its end.
        let err = read_bounded(std::io::repeat(b'a'), &SMALL).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn the_document_is_named_and_anchors_are_per_document() {
        let err = check("a: 1\n---\nb: [[[[[[[[[x]]]]]]]]]\n", &SMALL).unwrap_err();
        assert_eq!(err.document, 2);
        assert!(err.to_string().starts_with("document 2: refused"), "{err}");
        // Nodes are counted over the whole text: many small documents are held at once too.
        let doc = format!("[{}]\n", vec!["x"; 60].join(","));
        assert_eq!(refused(&doc), None);
        assert_eq!(
            refused(&format!("{doc}---\n{doc}")),
            Some(Exceeded::Nodes { limit: 100 })
        );
        // An anchor names nothing in a later document (the deserializer refuses such an alias).
        let text = format!("a: &a {}\n---\n[*a, *a]\n", "x".repeat(400));
        assert_eq!(refused(&text), None);
    }
}
