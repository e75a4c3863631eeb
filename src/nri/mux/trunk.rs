//! The trunk socket, blocking, as the trunk thread reads it and both
//! directions write it.

use std::io::{self, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream as BlockingStream;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::UnixStream;

/// The trunk as a blocking socket: the thread sleeps in read(2) until a
/// request arrives and answers with one write(2), two syscalls per request
/// and no event loop in between. Whole frames are written under `writing`
/// so the thread's answers and conn 2's frames never interleave.
pub(super) struct Trunk {
    pub(super) socket: BlockingStream,
    writing: Mutex<()>,
}

impl Trunk {
    pub(super) fn blocking(trunk: UnixStream) -> io::Result<Self> {
        let socket = trunk.into_std()?;
        socket.set_nonblocking(false)?;
        Ok(Trunk {
            socket,
            writing: Mutex::new(()),
        })
    }

    /// Blocks while the peer's receive buffer is full: that is the
    /// back-pressure on a peer that does not read.
    pub(super) fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        let _turn = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        (&self.socket).write_all(bytes)
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
