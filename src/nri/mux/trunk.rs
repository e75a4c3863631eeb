//! The trunk socket, blocking, as the trunk thread reads it and both
//! directions write it.

use std::io::{self, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as BlockingStream;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::socket::{send, MsgFlags};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

/// The trunk as a blocking socket: the thread sleeps in read(2) until a
/// request arrives and answers with one write(2), two syscalls per request
/// and no event loop in between. Whole frames are written under `writing`
/// so the thread's answers and conn 2's frames never interleave.
pub(super) struct Trunk {
    pub(super) socket: BlockingStream,
    writing: Arc<Mutex<()>>,
}

impl Trunk {
    pub(super) fn blocking(trunk: UnixStream) -> io::Result<Self> {
        let socket = trunk.into_std()?;
        socket.set_nonblocking(false)?;
        Ok(Trunk {
            socket,
            writing: Arc::default(),
        })
    }

    /// The trunk thread's write. Blocks while the peer's receive buffer is
    /// full: that is the back-pressure on a peer that does not read.
    pub(super) fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        let _turn = self.writing.blocking_lock();
        (&self.socket).write_all(bytes)
    }

    /// A write from the event loop (conn 2's few calls): what the socket
    /// takes at once goes now; the rest, when the peer does not read, waits
    /// on the blocking pool, not on the event loop, keeping the turn so no
    /// answer lands inside the frame. Gives `frame` back for reuse.
    pub(super) async fn write_from_event_loop(
        self: &Arc<Self>,
        frame: Vec<u8>,
        len: usize,
    ) -> (Vec<u8>, io::Result<()>) {
        let turn = self.writing.clone().lock_owned().await;
        let sent = loop {
            match send(
                self.socket.as_raw_fd(),
                &frame[..len],
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(n) => break n,
                Err(Errno::EAGAIN) => break 0,
                Err(Errno::EINTR) => continue,
                Err(e) => return (frame, Err(e.into())),
            }
        };
        if sent == len {
            return (frame, Ok(()));
        }
        let trunk = self.clone();
        let rest = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let r = (&trunk.socket).write_all(&frame[sent..len]);
            (frame, r)
        });
        match rest.await {
            Ok(done) => done,
            Err(e) => (Vec::new(), Err(io::Error::other(e))),
        }
    }
}

/// Shuts the trunk down when the driver goes (session over or cancelled):
/// the thread's blocked read or write returns and the thread ends.
pub(super) struct CloseOnDrop(pub(super) Arc<Trunk>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        let _ = self.0.socket.shutdown(Shutdown::Both);
    }
}
