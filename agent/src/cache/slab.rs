//! Where the cache's keys and values are kept: a few large buffers the cache owns, each entry's
//! bytes packed after the previous entry's.
//!
//! Why: a mount storm's new entries are stored while 500 publishes' request memory fills the
//! heap. Allocated one by one, each key and each value landed on a page of its own among that
//! garbage, and kept the page resident after the storm: ~0.1 MiB for every storm of new service
//! accounts, for 2 KB of data (docs/benchmarks.md, "Storms in a row"). Packed here, a storm's
//! entries share a page or two of a chunk made before it.
//!
//! - An entry's bytes are zeroized as soon as it is freed; a chunk is zeroized when released.
//! - A chunk never grows past the capacity it was made with (growing would move its bytes and
//!   leave the old copy behind, unzeroized).
//! - A chunk is released when its last entry is freed, except the chunk being filled, which is
//!   rewound and reused. Entries left scattered over mostly dead chunks are moved by the owner
//!   when [`Slab::is_sparse`] says so.
//! - No `Debug`: the chunks hold secret values.

use zeroize::{Zeroize, Zeroizing};

/// Capacity of a shared chunk: four pages, room for about 90 entries of a typical key (~110 B)
/// and value.
const CHUNK: usize = 16 * 1024;

/// Entries larger than this get a chunk of their own, released with them, so that one big value
/// does not pin a shared chunk or leave a large hole in it.
const OWN_CHUNK_ABOVE: usize = CHUNK / 4;

/// Where one entry's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    chunk: usize,
    start: usize,
    len: usize,
}

/// One buffer of packed entries.
struct Chunk {
    /// Filled up to its length, never past its capacity; empty with no capacity once released.
    bytes: Zeroizing<Vec<u8>>,
    /// Bytes of the entries still in it.
    live: usize,
}

/// Packed storage of byte strings, zeroized when freed.
#[derive(Default)]
pub(super) struct Slab {
    /// By chunk number, as in [`Span`]; released chunks stay as empty slots, reused first.
    chunks: Vec<Chunk>,
    /// Numbers of released chunks.
    released: Vec<usize>,
    /// The shared chunk new small entries are appended to.
    filling: Option<usize>,
    /// Bytes of live entries in all chunks.
    live: usize,
    /// Capacity of all chunks held.
    held: usize,
}

impl Slab {
    /// Stores `parts` one after the other as one entry.
    pub(super) fn put(&mut self, parts: &[&[u8]]) -> Span {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        let number = if len > OWN_CHUNK_ABOVE {
            self.new_chunk(len)
        } else {
            match self.filling.filter(|&n| self.room(n) >= len) {
                Some(number) => number,
                None => {
                    let number = self.new_chunk(CHUNK);
                    self.filling = Some(number);
                    number
                }
            }
        };
        let chunk = &mut self.chunks[number];
        let start = chunk.bytes.len();
        // Within capacity: the chunk was picked or made with room for `len` more bytes.
        for part in parts {
            chunk.bytes.extend_from_slice(part);
        }
        chunk.live += len;
        self.live += len;
        Span {
            chunk: number,
            start,
            len,
        }
    }

    /// The bytes stored at `span`.
    pub(super) fn get(&self, span: Span) -> &[u8] {
        &self.chunks[span.chunk].bytes[span.start..span.start + span.len]
    }

    /// Zeroizes the entry at `span`; its chunk is released (or rewound, if being filled) once
    /// nothing in it is live.
    pub(super) fn free(&mut self, span: Span) {
        let chunk = &mut self.chunks[span.chunk];
        chunk.bytes[span.start..span.start + span.len].zeroize();
        chunk.live -= span.len;
        self.live -= span.len;
        if chunk.live > 0 {
            return;
        }
        if self.filling == Some(span.chunk) {
            // Every byte written to it was zeroized when its entry was freed.
            chunk.bytes.clear();
            return;
        }
        self.held -= chunk.bytes.capacity();
        // Dropping the old buffer zeroizes it.
        chunk.bytes = Zeroizing::new(Vec::new());
        self.released.push(span.chunk);
    }

    /// True when the chunks hold more than twice the live bytes (and more than a few chunks'
    /// worth): the owner should then move its entries to a fresh slab.
    pub(super) fn is_sparse(&self) -> bool {
        self.held > 2 * self.live + 2 * CHUNK
    }

    /// Bytes of the live entries.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Capacity of all chunks held, in bytes.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Chunks held.
    #[cfg(test)]
    pub(super) fn chunks_held(&self) -> usize {
        self.chunks.len() - self.released.len()
    }

    /// Room left in chunk `number`.
    fn room(&self, number: usize) -> usize {
        let bytes = &self.chunks[number].bytes;
        bytes.capacity() - bytes.len()
    }

    /// Makes an empty chunk with room for `capacity` bytes; returns its number.
    fn new_chunk(&mut self, capacity: usize) -> usize {
        let chunk = Chunk {
            bytes: Zeroizing::new(Vec::with_capacity(capacity)),
            live: 0,
        };
        self.held += chunk.bytes.capacity();
        match self.released.pop() {
            Some(number) => {
                self.chunks[number] = chunk;
                number
            }
            None => {
                self.chunks.push(chunk);
                self.chunks.len() - 1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_entries_share_a_chunk_and_keep_their_bytes() {
        let mut slab = Slab::default();
        let spans: Vec<Span> = (0..80u8)
            .map(|i| slab.put(&[b"key-", &[i], &[i; 150]]))
            .collect();
        assert_eq!(slab.chunks_held(), 1);
        for (i, span) in (0..80u8).zip(&spans) {
            let bytes = slab.get(*span);
            assert_eq!(&bytes[..5], [b'k', b'e', b'y', b'-', i]);
            assert!(bytes[5..].iter().all(|&b| b == i));
            assert_eq!(span.len, 155);
        }
        // The 106th entry of 155 bytes no longer fits in 16 KiB: a second chunk.
        for i in 80..110u8 {
            slab.put(&[&[i; 155]]);
        }
        assert_eq!(slab.chunks_held(), 2);
    }

    #[test]
    fn freed_bytes_are_zeroized_and_an_emptied_chunk_released() {
        let mut slab = Slab::default();
        let a = slab.put(&[b"alpha-secret"]);
        let b = slab.put(&[b"bravo-secret"]);
        slab.free(a);
        let chunk = &slab.chunks[a.chunk].bytes;
        assert!(chunk[a.start..a.start + a.len].iter().all(|&b| b == 0));
        assert_eq!(slab.get(b), b"bravo-secret");

        // A big value has its own chunk, released (not kept) once freed.
        let big = slab.put(&[&[9; 5000]]);
        assert_ne!(big.chunk, b.chunk);
        assert_eq!(slab.chunks_held(), 2);
        slab.free(big);
        assert_eq!(slab.chunks_held(), 1);
        assert!(slab.chunks[big.chunk].bytes.capacity() == 0);

        // The chunk being filled is rewound when emptied, and reused.
        slab.free(b);
        assert_eq!((slab.chunks_held(), slab.held()), (1, CHUNK));
        let c = slab.put(&[b"charlie"]);
        assert_eq!((c.chunk, c.start), (b.chunk, 0));
        // The released slot is taken by the next chunk made.
        assert_eq!(slab.put(&[&[1; 4097]]).chunk, big.chunk);
    }

    #[test]
    fn many_nearly_empty_chunks_are_sparse() {
        let mut slab = Slab::default();
        let spans: Vec<Span> = (0..500).map(|_| slab.put(&[&[5; 150]])).collect();
        assert!(!slab.is_sparse());
        // Keep one entry in every ten: 50 entries over five chunks.
        for (i, span) in spans.into_iter().enumerate() {
            if i % 10 != 0 {
                slab.free(span);
            }
        }
        assert!(
            slab.is_sparse(),
            "{} held for {} live",
            slab.held,
            slab.live
        );
    }
}
