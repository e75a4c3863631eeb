//! Conn 1's byte stream cut into ttrpc messages, and a large request's
//! payload kept where it arrived rather than copied out.

use std::ops::Range;

use protobuf::Message;
use ttrpc::proto::{MESSAGE_HEADER_LENGTH, MESSAGE_LENGTH_MAX};
use ttrpc::MessageHeader;

use super::KEEP_BUFFER;

/// A ttrpc message of conn 1: its header and body.
pub(super) enum Incoming<'a> {
    Message(MessageHeader, &'a [u8]),
    /// A large message that ended the buffer, which is handed over whole
    /// (its body at the range) so its payload need not be copied out.
    Whole(MessageHeader, Vec<u8>, Range<usize>),
    /// Longer than ttrpc allows; its body is skipped, not held.
    Oversized(MessageHeader),
}

/// Cuts the byte stream of conn 1 into ttrpc messages. A message may span
/// frames (Go sends header + 4086 bytes, then the rest), and a frame may
/// hold several messages. Holds at most one message of at most
/// [`MESSAGE_LENGTH_MAX`] plus one frame.
#[derive(Default)]
pub(super) struct MessageReader {
    pub(super) buf: Vec<u8>,
    /// Start of the bytes not yet handed out.
    start: usize,
    /// Bytes of an oversized message still to discard.
    skip: usize,
}

impl MessageReader {
    pub(super) fn push(&mut self, mut bytes: &[u8]) {
        if self.skip > 0 {
            let n = self.skip.min(bytes.len());
            self.skip -= n;
            bytes = &bytes[n..];
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        // A message that spans frames gets its whole size at once: grown
        // by doubling, a node-sized one was copied at each step and held
        // old and new buffers together.
        if let Some(header) = self.buf.get(..MESSAGE_HEADER_LENGTH) {
            let len = MessageHeader::from(header).length as usize;
            let whole = MESSAGE_HEADER_LENGTH + len;
            if len <= MESSAGE_LENGTH_MAX && whole > self.buf.capacity() {
                self.buf.reserve_exact(whole - self.buf.len());
            }
        }
        self.buf.extend_from_slice(bytes);
    }

    pub(super) fn next(&mut self) -> Option<Incoming<'_>> {
        let avail = &self.buf[self.start..];
        if avail.len() < MESSAGE_HEADER_LENGTH {
            return None;
        }
        let header = MessageHeader::from(&avail[..MESSAGE_HEADER_LENGTH]);
        let len = header.length as usize;
        if len > MESSAGE_LENGTH_MAX {
            let held = len.min(avail.len() - MESSAGE_HEADER_LENGTH);
            self.skip = len - held;
            self.start += MESSAGE_HEADER_LENGTH + held;
            return Some(Incoming::Oversized(header));
        }
        if avail.len() < MESSAGE_HEADER_LENGTH + len {
            return None;
        }
        let body = self.start + MESSAGE_HEADER_LENGTH..self.start + MESSAGE_HEADER_LENGTH + len;
        if len > KEEP_BUFFER && body.end == self.buf.len() {
            self.start = 0;
            return Some(Incoming::Whole(header, std::mem::take(&mut self.buf), body));
        }
        self.start = body.end;
        Some(Incoming::Message(header, &self.buf[body]))
    }

    /// Gives back the memory of one large message once it is handled;
    /// true when there was one.
    pub(super) fn shrink(&mut self) -> bool {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEEP_BUFFER {
                self.buf = Vec::new();
                return true;
            }
        }
        false
    }
}

pub(super) enum Body<'a> {
    Borrowed(&'a [u8]),
    Whole(Vec<u8>, Range<usize>),
}

/// A ttrpc request whose payload (a node-sized Synchronize) becomes the
/// raw buffer itself, moved down in place, rather than a copy beside it:
/// the chunk is held once, not twice, while it is decoded. The other
/// fields are parsed by the generated code from what is left around it.
pub(super) fn parse_keeping_payload(
    mut raw: Vec<u8>,
    body: Range<usize>,
) -> protobuf::Result<ttrpc::Request> {
    let Some((field, payload)) = payload_field(&raw[body.clone()])? else {
        return ttrpc::Request::parse_from_bytes(&raw[body]);
    };
    let (field, payload) = (
        body.start + field,
        body.start + payload.start..body.start + payload.end,
    );
    let mut rest = raw[body.start..field].to_vec();
    rest.extend_from_slice(&raw[payload.end..body.end]);
    let mut req = ttrpc::Request::parse_from_bytes(&rest)?;
    raw.truncate(payload.end);
    raw.drain(..payload.start);
    req.payload = raw;
    Ok(req)
}

/// Where a request's only payload field starts and where its bytes are;
/// `None` when there is none or more than one (the generated parser then
/// decides which counts).
fn payload_field(body: &[u8]) -> protobuf::Result<Option<(usize, Range<usize>)>> {
    const PAYLOAD_TAG: u32 = 3 << 3 | 2;
    let mut is = protobuf::CodedInputStream::from_bytes(body);
    let mut found = None;
    let mut count = 0;
    loop {
        let field = pos(&is);
        let Some(tag) = is.read_raw_tag_or_eof()? else {
            break;
        };
        if tag == PAYLOAD_TAG {
            let len = is.read_raw_varint32()?;
            let start = pos(&is);
            is.skip_raw_bytes(len)?;
            found = Some((field, start..pos(&is)));
            count += 1;
        } else {
            protobuf::rt::skip_field_for_tag(tag, &mut is)?;
        }
    }
    Ok(found.filter(|_| count == 1))
}

/// A stream position within a message of at most [`MESSAGE_LENGTH_MAX`].
fn pos(is: &protobuf::CodedInputStream<'_>) -> usize {
    usize::try_from(is.pos()).unwrap_or(usize::MAX)
}
