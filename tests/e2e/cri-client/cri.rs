//! The subset of the CRI v1 API (`runtime.v1`, k8s.io/cri-api) that the e2e
//! client needs, written by hand as prost messages so that building the example
//! needs no `protoc`. Field numbers are copied from cri-api's `api.proto`;
//! fields we never set or read are simply absent (prost skips unknown fields).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DnsConfig {
    #[prost(string, repeated, tag = "1")]
    pub servers: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub searches: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub options: Vec<String>,
}

/// `NamespaceMode`: POD = 0, CONTAINER = 1, NODE = 2, TARGET = 3.
pub const NS_POD: i32 = 0;
pub const NS_CONTAINER: i32 = 1;
pub const NS_NODE: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    #[prost(int32, tag = "1")]
    pub network: i32,
    #[prost(int32, tag = "2")]
    pub pid: i32,
    #[prost(int32, tag = "3")]
    pub ipc: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
    #[prost(message, optional, tag = "4")]
    pub overhead: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "5")]
    pub resources: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, optional, tag = "4")]
    pub dns_config: Option<DnsConfig>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    /// The name as the user wrote it (the kubelet sends it); CRI-O refuses
    /// CreateContainer without it ("cannot verify image signature").
    #[prost(string, tag = "18")]
    pub user_specified_image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub readonly: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerResources {
    #[prost(int64, tag = "1")]
    pub cpu_period: i64,
    #[prost(int64, tag = "2")]
    pub cpu_quota: i64,
    #[prost(int64, tag = "3")]
    pub cpu_shares: i64,
    #[prost(int64, tag = "4")]
    pub memory_limit_in_bytes: i64,
    #[prost(int64, tag = "5")]
    pub oom_score_adj: i64,
    #[prost(string, tag = "6")]
    pub cpuset_cpus: String,
    #[prost(string, tag = "7")]
    pub cpuset_mems: String,
    #[prost(map = "string, string", tag = "9")]
    pub unified: HashMap<String, String>,
    #[prost(int64, tag = "10")]
    pub memory_swap_limit_in_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerSecurityContext {
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub resources: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<Mount>,
    #[prost(map = "string, string", tag = "9")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "10")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "11")]
    pub log_path: String,
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// seconds before SIGKILL
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

/// Start/Remove container requests share this shape (`container_id = 1`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerIdRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

/// `ContainerState`: CREATED = 0, RUNNING = 1, EXITED = 2, UNKNOWN = 3.
pub const CONTAINER_RUNNING: i32 = 1;
pub const CONTAINER_EXITED: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "6")]
    pub finished_at: i64,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(string, tag = "11")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdateContainerResourcesRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(message, optional, tag = "2")]
    pub linux: Option<LinuxContainerResources>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
}

/// KEP-1287/5419: what the kubelet sends after it reconfigured a pod's
/// cgroup for a pod-level resize (containerd 2.3 passes it to NRI plugins as
/// UpdatePodSandbox / PostUpdatePodSandbox).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdatePodSandboxResourcesRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub overhead: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "3")]
    pub resources: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(int32, tag = "6")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

/// Longest a CRI call may take, as crictl's `timeout` in the guest's
/// crictl.yaml: far above a slow VM's seconds, far below the VM's timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A CRI `RuntimeService` client over a unix socket, the way crictl talks to
/// containerd.
pub struct RuntimeClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl RuntimeClient {
    pub async fn connect(socket: &str) -> Result<Self> {
        let path = socket.to_string();
        let channel =
            Endpoint::try_from("http://[::]:50051")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .with_context(|| format!("connecting to {socket}"))?;
        Ok(Self {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    async fn unary<Req, Resp>(&mut self, method: &'static str, req: Req) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        // A runtime that hangs (a deadlock inside it, say) must fail this
        // call with its name, not leave the VM to its overall timeout.
        let call = async {
            self.grpc.ready().await.context("CRI channel not ready")?;
            let path = PathAndQuery::from_static(method);
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            self.grpc
                .unary(tonic::Request::new(req), path, codec)
                .await
                .map_err(|s| anyhow::anyhow!("{method}: {} ({:?})", s.message(), s.code()))
        };
        let resp = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{method}: no answer from the runtime within {} s (is it hung?)",
                    CALL_TIMEOUT.as_secs()
                )
            })??;
        Ok(resp.into_inner())
    }

    pub async fn version(&mut self) -> Result<VersionResponse> {
        self.unary(
            "/runtime.v1.RuntimeService/Version",
            VersionRequest {
                version: "v1".into(),
            },
        )
        .await
    }

    pub async fn run_pod_sandbox(&mut self, config: PodSandboxConfig) -> Result<String> {
        let r: RunPodSandboxResponse = self
            .unary(
                "/runtime.v1.RuntimeService/RunPodSandbox",
                RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                },
            )
            .await?;
        Ok(r.pod_sandbox_id)
    }

    /// Stops the pod as the kubelet does: its containers first (StopContainer,
    /// no grace period), then the sandbox. containerd's StopPodSandbox kills
    /// the containers itself; CRI-O's waits out their stop timeout first.
    pub async fn stop_pod_sandbox(&mut self, id: &str) -> Result<()> {
        for c in self.list_containers().await? {
            if c.pod_sandbox_id == id && c.state != CONTAINER_EXITED {
                let _: Empty = self
                    .unary(
                        "/runtime.v1.RuntimeService/StopContainer",
                        StopContainerRequest {
                            container_id: c.id,
                            timeout: 0,
                        },
                    )
                    .await?;
            }
        }
        let _: Empty = self
            .unary(
                "/runtime.v1.RuntimeService/StopPodSandbox",
                PodSandboxIdRequest {
                    pod_sandbox_id: id.into(),
                },
            )
            .await?;
        Ok(())
    }

    pub async fn remove_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let _: Empty = self
            .unary(
                "/runtime.v1.RuntimeService/RemovePodSandbox",
                PodSandboxIdRequest {
                    pod_sandbox_id: id.into(),
                },
            )
            .await?;
        Ok(())
    }

    pub async fn create_container(&mut self, req: CreateContainerRequest) -> Result<String> {
        let r: CreateContainerResponse = self
            .unary("/runtime.v1.RuntimeService/CreateContainer", req)
            .await?;
        Ok(r.container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<()> {
        let _: Empty = self
            .unary(
                "/runtime.v1.RuntimeService/StartContainer",
                ContainerIdRequest {
                    container_id: id.into(),
                },
            )
            .await?;
        Ok(())
    }

    pub async fn container_status(&mut self, id: &str) -> Result<ContainerStatusResponse> {
        self.unary(
            "/runtime.v1.RuntimeService/ContainerStatus",
            ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            },
        )
        .await
    }

    pub async fn update_container_resources(
        &mut self,
        id: &str,
        linux: LinuxContainerResources,
    ) -> Result<()> {
        let _: Empty = self
            .unary(
                "/runtime.v1.RuntimeService/UpdateContainerResources",
                UpdateContainerResourcesRequest {
                    container_id: id.into(),
                    linux: Some(linux),
                    annotations: HashMap::new(),
                },
            )
            .await?;
        Ok(())
    }

    pub async fn update_pod_sandbox_resources(
        &mut self,
        pod_sandbox_id: &str,
        resources: LinuxContainerResources,
    ) -> Result<()> {
        let _: Empty = self
            .unary(
                "/runtime.v1.RuntimeService/UpdatePodSandboxResources",
                UpdatePodSandboxResourcesRequest {
                    pod_sandbox_id: pod_sandbox_id.into(),
                    overhead: None,
                    resources: Some(resources),
                },
            )
            .await?;
        Ok(())
    }

    pub async fn list_containers(&mut self) -> Result<Vec<Container>> {
        let r: ListContainersResponse = self
            .unary(
                "/runtime.v1.RuntimeService/ListContainers",
                ListContainersRequest {},
            )
            .await?;
        Ok(r.containers)
    }

    pub async fn list_pod_sandboxes(&mut self) -> Result<Vec<PodSandbox>> {
        let r: ListPodSandboxResponse = self
            .unary(
                "/runtime.v1.RuntimeService/ListPodSandbox",
                ListPodSandboxRequest {},
            )
            .await?;
        Ok(r.items)
    }
}
