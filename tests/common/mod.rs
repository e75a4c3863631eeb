//! A runtime-side NRI test peer: what containerd does, written from the
//! same proto but with its own frame codec (not the plugin's mux), so the
//! framing is checked independently.

// Test code: a failed unwrap is the test failure report.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
// Tests, benches and tools cast small, known values; the cast lints guard
// the product code.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

pub mod lean_peer;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use nri_qos::nri::proto::{api, api_ttrpc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Mutex};
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};

pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The plugin binary under test, as a child process.
pub struct PluginProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl PluginProcess {
    /// External mode: the plugin dials `socket`.
    pub fn external(socket: &Path, dir: &Path, extra: &[&str]) -> Self {
        // NRI_QOS_BIN: another build of the plugin, for A/B benchmarks.
        let bin =
            std::env::var_os("NRI_QOS_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_nri-qos").into());
        let mut args = vec![
            std::ffi::OsStr::new("run"),
            "--socket".as_ref(),
            socket.as_os_str(),
        ];
        let extra = if extra.is_empty() {
            &["--log-level", "nri_qos=debug"][..]
        } else {
            extra
        };
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        Self::spawn(bin.as_ref(), &args, &dir.join("plugin.log"))
    }

    /// Any plugin binary (the benchmark's Go stub too), stderr to `log`, with
    /// no NRI_PLUGIN_* from our environment to mistake for a launch.
    pub fn spawn(bin: &Path, args: &[&std::ffi::OsStr], log: &Path) -> Self {
        let child = Command::new(bin)
            .args(args)
            .env_remove("NRI_PLUGIN_SOCKET")
            .env_remove("NRI_PLUGIN_NAME")
            .env_remove("NRI_PLUGIN_IDX")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        PluginProcess {
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Resident set size of the plugin in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_value("VmRSS")
    }

    /// A numeric field of `/proc/<pid>/status` (KiB for memory), 0 if absent.
    pub fn status_value(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the fake runtime saw on its Runtime service.
#[derive(Debug)]
pub enum RuntimeEvent {
    Registered {
        name: String,
        index: String,
        /// The NRI version the plugin said it speaks.
        nri_version: String,
    },
    UpdateContainers(api::UpdateContainersRequest),
}

struct FakeRuntime {
    events: mpsc::UnboundedSender<RuntimeEvent>,
    /// When set, RegisterPlugin calls Configure on the plugin before it
    /// replies, the way the runtime may (it signals success before writing
    /// the reply).
    configure_first: Option<Arc<std::sync::OnceLock<api_ttrpc::PluginClient>>>,
    configured_first: mpsc::UnboundedSender<api::ConfigureResponse>,
}

#[async_trait]
impl api_ttrpc::Runtime for FakeRuntime {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        if let Some(cell) = &self.configure_first {
            let client = cell.get().expect("plugin client set before registration");
            let resp = client.configure(ctx(), &configure_request(true)).await?;
            let _ = self.configured_first.send(resp);
        }
        let _ = self.events.send(RuntimeEvent::Registered {
            name: req.plugin_name,
            index: req.plugin_idx,
            nri_version: req.NRI_version,
        });
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let _ = self.events.send(RuntimeEvent::UpdateContainers(req));
        Ok(api::UpdateContainersResponse::new())
    }
}

/// One accepted plugin connection, seen from the runtime.
pub struct PeerSession {
    pub plugin: api_ttrpc::PluginClient,
    pub client: Client,
    pub events: mpsc::UnboundedReceiver<RuntimeEvent>,
    /// Raw access to the trunk, to inject garbage.
    pub raw: Arc<Mutex<OwnedWriteHalf>>,
    /// Largest frame payload the plugin sent us.
    pub max_frame: Arc<AtomicUsize>,
    /// Frames the plugin sent us.
    pub frames: Arc<AtomicUsize>,
    /// Closed when the plugin closed the trunk.
    pub closed: mpsc::Receiver<()>,
    /// Configure answers given inside RegisterPlugin (see `attach_with`).
    pub configured_first: mpsc::UnboundedReceiver<api::ConfigureResponse>,
    _server: Server,
}

pub fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = conn.to_be_bytes().to_vec();
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Accepts the plugin's connection and wires the runtime's ends of conn 1
/// (ttrpc client of Plugin) and conn 2 (ttrpc server of Runtime).
/// `big_frames`: send whole writes as one frame like a Go runtime does for
/// large messages, instead of small frames.
pub async fn accept(listener: &UnixListener, big_frames: bool) -> PeerSession {
    let (stream, _) = tokio::time::timeout(TIMEOUT, listener.accept())
        .await
        .expect("plugin did not connect in time")
        .expect("accept");
    attach(stream, big_frames).await
}

pub async fn attach(stream: UnixStream, big_frames: bool) -> PeerSession {
    attach_with(stream, big_frames, false).await
}

/// `configure_first`: call Configure from inside RegisterPlugin, before the
/// plugin has the registration reply.
pub async fn attach_with(
    stream: UnixStream,
    big_frames: bool,
    configure_first: bool,
) -> PeerSession {
    let (mut rd, wr) = stream.into_split();
    let wr = Arc::new(Mutex::new(wr));
    let (c1_local, c1_remote) = tokio::io::duplex(1 << 20);
    let (c2_local, c2_remote) = tokio::io::duplex(1 << 20);
    let (c1_rd, mut c1_wr) = tokio::io::split(c1_remote);
    let (c2_rd, mut c2_wr) = tokio::io::split(c2_remote);
    let max_frame = Arc::new(AtomicUsize::new(0));
    let frames = Arc::new(AtomicUsize::new(0));
    let (closed_tx, closed) = mpsc::channel(1);

    // Trunk -> conns, recording frame sizes.
    let (mf, fc) = (max_frame.clone(), frames.clone());
    tokio::spawn(async move {
        let mut h = [0u8; 8];
        loop {
            if rd.read_exact(&mut h).await.is_err() {
                break;
            }
            let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            mf.fetch_max(len, Ordering::SeqCst);
            fc.fetch_add(1, Ordering::SeqCst);
            let mut p = vec![0u8; len];
            if rd.read_exact(&mut p).await.is_err() {
                break;
            }
            let ok = match conn {
                1 => c1_wr.write_all(&p).await.is_ok(),
                2 => c2_wr.write_all(&p).await.is_ok(),
                _ => true,
            };
            if !ok {
                break;
            }
        }
        drop(closed_tx);
    });
    // Conns -> trunk.
    for (conn, mut pipe) in [(1u32, c1_rd), (2u32, c2_rd)] {
        let wr = wr.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; if big_frames { 1 << 20 } else { 4096 }];
            loop {
                let n = match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let f = frame(conn, &buf[..n]);
                if wr.lock().await.write_all(&f).await.is_err() {
                    break;
                }
            }
        });
    }

    let (tx, events) = mpsc::unbounded_channel();
    let (cf_tx, configured_first) = mpsc::unbounded_channel();
    let cell = Arc::new(std::sync::OnceLock::new());
    let client = Client::new(Socket::new(c1_local));
    let _ = cell.set(api_ttrpc::PluginClient::new(client.clone()));
    let mut server = Server::new()
        .register_service(api_ttrpc::create_runtime(Arc::new(FakeRuntime {
            events: tx,
            configure_first: configure_first.then_some(cell),
            configured_first: cf_tx,
        })))
        .add_listener(Listener::new(
            futures::stream::once(async move { Ok::<_, std::io::Error>(c2_local) })
                .chain(futures::stream::pending()),
        ));
    server.start().await.expect("start fake runtime server");
    PeerSession {
        plugin: api_ttrpc::PluginClient::new(client.clone()),
        client,
        events,
        raw: wr,
        max_frame,
        frames,
        closed,
        configured_first,
        _server: server,
    }
}

/// The Configure containerd sends: 2.x with its registration and request
/// timeouts, 1.7 without.
pub fn configure_request(with_timeouts: bool) -> api::ConfigureRequest {
    api::ConfigureRequest {
        runtime_name: "containerd".into(),
        runtime_version: if with_timeouts { "v2.1.9" } else { "v1.7.24" }.into(),
        registration_timeout: if with_timeouts { 5000 } else { 0 },
        request_timeout: if with_timeouts { 2000 } else { 0 },
        ..Default::default()
    }
}

pub fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(2_000_000_000)
}

impl PeerSession {
    pub async fn expect_registered(&mut self) -> (String, String) {
        let (name, index, _) = self.expect_registered_nri().await;
        (name, index)
    }

    /// RegisterPlugin's name, index and NRI version.
    pub async fn expect_registered_nri(&mut self) -> (String, String, String) {
        match tokio::time::timeout(TIMEOUT, self.events.recv()).await {
            Ok(Some(RuntimeEvent::Registered {
                name,
                index,
                nri_version,
            })) => (name, index, nri_version),
            other => panic!("expected RegisterPlugin, got {other:?}"),
        }
    }

    /// Register -> Configure, the way containerd 2.x does it.
    pub async fn handshake(&mut self, with_timeouts: bool) -> api::ConfigureResponse {
        self.expect_registered().await;
        let req = configure_request(with_timeouts);
        self.plugin.configure(ctx(), &req).await.expect("configure")
    }

    pub async fn send_raw(&self, bytes: &[u8]) {
        let _ = self.raw.lock().await.write_all(bytes).await;
    }

    /// Waits until the plugin closes the trunk.
    pub async fn wait_closed(&mut self) -> bool {
        tokio::time::timeout(TIMEOUT, self.closed.recv())
            .await
            .is_ok()
    }
}

/// Builds a kubelet-like pod and container as the runtime describes them.
pub fn pod(id: &str, parent: &str) -> api::PodSandbox {
    let mut linux = api::LinuxPodSandbox::new();
    linux.cgroup_parent = parent.into();
    api::PodSandbox {
        id: id.into(),
        name: format!("pod-{id}"),
        uid: format!("uid-{id}"),
        namespace: "default".into(),
        linux: protobuf::MessageField::some(linux),
        ..Default::default()
    }
}

pub fn container(
    id: &str,
    pod_id: &str,
    shares: u64,
    quota: i64,
    mem_limit: i64,
    oom: i64,
) -> api::Container {
    let mut cpu = api::LinuxCPU::new();
    cpu.shares = protobuf::MessageField::some(api::OptionalUInt64 {
        value: shares,
        ..Default::default()
    });
    cpu.quota = protobuf::MessageField::some(api::OptionalInt64 {
        value: quota,
        ..Default::default()
    });
    cpu.period = protobuf::MessageField::some(api::OptionalUInt64 {
        value: 100_000,
        ..Default::default()
    });
    let mut mem = api::LinuxMemory::new();
    mem.limit = protobuf::MessageField::some(api::OptionalInt64 {
        value: mem_limit,
        ..Default::default()
    });
    let mut res = api::LinuxResources::new();
    res.cpu = protobuf::MessageField::some(cpu);
    res.memory = protobuf::MessageField::some(mem);
    let mut linux = api::LinuxContainer::new();
    linux.resources = protobuf::MessageField::some(res);
    linux.oom_score_adj = protobuf::MessageField::some(api::OptionalInt {
        value: oom,
        ..Default::default()
    });
    linux.cgroups_path = format!("/kubepods/burstable/pod{pod_id}/{id}");
    let mut annotations = HashMap::new();
    annotations.insert(
        "io.kubernetes.cri.container-type".into(),
        "container".into(),
    );
    api::Container {
        id: id.into(),
        pod_sandbox_id: pod_id.into(),
        name: format!("ctr-{id}"),
        state: protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING),
        annotations,
        linux: protobuf::MessageField::some(linux),
        ..Default::default()
    }
}

/// A socket path in a fresh temp dir.
pub fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("nri.sock")
}

pub fn raw_fd_of(s: &std::os::unix::net::UnixStream) -> i32 {
    s.as_raw_fd()
}
