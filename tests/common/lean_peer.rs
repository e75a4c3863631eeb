//! The benches' runtime-side peer: plain blocking I/O on one thread, no
//! async runtime and no ttrpc client, so a round trip costs the peer what
//! the floor's ping-pong costs it (one write, one read when the answer fits
//! in one frame). It speaks what containerd speaks: mux frames of at most
//! 4 KiB payload on the trunk, ttrpc messages on them, the plugin's
//! service (Configure, Synchronize, CreateContainer, ...) called on conn 1
//! and the runtime's service (RegisterPlugin, UpdateContainers) answered on
//! conn 2, whenever the plugin calls it, also between a request and its
//! answer on conn 1.

use std::io::{BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use nri_qos::nri::proto::api;
use protobuf::Message;
use ttrpc::proto::{MESSAGE_HEADER_LENGTH, MESSAGE_LENGTH_MAX, MESSAGE_TYPE_REQUEST};
use ttrpc::{Code, MessageHeader};

use super::{configure_request, frame, TIMEOUT};

/// The plugin's service, called on conn 1.
pub const PLUGIN_CONN: u32 = 1;
/// The runtime's service, which the plugin calls on conn 2.
pub const RUNTIME_CONN: u32 = 2;
/// The largest mux payload containerd writes.
pub const FRAME_PAYLOAD_MAX: usize = 4096;
const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// Reads one mux frame into `buf`; returns its conn.
pub fn read_frame(s: &mut impl Read, buf: &mut Vec<u8>) -> u32 {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).expect("frame header");
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    assert!(
        len <= MESSAGE_HEADER_LENGTH + MESSAGE_LENGTH_MAX,
        "frame of {len} bytes"
    );
    buf.resize(len, 0);
    s.read_exact(buf).expect("frame payload");
    u32::from_be_bytes([h[0], h[1], h[2], h[3]])
}

/// `message` (a ttrpc header and body) as mux frames on `conn`, at most
/// [`FRAME_PAYLOAD_MAX`] bytes each, appended to `out`.
pub fn frames(conn: u32, message: &[u8], out: &mut Vec<u8>) {
    for chunk in message.chunks(FRAME_PAYLOAD_MAX) {
        out.extend_from_slice(&frame(conn, chunk));
    }
}

/// A ttrpc message: header then body.
fn message(header: MessageHeader, body: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = header.into();
    m.extend_from_slice(body);
    m
}

/// A ttrpc request message (header and encoded `req`).
pub fn request_message(stream_id: u32, req: &ttrpc::Request) -> Vec<u8> {
    let body = req.write_to_bytes().unwrap();
    message(
        MessageHeader::new_request(stream_id, body.len() as u32),
        &body,
    )
}

/// A ttrpc response message (header and encoded `resp`).
pub fn response_message(stream_id: u32, resp: &ttrpc::Response) -> Vec<u8> {
    let body = resp.write_to_bytes().unwrap();
    message(
        MessageHeader::new_response(stream_id, body.len() as u32),
        &body,
    )
}

/// One plugin connection, seen from the runtime.
pub struct LeanPeer {
    /// Reads through one buffer: a frame header and the payload after it
    /// come in with one `read` when the plugin wrote them together.
    reader: BufReader<UnixStream>,
    /// The next stream id on conn 1: odd and increasing (Go's ttrpc server
    /// refuses a re-used or lower one).
    next_stream: u32,
    frame: Vec<u8>,
    /// Bytes of a ttrpc message not yet complete, per conn.
    pending: [Vec<u8>; 2],
    /// The body of the last answer on conn 1.
    answer: Vec<u8>,
    out: Vec<u8>,
    /// RegisterPlugin calls answered, with the plugin's name and index.
    pub registered: Vec<(String, String)>,
    /// UpdateContainers calls answered.
    pub updates: usize,
}

impl LeanPeer {
    /// Accepts the plugin's connection (blocking, up to [`TIMEOUT`]).
    pub fn accept(listener: &UnixListener) -> Self {
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + TIMEOUT;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "plugin did not connect in time"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        Self::new(stream)
    }

    pub fn new(stream: UnixStream) -> Self {
        // A plugin that stops answering fails the bench instead of hanging it.
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        LeanPeer {
            reader: BufReader::with_capacity(64 * 1024, stream),
            next_stream: 1,
            frame: Vec::new(),
            pending: [Vec::new(), Vec::new()],
            answer: Vec::new(),
            out: Vec::new(),
            registered: Vec::new(),
            updates: 0,
        }
    }

    /// Register -> Configure, the way containerd 2.x does it: waits for the
    /// plugin's RegisterPlugin on conn 2, answers it, then calls Configure.
    pub fn handshake(&mut self) -> api::ConfigureResponse {
        while self.registered.is_empty() {
            self.read_one_message();
        }
        self.call_message("Configure", &configure_request(true))
    }

    /// The mux frames of a call to the plugin's `method` with an encoded
    /// request, taking the next stream id: what [`Self::round_trip`] sends.
    pub fn request(&mut self, method: &str, payload: &[u8]) -> Vec<u8> {
        self.request_with_timeout(method, payload, std::time::Duration::from_secs(2))
    }

    /// [`Self::request`] with the request timeout `timeout`.
    pub fn request_with_timeout(
        &mut self,
        method: &str,
        payload: &[u8],
        timeout: std::time::Duration,
    ) -> Vec<u8> {
        let req = ttrpc::Request {
            service: PLUGIN_SERVICE.into(),
            method: method.into(),
            payload: payload.to_vec(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap(),
            ..Default::default()
        };
        let stream_id = self.next_stream;
        self.next_stream += 2;
        let mut out = Vec::new();
        frames(PLUGIN_CONN, &request_message(stream_id, &req), &mut out);
        out
    }

    /// Sends the frames of one request (from [`Self::request`]) and returns
    /// the answer's payload, serving the plugin's calls on conn 2 meanwhile.
    /// Panics on an error status.
    pub fn round_trip(&mut self, request: &[u8]) -> &[u8] {
        self.reader
            .get_mut()
            .write_all(request)
            .expect("send request");
        let stream_id = u32::from_be_bytes([request[12], request[13], request[14], request[15]]);
        loop {
            let Some((header, body)) = self.read_one_message() else {
                continue;
            };
            assert_eq!(header.stream_id, stream_id, "answer to another call");
            let resp = ttrpc::Response::parse_from_bytes(&body).expect("ttrpc Response");
            if let Some(status) = resp.status.as_ref() {
                assert_eq!(
                    status.code(),
                    Code::OK,
                    "plugin answered {:?}: {}",
                    status.code(),
                    status.message
                );
            }
            self.answer = resp.payload;
            return &self.answer;
        }
    }

    /// Calls the plugin's `method` with `req` and decodes its answer.
    pub fn call_message<R: Message>(&mut self, method: &str, req: &impl Message) -> R {
        let frames = self.request(method, &req.write_to_bytes().unwrap());
        let payload = self.round_trip(&frames);
        R::parse_from_bytes(payload).unwrap_or_else(|e| panic!("{method} answer: {e}"))
    }

    /// Reads frames until a ttrpc message is complete on either conn. A
    /// request on conn 2 is answered here (`None`); a message on conn 1 is
    /// returned with its body.
    fn read_one_message(&mut self) -> Option<(MessageHeader, Vec<u8>)> {
        loop {
            let conn = read_frame(&mut self.reader, &mut self.frame);
            let Some(idx) = [PLUGIN_CONN, RUNTIME_CONN].iter().position(|&c| c == conn) else {
                continue; // Another conn: nothing we serve; drop it.
            };
            self.pending[idx].extend_from_slice(&self.frame);
            let buf = &self.pending[idx];
            if buf.len() < MESSAGE_HEADER_LENGTH {
                continue;
            }
            let header = MessageHeader::from(&buf[..MESSAGE_HEADER_LENGTH]);
            let end = MESSAGE_HEADER_LENGTH + header.length as usize;
            if buf.len() < end {
                continue;
            }
            let body = buf[MESSAGE_HEADER_LENGTH..end].to_vec();
            self.pending[idx].drain(..end);
            if conn == PLUGIN_CONN {
                return Some((header, body));
            }
            self.serve_runtime_call(&header, &body);
            return None;
        }
    }

    /// Answers the plugin's call on conn 2: RegisterPlugin and
    /// UpdateContainers succeed, anything else is unimplemented.
    fn serve_runtime_call(&mut self, header: &MessageHeader, body: &[u8]) {
        if header.type_ != MESSAGE_TYPE_REQUEST {
            return;
        }
        let req = ttrpc::Request::parse_from_bytes(body).expect("ttrpc Request on conn 2");
        let mut resp = ttrpc::Response::new();
        match req.method.as_str() {
            "RegisterPlugin" => {
                let r = api::RegisterPluginRequest::parse_from_bytes(&req.payload)
                    .expect("RegisterPluginRequest");
                self.registered.push((r.plugin_name, r.plugin_idx));
                resp.payload = api::Empty::new().write_to_bytes().unwrap();
            }
            "UpdateContainers" => {
                self.updates += 1;
                resp.payload = api::UpdateContainersResponse::new()
                    .write_to_bytes()
                    .unwrap();
            }
            other => {
                resp.status = protobuf::MessageField::some(ttrpc::get_status(
                    Code::UNIMPLEMENTED,
                    format!("{}/{other} not served by the bench's runtime", req.service),
                ));
            }
        }
        self.out.clear();
        frames(
            RUNTIME_CONN,
            &response_message(header.stream_id, &resp),
            &mut self.out,
        );
        self.reader
            .get_mut()
            .write_all(&self.out)
            .expect("answer on conn 2");
    }
}
