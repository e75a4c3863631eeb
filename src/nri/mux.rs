//! The NRI connection multiplexer, with the Plugin service served right on
//! the thread that reads the socket.
//!
//! One unix stream (the "trunk") carries several logical connections as
//! frames `[u32 BE conn id][u32 BE payload length][payload]`. NRI uses conn 1
//! for the Plugin service (the runtime calls us) and conn 2 for the Runtime
//! service (we call the runtime). There is no open/close signalling: a frame
//! for a connection nobody opened is dropped, and EOF on the trunk ends all.
//!
//! The hot path is conn 1. The trunk is a blocking socket read by one
//! dedicated thread ("nri-trunk"), which decodes conn 1's ttrpc messages
//! and answers each request before it reads the next frame: a read(2) and
//! a write(2) per request, no event loop, no task hop, no pipe. That is
//! also the bound on a peer that never reads our answers: one request in
//! flight, and when the socket's send buffer is full the thread blocks in
//! write and stops reading (back-pressure), so memory stays at the buffers
//! below whatever the peer sends. The handlers are the generated ttrpc
//! method handlers of the Plugin service, run to completion from the thread
//! on the runtime's handle; only the server loop is ours
//! (docs/dependencies.md says why; docs/benchmarks.md measures it).
//!
//! Conn 2 (RegisterPlugin, rarely anything else) goes to the ttrpc client
//! through an in-memory pipe of [`RUNTIME_PIPE_CAPACITY`]; its outgoing
//! frames are written from the event loop without blocking it, whole
//! frames under one lock with the thread's answers.
//!
//! Outgoing frames carry at most [`MAX_OUTGOING_PAYLOAD`] bytes: the Go side
//! reads headers through a 4096-byte bufio buffer and fails with ENOMEM on a
//! larger frame, so small frames are always readable by every runtime.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::Arc;

use protobuf::Message;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::net::UnixStream;
use tokio::runtime::Handle;
use tracing::{debug, trace, warn};
use ttrpc::proto::MESSAGE_TYPE_REQUEST;
use ttrpc::proto::{MESSAGE_HEADER_LENGTH, MESSAGE_LENGTH_MAX, MESSAGE_TYPE_DATA};
use ttrpc::r#async::{Service, TtrpcContext};
use ttrpc::{Code, MessageHeader};

mod reader;
mod trunk;
use reader::{parse_keeping_payload, Body, Incoming, MessageReader};
use trunk::{CloseOnDrop, Trunk};

/// Logical connection on which the plugin serves `nri.pkg.api.v1alpha1.Plugin`.
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Logical connection on which the plugin calls `nri.pkg.api.v1alpha1.Runtime`.
pub const RUNTIME_SERVICE_CONN: u32 = 2;

/// Largest frame payload we send; Go reads through a 4096-byte bufio buffer.
pub const MAX_OUTGOING_PAYLOAD: usize = 4096;
// A frame header carries the payload length as a u32.
const _: () = assert!(MAX_OUTGOING_PAYLOAD <= u32::MAX as usize);
/// Largest frame payload we accept: a whole ttrpc message (10-byte header plus
/// 4 MiB body), which is the most any runtime puts in one frame.
pub const MAX_INCOMING_PAYLOAD: usize = MESSAGE_HEADER_LENGTH + MESSAGE_LENGTH_MAX;
/// Buffer between the trunk and the ttrpc client of conn 2, per direction.
pub const RUNTIME_PIPE_CAPACITY: usize = 64 * 1024;
/// Read buffer on the trunk: a CreateContainer request and its frame
/// headers fit, so one read usually brings one whole request.
const READ_BUFFER: usize = 16 * 1024;
/// Buffers that grew past this for one large message are given back.
const KEEP_BUFFER: usize = 64 * 1024;
/// The Plugin method whose memory is given back after every answer.
const SYNCHRONIZE: &str = "Synchronize";

const HEADER_LEN: usize = 8;

/// The services a plugin serves on conn 1, as ttrpc-codegen builds them.
pub type Services = HashMap<String, Service>;

/// Why a multiplexed session ended.
#[derive(Debug, Error)]
pub enum MuxError {
    #[error("runtime closed the connection")]
    Closed,
    #[error("frame for conn {conn} announces {len} bytes, more than the {max}-byte limit")]
    Oversized { conn: u32, len: usize, max: usize },
    #[error("trunk i/o failed while {context}")]
    Io {
        context: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("local end of conn {0} was closed")]
    LocalClosed(u32),
}

/// Serves `services` on conn 1 of `trunk` and returns conn 2 (hand it to
/// the ttrpc client of the Runtime service) and the driver future. The
/// session is over when the driver returns (trunk EOF, malformed frame, or
/// conn 2 closed locally); dropping the driver closes the trunk and conn 2
/// and ends the trunk thread.
pub fn serve(
    trunk: UnixStream,
    services: Services,
) -> (
    DuplexStream,
    impl std::future::Future<Output = MuxError> + Send + 'static,
) {
    let (runtime_local, runtime_remote) = tokio::io::duplex(RUNTIME_PIPE_CAPACITY);
    (runtime_local, drive(trunk, services, runtime_remote))
}

async fn drive(trunk: UnixStream, services: Services, runtime_conn: DuplexStream) -> MuxError {
    let trunk = match Trunk::blocking(trunk) {
        Ok(trunk) => Arc::new(trunk),
        Err(source) => {
            return MuxError::Io {
                context: "making the trunk blocking",
                source,
            }
        }
    };
    let close = CloseOnDrop(trunk.clone());
    let (pipe_rd, pipe_wr) = tokio::io::split(runtime_conn);
    let (done, mut ended) = tokio::sync::oneshot::channel();
    let (reader, runtime) = (trunk.clone(), Handle::current());
    let spawned = std::thread::Builder::new()
        .name("nri-trunk".into())
        .spawn(move || {
            let _ = done.send(pump_incoming(&reader, pipe_wr, &services, &runtime));
        });
    if let Err(source) = spawned {
        return MuxError::Io {
            context: "starting the trunk thread",
            source,
        };
    }
    // Frames in (and conn 1 answered) on the thread, conn 2 out here;
    // whichever ends first ends the session.
    let reason = tokio::select! {
        // A thread that panicked drops its sender: the session is over.
        r = &mut ended => r.unwrap_or(MuxError::Closed),
        r = pump_outgoing(RUNTIME_SERVICE_CONN, pipe_rd, trunk) => {
            // The thread may be in a handler: wait for it, so no handler
            // of this session runs into the next one.
            drop(close);
            let _ = ended.await;
            r
        }
    };
    debug!(%reason, "nri multiplexer stopping");
    reason
}

/// Copies bytes the ttrpc client wrote on one conn to the trunk, as frames
/// of at most [`MAX_OUTGOING_PAYLOAD`] bytes, one write per frame.
async fn pump_outgoing(conn: u32, mut pipe: ReadHalf<DuplexStream>, trunk: Arc<Trunk>) -> MuxError {
    let mut frame = vec![0u8; HEADER_LEN + MAX_OUTGOING_PAYLOAD];
    frame[..4].copy_from_slice(&conn.to_be_bytes());
    loop {
        let n = match pipe.read(&mut frame[HEADER_LEN..]).await {
            Ok(0) => return MuxError::LocalClosed(conn),
            Ok(n) => n,
            Err(source) => {
                return MuxError::Io {
                    context: "reading a local conn",
                    source,
                }
            }
        };
        frame[4..HEADER_LEN].copy_from_slice(&frame_len(n).to_be_bytes());
        let sent;
        (frame, sent) = trunk.write_from_event_loop(frame, HEADER_LEN + n).await;
        if let Err(source) = sent {
            return MuxError::Io {
                context: "writing a frame",
                source,
            };
        }
        trace!(conn, len = n, "frame sent");
    }
}

/// The trunk thread: reads frames; conn 1 is decoded and answered here,
/// conn 2 goes to the ttrpc client's pipe, anything else is dropped. The
/// async handlers run on `runtime`'s handle; they await nothing that needs
/// its I/O driver (the Plugin hooks compute and return).
fn pump_incoming(
    trunk: &Trunk,
    mut runtime_pipe: WriteHalf<DuplexStream>,
    services: &Services,
    runtime: &Handle,
) -> MuxError {
    let mut rd = io::BufReader::with_capacity(READ_BUFFER, &trunk.socket);
    let mut payload = Vec::new();
    let mut requests = MessageReader::default();
    let mut answers = Answers::default();
    loop {
        let conn = match read_frame(&mut rd, &mut payload) {
            Ok(conn) => conn,
            Err(e) => return e,
        };
        match conn {
            PLUGIN_SERVICE_CONN => {
                requests.push(&payload);
                let mut freed = false;
                while let Some(msg) = requests.next() {
                    // A large message that ended the buffer leaves with it
                    // (its payload becomes the request's); any other large
                    // one's raw bytes go back here, before its handler runs.
                    freed |= matches!(msg, Incoming::Whole(..));
                    let msg = parse(msg);
                    freed |= requests.shrink();
                    // A Synchronize chunk of any size (the last one is
                    // small) leaves what deciding it took.
                    freed |= matches!(&msg, Parsed::Request(_, req) if req.method == SYNCHRONIZE);
                    runtime.block_on(answer(services, msg, &mut answers));
                    // A frame may hold many small requests: write as we go
                    // rather than collect an unbounded batch of answers.
                    if answers.bytes.len() >= KEEP_BUFFER {
                        if let Err(e) = answers.write_to(trunk) {
                            return e;
                        }
                    }
                }
                if let Err(e) = answers.write_to(trunk) {
                    return e;
                }
                if requests.shrink() || freed {
                    release_freed_memory();
                }
            }
            RUNTIME_SERVICE_CONN => {
                // Blocks (and so stops reading the trunk) while the client is
                // behind: back-pressure instead of unbounded buffering.
                if runtime.block_on(runtime_pipe.write_all(&payload)).is_err() {
                    return MuxError::LocalClosed(conn);
                }
            }
            _ => debug!(
                conn,
                len = payload.len(),
                "dropping frame for a connection nobody opened"
            ),
        }
        if payload.capacity() > KEEP_BUFFER {
            payload = Vec::new();
        }
    }
}

/// Reads one frame into `payload`; returns its conn id.
fn read_frame(trunk: &mut impl Read, payload: &mut Vec<u8>) -> Result<u32, MuxError> {
    let mut header = [0u8; HEADER_LEN];
    match trunk.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(MuxError::Closed),
        Err(source) => {
            return Err(MuxError::Io {
                context: "reading a frame header",
                source,
            })
        }
    }
    let (conn, len) = parse_header(&header);
    if len > MAX_INCOMING_PAYLOAD {
        return Err(MuxError::Oversized {
            conn,
            len,
            max: MAX_INCOMING_PAYLOAD,
        });
    }
    payload.resize(len, 0);
    match trunk.read_exact(payload) {
        Ok(()) => Ok(conn),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(MuxError::Closed),
        Err(source) => Err(MuxError::Io {
            context: "reading a frame payload",
            source,
        }),
    }
}

fn parse_header(h: &[u8; HEADER_LEN]) -> (u32, usize) {
    let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    (conn, len as usize)
}

/// The header's length field for an outgoing payload, which is at most
/// [`MAX_OUTGOING_PAYLOAD`] and so always fits (asserted above).
fn frame_len(payload: usize) -> u32 {
    u32::try_from(payload).unwrap_or(u32::MAX)
}

/// Answers ready to go out on conn 1, already cut into frames; reused.
#[derive(Default)]
struct Answers {
    bytes: Vec<u8>,
    encoded: Vec<u8>,
}

impl Answers {
    /// Appends `resp` for `stream_id` as frames of at most
    /// [`MAX_OUTGOING_PAYLOAD`]: the ttrpc header and body as one stream,
    /// the way Go sends header + first 4086 bytes, then the rest.
    fn push(&mut self, stream_id: u32, resp: &ttrpc::Response) {
        self.encoded.clear();
        self.encoded.resize(MESSAGE_HEADER_LENGTH, 0);
        if let Err(e) = resp.write_to_vec(&mut self.encoded) {
            warn!(error = %e, "cannot encode a ttrpc response");
            return;
        }
        let body_len = self.encoded.len() - MESSAGE_HEADER_LENGTH;
        let wire_len = u32::try_from(body_len).ok();
        let Some(wire_len) = wire_len.filter(|_| body_len <= MESSAGE_LENGTH_MAX) else {
            let status = ttrpc::get_status(
                Code::RESOURCE_EXHAUSTED,
                format!("response of {body_len} bytes exceeds the ttrpc limit"),
            );
            return self.push(stream_id, &status_response(status));
        };
        let header: Vec<u8> = MessageHeader::new_response(stream_id, wire_len).into();
        self.encoded[..MESSAGE_HEADER_LENGTH].copy_from_slice(&header);
        for chunk in self.encoded.chunks(MAX_OUTGOING_PAYLOAD) {
            self.bytes
                .extend_from_slice(&PLUGIN_SERVICE_CONN.to_be_bytes());
            self.bytes
                .extend_from_slice(&frame_len(chunk.len()).to_be_bytes());
            self.bytes.extend_from_slice(chunk);
        }
        if self.encoded.capacity() > KEEP_BUFFER {
            self.encoded = Vec::new();
        }
    }

    /// One write for everything collected. When the peer does not read,
    /// this waits, and so does the reading of further requests.
    fn write_to(&mut self, out: &Trunk) -> Result<(), MuxError> {
        if self.bytes.is_empty() {
            return Ok(());
        }
        let r = out.write_all(&self.bytes);
        self.bytes.clear();
        if self.bytes.capacity() > KEEP_BUFFER {
            self.bytes = Vec::new();
        }
        r.map_err(|source| MuxError::Io {
            context: "writing an answer",
            source,
        })
    }
}

/// A large message or a Synchronize chunk (deciding a node-sized
/// Synchronize) leaves megabytes that are garbage once it is answered;
/// glibc keeps such freed memory mapped unless asked to give it back.
/// Asked here, after the answer is written and every copy of the message
/// (ours, the decoded request, the response) is gone, not in the handler,
/// where they were all still held.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn status_response(status: ttrpc::Status) -> ttrpc::Response {
    ttrpc::Response {
        status: protobuf::MessageField::some(status),
        ..Default::default()
    }
}

/// A conn-1 message, owned: its raw bytes can be freed before its method runs.
enum Parsed {
    /// A request for a method, with the message header it came with.
    Request(MessageHeader, ttrpc::Request),
    /// Answered with this status, no method called.
    Refused(u32, ttrpc::Status),
    Ignored,
}

/// Sorts one message of conn 1 the way ttrpc's server does: requests on odd
/// stream ids go to their method; everything else gets an error status.
fn parse(msg: Incoming<'_>) -> Parsed {
    let (header, body) = match msg {
        Incoming::Message(h, body) => (h, Body::Borrowed(body)),
        Incoming::Whole(h, raw, range) => (h, Body::Whole(raw, range)),
        Incoming::Oversized(h) => {
            let status = ttrpc::get_status(
                Code::INVALID_ARGUMENT,
                format!(
                    "message length {} exceeds the maximum of {MESSAGE_LENGTH_MAX}",
                    h.length
                ),
            );
            return Parsed::Refused(h.stream_id, status);
        }
    };
    let stream_id = header.stream_id;
    if stream_id % 2 != 1 {
        let status = ttrpc::get_status(Code::INVALID_ARGUMENT, "stream id must be odd");
        return Parsed::Refused(stream_id, status);
    }
    match header.type_ {
        MESSAGE_TYPE_REQUEST => {}
        MESSAGE_TYPE_DATA => {
            let status = ttrpc::get_status(Code::INVALID_ARGUMENT, "no streaming methods here");
            return Parsed::Refused(stream_id, status);
        }
        other => {
            debug!(
                stream_id,
                r#type = other,
                "ignoring a ttrpc message of unknown type"
            );
            return Parsed::Ignored;
        }
    }
    let parsed = match body {
        Body::Borrowed(body) => ttrpc::Request::parse_from_bytes(body),
        Body::Whole(raw, range) => parse_keeping_payload(raw, range),
    };
    match parsed {
        Ok(req) => Parsed::Request(header, req),
        Err(e) => Parsed::Refused(
            stream_id,
            ttrpc::get_status(Code::INVALID_ARGUMENT, e.to_string()),
        ),
    }
}

/// Answers one parsed message of conn 1 into `out`.
async fn answer(services: &Services, msg: Parsed, out: &mut Answers) {
    match msg {
        Parsed::Request(header, req) => {
            let stream_id = header.stream_id;
            let resp = call(services, header, req).await;
            out.push(stream_id, &resp.unwrap_or_else(status_response));
        }
        Parsed::Refused(stream_id, status) => out.push(stream_id, &status_response(status)),
        Parsed::Ignored => {}
    }
}

async fn call(
    services: &Services,
    header: MessageHeader,
    req: ttrpc::Request,
) -> Result<ttrpc::Response, ttrpc::Status> {
    trace!(service = %req.service, method = %req.method, "request");
    let service = services.get(&req.service).ok_or_else(|| {
        ttrpc::get_status(
            Code::INVALID_ARGUMENT,
            format!("{} service does not exist", req.service),
        )
    })?;
    let method = service
        .methods
        .get(&req.method)
        .ok_or_else(|| ttrpc::get_status(Code::UNIMPLEMENTED, format!("{} method", req.method)))?;
    let ctx = TtrpcContext {
        mh: header,
        metadata: ttrpc::context::from_pb(&req.metadata),
        timeout_nano: req.timeout_nano,
        ..Default::default()
    };
    // The Plugin handlers never wait on anything: they run to completion
    // right here, so a timeout around them would never fire.
    method.handler(ctx, req).await.map_err(|e| {
        warn!(error = ?e, "ttrpc method failed");
        ttrpc::get_status(Code::UNKNOWN, format!("{e:?}"))
    })
}

#[cfg(test)]
// Tests cast small, known values; the cast lints guard the product code.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use ttrpc::proto::MESSAGE_TYPE_RESPONSE;

    fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = conn.to_be_bytes().to_vec();
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// The runtime's side of `read_frame`.
    async fn read_frame_from(theirs: &mut UnixStream, payload: &mut Vec<u8>) -> u32 {
        let mut h = [0u8; HEADER_LEN];
        theirs.read_exact(&mut h).await.unwrap();
        let (conn, len) = parse_header(&h);
        payload.resize(len, 0);
        theirs.read_exact(payload).await.unwrap();
        conn
    }

    fn ttrpc_request(stream_id: u32, method: &str) -> Vec<u8> {
        let req = ttrpc::Request {
            service: "svc".into(),
            method: method.into(),
            ..Default::default()
        };
        let body = req.write_to_bytes().unwrap();
        let mut m: Vec<u8> = MessageHeader::new_request(stream_id, body.len() as u32).into();
        m.extend_from_slice(&body);
        m
    }

    #[test]
    fn messages_are_cut_across_and_within_frames() {
        let mut r = MessageReader::default();
        let a = ttrpc_request(1, "a");
        let b = ttrpc_request(3, "b");
        let mut both = a.clone();
        both.extend_from_slice(&b);
        // Byte by byte: nothing until a whole message is there.
        let mut seen = Vec::new();
        for byte in &both {
            r.push(std::slice::from_ref(byte));
            while let Some(Incoming::Message(h, body)) = r.next() {
                let req = ttrpc::Request::parse_from_bytes(body).unwrap();
                seen.push((h.stream_id, req.method));
            }
            r.shrink();
        }
        assert_eq!(seen, [(1, "a".to_string()), (3, "b".to_string())]);
        // Both in one push.
        r.push(&both);
        assert!(matches!(r.next(), Some(Incoming::Message(h, _)) if h.stream_id == 1));
        assert!(matches!(r.next(), Some(Incoming::Message(h, _)) if h.stream_id == 3));
        assert!(r.next().is_none());
    }

    #[test]
    fn a_large_request_is_parsed_and_its_raw_bytes_freed_before_its_method_runs() {
        let mut r = MessageReader::default();
        let req = ttrpc::Request {
            service: "svc".into(),
            method: "Synchronize".into(),
            payload: vec![7u8; 2 * KEEP_BUFFER],
            ..Default::default()
        };
        let body = req.write_to_bytes().unwrap();
        let mut m: Vec<u8> = MessageHeader::new_request(1, body.len() as u32).into();
        m.extend_from_slice(&body);
        for frame in m.chunks(MAX_OUTGOING_PAYLOAD) {
            r.push(frame);
        }
        let parsed = parse(r.next().unwrap());
        assert_eq!(r.buf.capacity(), 0, "the raw message is handed over");
        assert!(matches!(parsed, Parsed::Request(h, got) if h.stream_id == 1 && got == req));
    }

    #[test]
    fn a_payload_kept_in_place_gives_what_the_generated_parser_gives() {
        let req = ttrpc::Request {
            service: "svc".into(),
            method: "Synchronize".into(),
            payload: (0..3 * KEEP_BUFFER).map(|i| i as u8).collect(),
            timeout_nano: 2_000_000_000,
            metadata: vec![ttrpc::proto::KeyValue {
                key: "k".into(),
                value: "v".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let body = req.write_to_bytes().unwrap();
        // Twice the payload: the later one counts, as generated.
        let mut twice = body.clone();
        twice.extend(
            ttrpc::Request {
                payload: vec![1, 2, 3],
                ..Default::default()
            }
            .write_to_bytes()
            .unwrap(),
        );
        for body in [body, twice, vec![0xff, 0xff]] {
            let mut raw = vec![9u8; 10];
            raw.extend_from_slice(&body);
            let range = 10..raw.len();
            let want = ttrpc::Request::parse_from_bytes(&body);
            match (parse_keeping_payload(raw, range), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want),
                (Err(_), Err(_)) => {}
                (got, want) => panic!("{got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn an_oversized_message_is_skipped_not_held() {
        let mut r = MessageReader::default();
        let len = MESSAGE_LENGTH_MAX as u32 + 1;
        let mut m: Vec<u8> = MessageHeader::new_request(5, len).into();
        m.extend_from_slice(&[0u8; 100]);
        r.push(&m);
        assert!(matches!(r.next(), Some(Incoming::Oversized(h)) if h.stream_id == 5));
        r.shrink();
        // The rest of its body arrives and is discarded as it comes.
        let rest = vec![0u8; len as usize - 100];
        for chunk in rest.chunks(1 << 20) {
            r.push(chunk);
            assert!(r.next().is_none());
            r.shrink();
            assert!(r.buf.capacity() <= KEEP_BUFFER.max(1 << 20));
        }
        r.push(&ttrpc_request(7, "after"));
        assert!(matches!(r.next(), Some(Incoming::Message(h, _)) if h.stream_id == 7));
    }

    #[test]
    fn answers_are_cut_into_go_readable_frames() {
        let mut a = Answers::default();
        let resp = ttrpc::Response {
            payload: vec![7u8; 20_000],
            ..Default::default()
        };
        a.push(9, &resp);
        let mut stream = Vec::new();
        let mut rest = &a.bytes[..];
        while !rest.is_empty() {
            let (conn, len) = parse_header(rest[..HEADER_LEN].try_into().unwrap());
            assert_eq!(conn, PLUGIN_SERVICE_CONN);
            assert!(len <= MAX_OUTGOING_PAYLOAD, "{len}");
            stream.extend_from_slice(&rest[HEADER_LEN..HEADER_LEN + len]);
            rest = &rest[HEADER_LEN + len..];
        }
        let h = MessageHeader::from(&stream[..MESSAGE_HEADER_LENGTH]);
        assert_eq!((h.stream_id, h.type_), (9, MESSAGE_TYPE_RESPONSE));
        let got = ttrpc::Response::parse_from_bytes(&stream[MESSAGE_HEADER_LENGTH..]).unwrap();
        assert_eq!(got.payload, resp.payload);
    }

    #[tokio::test]
    async fn conn_2_is_carried_and_unknown_conns_are_dropped() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (mut runtime_conn, driver) = serve(ours, Services::new());
        let driver = tokio::spawn(driver);
        theirs.write_all(&frame(7, b"nobody")).await.unwrap();
        theirs.write_all(&frame(2, b"to-runtime")).await.unwrap();
        let mut buf = [0u8; 10];
        runtime_conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"to-runtime");
        // Large writes on conn 2 leave as small frames.
        let big: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        runtime_conn.write_all(&big).await.unwrap();
        let mut got = Vec::new();
        while got.len() < big.len() {
            let mut p = Vec::new();
            let conn = read_frame_from(&mut theirs, &mut p).await;
            assert_eq!(conn, RUNTIME_SERVICE_CONN);
            assert!(!p.is_empty() && p.len() <= MAX_OUTGOING_PAYLOAD);
            got.extend(p);
        }
        assert_eq!(got, big);
        drop(theirs);
        assert!(matches!(driver.await.unwrap(), MuxError::Closed));
    }

    #[tokio::test]
    async fn requests_on_conn_1_get_answers_and_errors_get_a_status() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (_runtime_conn, driver) = serve(ours, Services::new());
        tokio::spawn(driver);
        // Unknown service; then an even stream id; then garbage protobuf.
        let mut garbage: Vec<u8> = MessageHeader::new_request(5, 3).into();
        garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
        for (m, stream, code) in [
            (ttrpc_request(1, "x"), 1, Code::INVALID_ARGUMENT),
            (ttrpc_request(2, "x"), 2, Code::INVALID_ARGUMENT),
            (garbage, 5, Code::INVALID_ARGUMENT),
        ] {
            theirs.write_all(&frame(1, &m)).await.unwrap();
            let mut p = Vec::new();
            assert_eq!(read_frame_from(&mut theirs, &mut p).await, 1);
            let h = MessageHeader::from(&p[..MESSAGE_HEADER_LENGTH]);
            assert_eq!(h.stream_id, stream);
            let r = ttrpc::Response::parse_from_bytes(&p[MESSAGE_HEADER_LENGTH..]).unwrap();
            assert_eq!(r.status.code(), code);
        }
    }

    #[tokio::test]
    async fn oversized_frame_ends_the_session() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (_conn, driver) = serve(ours, Services::new());
        let driver = tokio::spawn(driver);
        let mut h = 1u32.to_be_bytes().to_vec();
        h.extend_from_slice(&u32::MAX.to_be_bytes());
        theirs.write_all(&h).await.unwrap();
        let reason = driver.await.unwrap();
        assert!(
            matches!(reason, MuxError::Oversized { conn: 1, .. }),
            "{reason}"
        );
        // The trunk is closed for the runtime as well.
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
    }

    #[tokio::test]
    async fn truncated_frame_is_a_clean_close() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (mut conn, driver) = serve(ours, Services::new());
        let driver = tokio::spawn(driver);
        let f = frame(2, b"only part of this arrives");
        theirs.write_all(&f[..12]).await.unwrap();
        drop(theirs);
        assert!(matches!(driver.await.unwrap(), MuxError::Closed));
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn dropping_the_driver_closes_the_trunk_and_ends_its_thread() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (mut conn, driver) = serve(ours, Services::new());
        let driver = tokio::spawn(driver);
        // The thread is up and blocked in read: a request gets its answer.
        theirs
            .write_all(&frame(1, &ttrpc_request(1, "x")))
            .await
            .unwrap();
        assert_eq!(read_frame_from(&mut theirs, &mut Vec::new()).await, 1);
        driver.abort();
        // The runtime sees EOF, and the thread's end closes conn 2.
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        conn.read_to_end(&mut rest).await.unwrap();
    }

    #[tokio::test]
    async fn closing_conn_2_ends_the_session_once_the_thread_is_done() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (conn, driver) = serve(ours, Services::new());
        let driver = tokio::spawn(driver);
        drop(conn);
        assert!(matches!(driver.await.unwrap(), MuxError::LocalClosed(2)));
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_peer_that_does_not_read_conn_2_stalls_neither_the_event_loop_nor_framing() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (mut conn, driver) = serve(ours, Services::new());
        tokio::spawn(driver);
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let want = big.clone();
        let writer = tokio::spawn(async move {
            conn.write_all(&big).await.unwrap();
            conn
        });
        // More than the socket holds: the rest waits, and timers still run.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!writer.is_finished());
        // An answer on conn 1 meanwhile comes whole, between frames.
        theirs
            .write_all(&frame(1, &ttrpc_request(1, "x")))
            .await
            .unwrap();
        let (mut got, mut answers) = (Vec::new(), 0);
        while got.len() < want.len() || answers == 0 {
            let mut p = Vec::new();
            match read_frame_from(&mut theirs, &mut p).await {
                RUNTIME_SERVICE_CONN => got.extend(p),
                PLUGIN_SERVICE_CONN => {
                    let r = ttrpc::Response::parse_from_bytes(&p[MESSAGE_HEADER_LENGTH..]);
                    assert_eq!(r.unwrap().status.code(), Code::INVALID_ARGUMENT);
                    answers += 1;
                }
                other => panic!("frame for conn {other}"),
            }
        }
        assert_eq!(got, want);
        let _conn = writer.await.unwrap();
    }
}
