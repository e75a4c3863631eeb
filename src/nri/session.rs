//! One NRI session (mux + ttrpc server + client + registration) and the
//! runner that keeps sessions going in both launch modes.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::UnixStream;
use tracing::{error, info, warn};
use ttrpc::r#async::transport::Socket;
use ttrpc::r#async::Client;

use super::mux::{self, MuxError};
use super::plugin::{QosPlugin, DEFAULT_REGISTRATION_TIMEOUT};
use super::proto::{api, api_ttrpc};
use crate::node::time;

/// The name and two-digit index we register with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub index: String,
}

impl Identity {
    /// Validates like the runtime does: a non-empty name of
    /// `[a-zA-Z0-9_.+-]` and an index of exactly two digits.
    pub fn new(name: &str, index: &str) -> Result<Self, SessionError> {
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c));
        if !name_ok {
            return Err(SessionError::BadIdentity(format!(
                "plugin name {name:?} must be non-empty and use only [a-zA-Z0-9_.+-]"
            )));
        }
        if index.len() != 2 || !index.chars().all(|c| c.is_ascii_digit()) {
            return Err(SessionError::BadIdentity(format!(
                "plugin index {index:?} must be exactly two digits"
            )));
        }
        Ok(Identity {
            name: name.to_string(),
            index: index.to_string(),
        })
    }

    /// `NN-name`, the form of a pre-launched plugin's file name.
    pub fn from_file_name(file: &str) -> Option<Self> {
        let (idx, name) = file.split_once('-')?;
        Identity::new(name, idx).ok()
    }
}

/// How we reach the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// External plugin: dial the runtime's NRI socket, reconnect when it goes.
    Socket(PathBuf),
    /// Pre-launched by the runtime: one end of a socketpair on this fd.
    /// The runtime starts a new process after it restarts, so we exit when
    /// the session ends.
    InheritedFd(RawFd),
}

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("invalid plugin identity: {0}")]
    BadIdentity(String),
    #[error("cannot connect to the NRI socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot use inherited NRI fd {fd}")]
    InheritedFd {
        fd: RawFd,
        #[source]
        source: io::Error,
    },
    #[error("runtime refused or did not answer RegisterPlugin: {0}")]
    Register(#[source] ttrpc::Error),
    #[error("session ended: {0}")]
    Ended(#[from] MuxError),
}

/// The timeout a request carries (`None`: the runtime sent none).
pub fn request_timeout(ctx: &ttrpc::r#async::TtrpcContext) -> Option<Duration> {
    u64::try_from(ctx.timeout_nano)
        .ok()
        .filter(|n| *n > 0)
        .map(Duration::from_nanos)
}

/// How long after Configure an external plugin waits for Synchronize before
/// it says the runtime may be stuck: runtimes sync right after Configure,
/// within their request timeout (2 s by default).
const SYNC_EXPECTED_WITHIN: Duration = Duration::from_secs(10);

/// Runs one session over an established trunk until it ends. Returns why.
pub async fn run_session(
    trunk: UnixStream,
    plugin: Arc<QosPlugin>,
    identity: &Identity,
) -> SessionError {
    session(trunk, plugin, identity, false).await
}

/// [`run_session`]; `external`: the runtime synchronizes this plugin right
/// after Configure (it skips pre-launched plugins on NRI v0.6.1).
async fn session(
    trunk: UnixStream,
    plugin: Arc<QosPlugin>,
    identity: &Identity,
    external: bool,
) -> SessionError {
    plugin.reset_session();
    let waiter = plugin.clone();
    let metrics = plugin.metrics();
    let connected = metrics.clone();
    let end = serve(
        trunk,
        super::lean_sync::create_plugin(plugin),
        identity,
        async move {
            connected.set_runtime_connected(true);
            let configured = waiter.wait_configured(DEFAULT_REGISTRATION_TIMEOUT).await;
            if !configured || !external {
                return configured;
            }
            let runtime = waiter.runtime_info().unwrap_or_default();
            // A runtime given a long request timeout may take that long.
            let limit = runtime
                .request_timeout
                .map_or(SYNC_EXPECTED_WITHIN, |t| SYNC_EXPECTED_WITHIN.max(2 * t));
            if !waiter.wait_synchronized(limit).await {
                // Nothing we can do from here: the runtime's own locks.
                error!(
                    runtime = %runtime.quirks.name,
                    version = %runtime.quirks.version,
                    waited_s = limit.as_secs(),
                    "the runtime configured this plugin but has not synchronized it; containerd 1.7 before 1.7.26 deadlocks when an external plugin registers during a pod or container event (containerd#10085): if pods stop starting, restart containerd (docs/operations.md)"
                );
            }
            true
        },
    )
    .await;
    metrics.set_runtime_connected(false);
    end
}

/// Aborts a spawned task when dropped, so a cancelled session leaves nothing behind.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `services` (a Plugin implementation) on conn 1, registers on conn 2,
/// and runs until the trunk closes. `configured` resolves to whether
/// Configure arrived in time.
pub async fn serve(
    trunk: UnixStream,
    services: mux::Services,
    identity: &Identity,
    configured: impl std::future::Future<Output = bool>,
) -> SessionError {
    // Conn 1 is served from the moment the driver runs, before we register:
    // the runtime calls Configure right after it accepts the registration,
    // possibly before we see the reply.
    let (runtime_conn, driver) = mux::serve(trunk, services);
    let mut driver = AbortOnDrop(tokio::spawn(driver));

    let client = api_ttrpc::RuntimeClient::new(Client::new(Socket::new(runtime_conn)));
    let req = api::RegisterPluginRequest {
        plugin_name: identity.name.clone(),
        plugin_idx: identity.index.clone(),
        // The API version proto/nri/api.proto follows.
        NRI_version: crate::node::runtime::SPOKEN.to_string(),
        ..Default::default()
    };
    let ctx = ttrpc::context::with_timeout(time::nanos_i64(DEFAULT_REGISTRATION_TIMEOUT));
    let registered = tokio::select! {
        r = client.register_plugin(ctx, &req) => r.map_err(SessionError::Register),
        r = &mut driver.0 => Err(SessionError::Ended(r.unwrap_or(MuxError::Closed))),
    };
    if let Err(e) = registered {
        return e;
    }
    info!(name = %identity.name, index = %identity.index, "registered with the runtime");
    // The throttle guard calls UpdateContainers through this
    // client (from its own task, never from a handler).
    super::relax::LINK.set(Some(client.clone()));
    // The session may end while we wait: that ends the wait too.
    let reason = tokio::select! {
        configured = configured => {
            if !configured {
                warn!("runtime did not send Configure within the registration timeout");
            }
            (&mut driver.0).await.unwrap_or(MuxError::Closed)
        }
        r = &mut driver.0 => r.unwrap_or(MuxError::Closed),
    };
    super::relax::LINK.set(None);
    // Keep the client alive until here: dropping it closes conn 2.
    drop(client);
    SessionError::Ended(reason)
}

/// Capped exponential backoff for reconnects.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { next: min, max }
    }
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    pub fn reset(&mut self, min: Duration) {
        self.next = min;
    }
}

const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Keeps the plugin attached to the runtime. Returns when a pre-launched
/// session ends; for an external plugin it reconnects forever.
pub async fn run(
    transport: Transport,
    plugin: Arc<QosPlugin>,
    identity: Identity,
) -> Result<(), SessionError> {
    match transport {
        Transport::InheritedFd(fd) => {
            let trunk = inherited_stream(fd)?;
            let reason = run_session(trunk, plugin, &identity).await;
            info!(%reason, "pre-launched session over; the runtime starts a new plugin process when it comes back");
            Ok(())
        }
        Transport::Socket(path) => {
            let mut backoff = Backoff::new(RECONNECT_MIN, RECONNECT_MAX);
            let mut logged_down = false;
            loop {
                match UnixStream::connect(&path).await {
                    Ok(trunk) => {
                        info!(socket = %path.display(), "connected to the runtime");
                        logged_down = false;
                        let started = tokio::time::Instant::now();
                        let reason = session(trunk, plugin.clone(), &identity, true).await;
                        warn!(%reason, "disconnected from the runtime; reconnecting");
                        if started.elapsed() > RECONNECT_MAX {
                            backoff.reset(RECONNECT_MIN);
                        }
                    }
                    Err(source) => {
                        if !logged_down {
                            warn!(error = %SessionError::Connect { path: path.clone(), source }, "runtime not reachable; retrying with backoff");
                            logged_down = true;
                        }
                    }
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

fn inherited_stream(fd: RawFd) -> Result<UnixStream, SessionError> {
    let err = |source| SessionError::InheritedFd { fd, source };
    // Refuse anything that is not an open socket before taking ownership.
    nix::sys::socket::getsockname::<nix::sys::socket::UnixAddr>(fd)
        .map_err(|e| err(io::Error::from(e)))?;
    // SAFETY: the runtime passes us this fd (NRI_PLUGIN_SOCKET) and nothing
    // else in the process owns it; we checked above that it is a socket.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let std_stream = std::os::unix::net::UnixStream::from(owned);
    std_stream.set_nonblocking(true).map_err(err)?;
    UnixStream::from_std(std_stream).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_validated_like_the_runtime_does() {
        assert!(Identity::new("nri-qos", "10").is_ok());
        assert!(Identity::new("", "10").is_err());
        assert!(Identity::new("nri qos", "10").is_err());
        assert!(Identity::new("nri-qos", "1").is_err());
        assert!(Identity::new("nri-qos", "1a").is_err());
        assert_eq!(
            Identity::from_file_name("10-nri-qos"),
            Some(Identity::new("nri-qos", "10").unwrap())
        );
        assert_eq!(Identity::from_file_name("nri-qos"), None);
    }

    #[test]
    fn backoff_is_capped() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let delays: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(*delays.last().unwrap(), Duration::from_secs(5));
    }
}
