//! The NRI connection multiplexer.
//!
//! One unix stream (the "trunk") carries several logical connections as
//! frames `[u32 BE conn id][u32 BE payload length][payload]`. NRI uses conn 1
//! for the Plugin service (the runtime calls us) and conn 2 for the Runtime
//! service (we call the runtime). There is no open/close signalling: a frame
//! for a connection nobody opened is dropped, and EOF on the trunk ends all.
//!
//! Each logical connection is handed to ttrpc as one end of an in-memory
//! duplex pipe with a fixed buffer, so a peer can never make us hold more
//! than [`PIPE_CAPACITY`] per connection plus one frame ([`MAX_INCOMING_PAYLOAD`]).
//!
//! Outgoing frames carry at most [`MAX_OUTGOING_PAYLOAD`] bytes: the Go side
//! reads headers through a 4096-byte bufio buffer and fails with ENOMEM on a
//! larger frame, so small frames are always readable by every runtime.

use std::io;

use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadHalf};
use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinSet;
use tracing::{debug, trace};

/// Logical connection on which the plugin serves `nri.pkg.api.v1alpha1.Plugin`.
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Logical connection on which the plugin calls `nri.pkg.api.v1alpha1.Runtime`.
pub const RUNTIME_SERVICE_CONN: u32 = 2;

/// Largest frame payload we send; Go reads through a 4096-byte bufio buffer.
pub const MAX_OUTGOING_PAYLOAD: usize = 4096;
/// Largest frame payload we accept: a whole ttrpc message (10-byte header plus
/// 4 MiB body), which is the most any runtime puts in one frame.
pub const MAX_INCOMING_PAYLOAD: usize = 10 + (4 << 20);
/// Buffer between the trunk and ttrpc, per logical connection and direction.
pub const PIPE_CAPACITY: usize = 256 * 1024;

const HEADER_LEN: usize = 8;

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

/// The two logical connections of an NRI session.
pub struct MuxConns {
    /// Conn 1: hand to the ttrpc server that implements the Plugin service.
    pub plugin_service: DuplexStream,
    /// Conn 2: hand to the ttrpc client that calls the Runtime service.
    pub runtime_service: DuplexStream,
}

/// Splits `trunk` into the NRI conns 1 and 2. `local` is the conn IDs as we
/// see them: a plugin uses `(PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN)`,
/// a runtime-side test peer uses the same IDs (the mux is symmetric).
///
/// Returns the conns and the driver future; the session is over when the
/// driver returns (trunk EOF, malformed frame, or a local end closed).
pub fn split<T>(
    trunk: T,
) -> (
    MuxConns,
    impl std::future::Future<Output = MuxError> + Send + 'static,
)
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (plugin_local, plugin_remote) = tokio::io::duplex(PIPE_CAPACITY);
    let (runtime_local, runtime_remote) = tokio::io::duplex(PIPE_CAPACITY);
    let driver = drive(
        trunk,
        [
            (PLUGIN_SERVICE_CONN, plugin_remote),
            (RUNTIME_SERVICE_CONN, runtime_remote),
        ],
    );
    (
        MuxConns {
            plugin_service: plugin_local,
            runtime_service: runtime_local,
        },
        driver,
    )
}

async fn drive<T>(trunk: T, conns: [(u32, DuplexStream); 2]) -> MuxError
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (trunk_rd, trunk_wr) = tokio::io::split(trunk);
    // Header and payload of a frame usually arrive together: one read, not two.
    let mut trunk_rd = tokio::io::BufReader::with_capacity(64 * 1024, trunk_rd);
    let trunk_wr = std::sync::Arc::new(Mutex::new(trunk_wr));
    let (end_tx, mut end_rx) = mpsc::channel::<MuxError>(4);
    let mut tasks = JoinSet::new();
    let mut inbound = Vec::new();

    for (conn, pipe) in conns {
        let (pipe_rd, pipe_wr) = tokio::io::split(pipe);
        inbound.push((conn, pipe_wr));
        let wr = trunk_wr.clone();
        let end = end_tx.clone();
        tasks.spawn(async move {
            let reason = pump_outgoing(conn, pipe_rd, wr).await;
            let _ = end.send(reason).await;
        });
    }

    let reader_end = end_tx.clone();
    tasks.spawn(async move {
        let reason = pump_incoming(&mut trunk_rd, inbound).await;
        let _ = reader_end.send(reason).await;
    });
    drop(end_tx);

    let reason = end_rx.recv().await.unwrap_or(MuxError::Closed);
    debug!(%reason, "nri multiplexer stopping");
    // Aborting drops the pipe ends, so ttrpc sees EOF on both conns, and
    // drops the trunk halves, so the runtime sees EOF too.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    reason
}

/// Copies bytes ttrpc wrote on one conn to the trunk, as frames of at most
/// [`MAX_OUTGOING_PAYLOAD`] bytes, one write per frame.
async fn pump_outgoing<W>(
    conn: u32,
    mut pipe: ReadHalf<DuplexStream>,
    trunk: std::sync::Arc<Mutex<W>>,
) -> MuxError
where
    W: AsyncWrite + Unpin,
{
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
        // n <= MAX_OUTGOING_PAYLOAD, which fits in u32.
        frame[4..HEADER_LEN].copy_from_slice(&(n as u32).to_be_bytes());
        let mut wr = trunk.lock().await;
        if let Err(source) = wr.write_all(&frame[..HEADER_LEN + n]).await {
            return MuxError::Io {
                context: "writing a frame",
                source,
            };
        }
        if let Err(source) = wr.flush().await {
            return MuxError::Io {
                context: "flushing a frame",
                source,
            };
        }
        trace!(conn, len = n, "frame sent");
    }
}

/// Reads frames from the trunk and delivers each payload to its conn.
async fn pump_incoming<R>(
    trunk: &mut R,
    mut conns: Vec<(u32, tokio::io::WriteHalf<DuplexStream>)>,
) -> MuxError
where
    R: AsyncRead + Unpin,
{
    let mut header = [0u8; HEADER_LEN];
    let mut payload = Vec::new();
    loop {
        match trunk.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return MuxError::Closed,
            Err(source) => {
                return MuxError::Io {
                    context: "reading a frame header",
                    source,
                }
            }
        }
        let (conn, len) = parse_header(&header);
        if len > MAX_INCOMING_PAYLOAD {
            return MuxError::Oversized {
                conn,
                len,
                max: MAX_INCOMING_PAYLOAD,
            };
        }
        payload.resize(len, 0);
        if let Err(source) = trunk.read_exact(&mut payload).await {
            return if source.kind() == io::ErrorKind::UnexpectedEof {
                MuxError::Closed
            } else {
                MuxError::Io {
                    context: "reading a frame payload",
                    source,
                }
            };
        }
        match conns.iter_mut().find(|(id, _)| *id == conn) {
            Some((_, pipe)) => {
                // Blocks (and so stops reading the trunk) while ttrpc is behind:
                // back-pressure instead of unbounded buffering.
                if pipe.write_all(&payload).await.is_err() {
                    return MuxError::LocalClosed(conn);
                }
            }
            None => debug!(conn, len, "dropping frame for a connection nobody opened"),
        }
        // Do not keep a huge buffer around after one large message.
        if payload.capacity() > PIPE_CAPACITY {
            payload = Vec::new();
        }
    }
}

fn parse_header(h: &[u8; HEADER_LEN]) -> (u32, usize) {
    let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    (conn, len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = conn.to_be_bytes().to_vec();
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> (u32, Vec<u8>) {
        let mut h = [0u8; HEADER_LEN];
        r.read_exact(&mut h).await.unwrap();
        let (conn, len) = parse_header(&h);
        let mut p = vec![0; len];
        r.read_exact(&mut p).await.unwrap();
        (conn, p)
    }

    #[tokio::test]
    async fn delivers_payloads_to_their_conn_and_drops_unknown_conns() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let (mut conns, driver) = split(ours);
        let driver = tokio::spawn(driver);
        theirs.write_all(&frame(7, b"nobody")).await.unwrap();
        theirs.write_all(&frame(2, b"to-runtime")).await.unwrap();
        theirs.write_all(&frame(1, b"to-plugin")).await.unwrap();
        let mut buf = [0u8; 9];
        conns.plugin_service.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"to-plugin");
        let mut buf = [0u8; 10];
        conns.runtime_service.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"to-runtime");
        drop(theirs);
        assert!(matches!(driver.await.unwrap(), MuxError::Closed));
    }

    #[tokio::test]
    async fn splits_large_writes_into_go_readable_frames() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let (mut conns, driver) = split(ours);
        tokio::spawn(driver);
        let big: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        conns.plugin_service.write_all(&big).await.unwrap();
        let mut got = Vec::new();
        while got.len() < big.len() {
            let (conn, p) = read_frame(&mut theirs).await;
            assert_eq!(conn, PLUGIN_SERVICE_CONN);
            assert!(
                !p.is_empty() && p.len() <= MAX_OUTGOING_PAYLOAD,
                "{}",
                p.len()
            );
            got.extend(p);
        }
        assert_eq!(got, big);
    }

    #[tokio::test]
    async fn oversized_frame_ends_the_session() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let (_conns, driver) = split(ours);
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
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let (mut conns, driver) = split(ours);
        let driver = tokio::spawn(driver);
        let f = frame(1, b"only part of this arrives");
        theirs.write_all(&f[..12]).await.unwrap();
        drop(theirs);
        assert!(matches!(driver.await.unwrap(), MuxError::Closed));
        let mut rest = Vec::new();
        conns.plugin_service.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn accepts_a_whole_ttrpc_message_in_one_frame() {
        let (ours, mut theirs) = tokio::io::duplex(8 << 20);
        let (mut conns, driver) = split(ours);
        tokio::spawn(driver);
        let big = vec![0x5au8; 3 << 20];
        let f = frame(1, &big);
        tokio::spawn(async move {
            theirs.write_all(&f).await.unwrap();
            theirs
        });
        let mut got = vec![0u8; big.len()];
        conns.plugin_service.read_exact(&mut got).await.unwrap();
        assert_eq!(got, big);
    }
}
