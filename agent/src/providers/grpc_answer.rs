//! Unary gRPC calls to plugins and Secrets Store CSI providers whose answers are counted before
//! they are decoded. A tenant's plugin answering `map<string, bytes>` with a million entries
//! (under the 16 MiB byte cap) took the agent to 224 MB once prost had built the map; here the
//! entries are counted in the protobuf wire format first ([`count`]) and refused past
//! [`json::MAX_ITEMS`], and the answer's bytes are held twice (the message, and what is built
//! from it) in the node's parse budget ([`json::Budget`]) until the caller drops the [`Counted`]
//! answer, after converting it.

use std::marker::PhantomData;
use std::sync::Arc;

use http::uri::PathAndQuery;
use prost::bytes::Buf;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::transport::Channel;
use tonic::{GrpcMethod, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use super::{MAX_RESPONSE_BYTES, ProviderError};
use crate::json;

/// A decoded answer and its hold on the node's parse budget.
#[derive(Debug)]
pub struct Counted<U> {
    /// The answer.
    pub value: U,
    /// Its share of [`json::Budget::node`]; dropped with this.
    pub held: json::Held<'static>,
}

/// The method a [`unary`] call makes.
pub struct Method {
    /// Full path, e.g. `/latchkey.plugin.v1.SecretStorePlugin/GetSecret`.
    pub path: &'static str,
    /// Service name, e.g. `latchkey.plugin.v1.SecretStorePlugin`.
    pub service: &'static str,
    /// Method name, e.g. `GetSecret`.
    pub method: &'static str,
    /// Fields of the answer holding messages whose own fields are counted too (e.g. the
    /// `secrets` of a list, each with its `data` map).
    pub nested: &'static [u32],
}

/// Calls `method` on `channel` as the generated clients do, with the answer counted before it
/// is decoded and capped at [`MAX_RESPONSE_BYTES`].
pub async fn unary<T, U>(
    channel: Channel,
    method: &Method,
    mut request: tonic::Request<T>,
) -> Result<tonic::Response<Counted<U>>, Status>
where
    T: prost::Message + Send + Sync + 'static,
    U: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
    request
        .extensions_mut()
        .insert(GrpcMethod::new(method.service, method.method));
    let codec = Counting::<T, U> {
        nested: method.nested,
        types: PhantomData,
    };
    grpc.unary(request, PathAndQuery::from_static(method.path), codec)
        .await
}

/// The provider error of a refused answer, if `status` is one (see [`refused`]).
pub fn refusal(status: &Status, what: &str) -> Option<ProviderError> {
    let why = std::error::Error::source(status)?.downcast_ref::<json::Refused>()?;
    Some(ProviderError::TooLarge(format!("{what}'s answer {why}")))
}

/// The status of an answer refused before decoding, with the reason as its source: a status
/// with a source is the client's own, never a plugin's.
fn refused(why: json::Refused) -> Status {
    let mut status = Status::resource_exhausted(format!("the answer {why}"));
    status.set_source(Arc::new(why));
    status
}

/// Counts the fields of a protobuf message (repeated fields and map entries once each), and
/// those of the messages in its `nested` fields; refuses past [`json::MAX_ITEMS`]. Stops
/// quietly at malformed input: prost reports that.
pub fn count(bytes: &[u8], nested: &[u32]) -> Result<usize, json::Refused> {
    let mut items = 0;
    count_into(bytes, nested, &mut items)?;
    Ok(items)
}

fn count_into(mut bytes: &[u8], nested: &[u32], items: &mut usize) -> Result<(), json::Refused> {
    while !bytes.is_empty() {
        let Some(tag) = varint(&mut bytes) else {
            return Ok(());
        };
        let skip = match tag & 7 {
            0 => {
                if varint(&mut bytes).is_none() {
                    return Ok(());
                }
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let Some(len) = varint(&mut bytes).and_then(|l| usize::try_from(l).ok()) else {
                    return Ok(());
                };
                let Some(payload) = bytes.get(..len) else {
                    return Ok(());
                };
                if nested.iter().any(|&field| u64::from(field) == tag >> 3) {
                    count_into(payload, &[], items)?;
                }
                len
            }
            _ => return Ok(()),
        };
        let Some(rest) = bytes.get(skip..) else {
            return Ok(());
        };
        bytes = rest;
        *items += 1;
        if *items > json::MAX_ITEMS {
            return Err(json::Refused::TooManyItems);
        }
    }
    Ok(())
}

/// Reads one base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// prost's codec, with answers counted and held before they are decoded.
struct Counting<T, U> {
    nested: &'static [u32],
    types: PhantomData<(T, U)>,
}

impl<T, U> Codec for Counting<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = Counted<U>;
    type Encoder = ProstEncoder<T>;
    type Decoder = CountingDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CountingDecoder {
            inner: ProstCodec::<T, U>::default().decoder(),
            nested: self.nested,
        }
    }
}

/// Decodes a message once [`count`] and the node's budget let it.
struct CountingDecoder<U> {
    inner: ProstDecoder<U>,
    nested: &'static [u32],
}

impl<U: prost::Message + Default + Send + 'static> Decoder for CountingDecoder<U> {
    type Item = Counted<U>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        // tonic hands over one whole message, contiguous in its buffer.
        let message = src.chunk();
        let len = src.remaining();
        if message.len() == len {
            count(message, self.nested).map_err(refused)?;
        }
        let held = json::Budget::node()
            .hold(len.saturating_mul(2))
            .map_err(refused)?;
        Ok(self.inner.decode(src)?.map(|value| Counted { value, held }))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(field: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3 | 2) as u8];
        let mut len = payload.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn map_entries_are_counted_on_the_wire_and_refused_past_the_limit() {
        // map<string, bytes> data = 1: one length-delimited entry per key.
        let one = entry(1, &[entry(1, b"k").as_slice(), &entry(2, b"v")].concat());
        let answer = |n: usize| one.repeat(n);
        assert_eq!(count(&answer(3), &[]), Ok(3));
        assert_eq!(count(&answer(json::MAX_ITEMS), &[]), Ok(json::MAX_ITEMS));
        assert_eq!(
            count(&answer(1_000_000), &[]),
            Err(json::Refused::TooManyItems)
        );
        // A list: each secret's own entries count too.
        let secret = entry(1, &[entry(1, b"name"), one.repeat(6_000)].concat());
        assert_eq!(count(&secret.repeat(1), &[1]), Ok(1 + 1 + 6_000));
        assert_eq!(
            count(&secret.repeat(2), &[1]),
            Err(json::Refused::TooManyItems)
        );
        // Varints and fixed fields count once; malformed input stops the count.
        assert_eq!(count(&[0x08, 0x96, 0x01, 0x15, 1, 2, 3, 4], &[]), Ok(2));
        assert_eq!(count(&[0x0a, 0x10, 1], &[]), Ok(0));
    }

    #[test]
    fn a_refusal_is_recognised_only_from_its_source() {
        let status = refused(json::Refused::TooManyItems);
        let error = refusal(&status, "plugin unix:///p.sock").unwrap();
        assert!(
            error
                .to_string()
                .contains("plugin unix:///p.sock's answer holds more than 10000"),
            "{error}"
        );
        // The same words from a plugin are a plugin's status, not the agent's refusal.
        let forged = Status::resource_exhausted(status.message());
        assert!(refusal(&forged, "plugin").is_none());
    }
}
