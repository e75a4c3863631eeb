//! The metrics endpoint: `GET /metrics` and `GET /healthz` over plain HTTP,
//! on a loopback address only.
//!
//! Deliberately tiny: one request per connection, at most
//! [`MAX_REQUEST_BYTES`] read within [`REQUEST_TIMEOUT`], then the
//! connection is closed. At most [`MAX_CONNECTIONS`] are held at once; a
//! new one closes the oldest rather than being refused, so idle or slow
//! local clients can never starve `/healthz` (a liveness probe that fails
//! restarts the pod). Why not hyper: docs/dependencies.md.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use super::Metrics;

/// Most bytes of a request we read (request line plus headers).
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Time a client gets to send its whole request head. Prometheus and the
/// health probe send it with the connection; this cuts idle and slow-loris
/// clients short.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Time a client gets to read our answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections held at once (an fd and a small task each, an 8 KiB buffer
/// once a request starts). At the limit the oldest is closed to make room.
pub const MAX_CONNECTIONS: usize = 256;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("metrics address {addr} is not a loopback address")]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on metrics address {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot accept on metrics address {addr}")]
    Accept {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("health check of {addr} failed")]
    Probe {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("health check of {addr}: unexpected answer {status:?}")]
    Unhealthy { addr: SocketAddr, status: String },
}
/// Serves `metrics` on `addr` until the task is dropped. Refuses any
/// non-loopback address; a failing connection never stops the server.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<(), MetricsError> {
    let listener = bind(addr).await?;
    serve_on(listener, metrics).await
}

/// Binds the metrics listener (loopback only); split from [`serve_on`] so a
/// caller can learn the port of `127.0.0.1:0`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, MetricsError> {
    if !addr.ip().is_loopback() {
        return Err(MetricsError::NotLoopback { addr });
    }
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

/// Serves on an already bound listener (see [`bind`]).
pub async fn serve_on(listener: TcpListener, metrics: Arc<Metrics>) -> Result<(), MetricsError> {
    let addr = listener.local_addr().map_err(|source| MetricsError::Bind {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        source,
    })?;
    if !addr.ip().is_loopback() {
        return Err(MetricsError::NotLoopback { addr });
    }
    info!(%addr, "metrics endpoint listening");
    // Oldest first. Only this loop touches it: no lock.
    let mut open: VecDeque<AbortHandle> = VecDeque::with_capacity(MAX_CONNECTIONS);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            // Per-connection failures (peer reset before accept, fd limits)
            // must not end the endpoint; back off briefly and go on.
            Err(e) if is_transient(&e) => {
                warn!(%addr, error = %e, "metrics accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(source) => return Err(MetricsError::Accept { addr, source }),
        };
        open.retain(|c| !c.is_finished());
        if open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = open.pop_front() {
                debug!(%peer, "too many metrics connections; closing the oldest");
                oldest.abort();
            }
        }
        let metrics = metrics.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = handle(stream, &metrics).await {
                debug!(%peer, error = %e, "metrics connection ended");
            }
        });
        open.push_back(task.abort_handle());
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Metrics,
    Health,
    NotFound,
    BadRequest,
    TooLarge,
}

/// Parses the request head (`buf` holds everything up to the blank line).
fn route(head: &[u8]) -> Route {
    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::BadRequest;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") || method.is_empty() || target.is_empty() {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics,
        ("GET", "/healthz") => Route::Health,
        _ => Route::NotFound,
    }
}

/// Reads the request head: up to the blank line, at most [`MAX_REQUEST_BYTES`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Route> {
    // An idle connection holds no buffer.
    stream.readable().await?;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    loop {
        if len == buf.len() {
            return Ok(Route::TooLarge);
        }
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            // Peer closed before a full head: answer only if a line came.
            return Ok(if len == 0 {
                Route::BadRequest
            } else {
                route(&buf[..len])
            });
        }
        let start = len.saturating_sub(3);
        len += n;
        if buf[start..len].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(route(&buf[..len]));
        }
    }
}

async fn handle(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let route = match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
        Ok(r) => r?,
        Err(_) => Route::BadRequest,
    };
    let (status, body) = match route {
        Route::Metrics => ("200 OK", metrics.render()),
        Route::Health => ("200 OK", "ok\n".to_string()),
        Route::NotFound => ("404 Not Found", "not found\n".to_string()),
        Route::BadRequest => ("400 Bad Request", "bad request\n".to_string()),
        Route::TooLarge => (
            "431 Request Header Fields Too Large",
            "request too large\n".to_string(),
        ),
    };
    let content_type = if route == Route::Metrics {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(r) => r?,
        Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
    }
    // Lingering close: closing with unread input makes the kernel send a
    // reset that can destroy our answer in flight (oversized requests), so
    // discard what is left, bounded in bytes and time.
    let drain = async {
        let mut sink = [0u8; 1024];
        let mut left = DRAIN_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    Ok(())
}

/// Most unread input discarded before closing, and for how long.
const DRAIN_BYTES: usize = 64 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Blocking health check for an `exec` liveness probe (`nri-qos health`):
/// `GET /healthz` on `addr` must answer 200 within `timeout`.
pub fn check_health(addr: SocketAddr, timeout: Duration) -> Result<(), MetricsError> {
    use std::io::{Read, Write};
    let io = |source| MetricsError::Probe { addr, source };
    let mut s = StdTcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(io)?;
    let mut answer = Vec::new();
    s.take(4096).read_to_end(&mut answer).map_err(io)?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or("").to_string();
    if status.starts_with("HTTP/1.1 200 ") {
        Ok(())
    } else {
        Err(MetricsError::Unhealthy { addr, status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_route() {
        let cases: &[(&[u8], Route)] = &[
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", Route::Metrics),
            (b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", Route::Metrics),
            (b"GET /healthz HTTP/1.1\r\n\r\n", Route::Health),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET / HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET /metrics\r\n\r\n", Route::BadRequest),
            (b"GET /metrics HTTP/2.0\r\n\r\n", Route::BadRequest),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"\xff\xfe\r\n\r\n", Route::BadRequest),
            (b"", Route::BadRequest),
        ];
        for (head, want) in cases {
            assert_eq!(route(head), *want, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[tokio::test]
    async fn non_loopback_address_is_refused() {
        for a in ["0.0.0.0:0", "[::]:0", "192.0.2.1:9464"] {
            let addr: SocketAddr = a.parse().unwrap();
            let err = serve(addr, Arc::new(Metrics::new())).await.unwrap_err();
            assert!(
                matches!(err, MetricsError::NotLoopback { .. }),
                "{a}: {err}"
            );
        }
    }
}
