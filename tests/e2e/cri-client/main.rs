//! e2e CRI client: drives containerd's CRI service the way the kubelet/crictl
//! does, inside the e2e VM, and reports what the kernel really applied.
//!
//! Output lines meant for the harness have fixed prefixes:
//! - `E2E-RESULT {json}` one per container and phase, with the real cgroup values
//! - `E2E-CHECK <name> PASS|FAIL <details>` one per check
//! - `E2E-TIMING {json}` from `timing`
//!
//! Run `cri-client --help` for the commands.
// Tests, benches and tools cast small, known values; the cast lints guard
// the product code.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

mod cri;
mod manifest;
mod steps;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::Deserialize;
use serde_json::{json, Value};

use cri::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, DnsConfig, ImageSpec,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, RuntimeClient,
};

const DEFAULT_IMAGE: &str = "e2e.local/busybox:latest";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Files read from each container's cgroup directory.
const CGROUP_FILES: &[&str] = &[
    "cpu.weight",
    "cpu.max",
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.max",
    "memory.swap.max",
    "memory.oom.group",
];

#[derive(Parser)]
#[command(about = "CRI v1 client for the nri-qos e2e VM")]
struct Cli {
    /// the runtime's CRI socket (CRI-O: /var/run/crio/crio.sock)
    #[arg(
        long,
        env = "E2E_CRI_SOCKET",
        default_value = "/run/containerd/containerd.sock"
    )]
    socket: String,
    /// keep retrying the first connection for this many seconds
    #[arg(long, default_value_t = 60)]
    wait: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the runtime's CRI version
    Version,
    /// List pod sandboxes and containers
    List,
    /// Run a scenario file, print the real values and the checks
    Run {
        scenario: PathBuf,
        /// expected values: JSON object "pod/container" (or "container") -> {file: value}
        #[arg(long)]
        expect: Option<PathBuf>,
        /// when no expect entry exists for a container, check that the runtime
        /// applied the CRI request unchanged (the baseline without a plugin)
        #[arg(long)]
        expect_cri: bool,
        /// for pods given as manifests, check the values `nri-qos explain`
        /// predicts (a plugin runs); entries of --expect win
        #[arg(long)]
        expect_explain: bool,
        /// leave the pods running instead of stopping and removing them
        #[arg(long)]
        keep: bool,
    },
    /// Stop and remove every pod sandbox (after `run --keep`)
    Cleanup,
    /// Start N pods (RunPodSandbox + CreateContainer + StartContainer) and time them
    Timing {
        #[arg(long, default_value_t = 5)]
        pods: usize,
        #[arg(long, default_value = "/kubepods/besteffort")]
        parent: String,
        #[arg(long, default_value = DEFAULT_IMAGE)]
        image: String,
        /// tag for the E2E-TIMING line (e.g. "with" / "without" the plugin)
        #[arg(long, default_value = "")]
        label: String,
    },
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(deny_unknown_fields)]
struct Resources {
    #[serde(default)]
    cpu_shares: i64,
    #[serde(default)]
    cpu_quota: i64,
    #[serde(default)]
    cpu_period: i64,
    #[serde(default)]
    memory_limit: i64,
    /// when absent and `memory_request` is given, the kubelet's Burstable formula
    /// against this machine's MemTotal is used; otherwise 0
    #[serde(default)]
    oom_score_adj: Option<i64>,
    #[serde(default)]
    memory_request: Option<i64>,
    #[serde(default)]
    cpuset_cpus: String,
    #[serde(default)]
    unified: HashMap<String, String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct ContainerSpec {
    name: String,
    #[serde(default)]
    image: Option<String>,
    #[serde(default = "default_command")]
    command: Vec<String>,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    labels: HashMap<String, String>,
    #[serde(flatten)]
    resources: Resources,
    /// resources sent with UpdateContainerResources after start (phase "updated")
    #[serde(default)]
    update: Option<Resources>,
    /// bind mounts: {"container_path", "host_path", "readonly"}
    #[serde(default)]
    mounts: Vec<MountSpec>,
    /// manifest pods: expected values that differ from explain's prediction
    /// (e.g. a kubelet `unified` key the plugin leaves alone); `*`: reported,
    /// not checked (a value that depends on timing)
    #[serde(default)]
    expect: BTreeMap<String, String>,
    /// the same after the resize
    #[serde(default)]
    expect_updated: BTreeMap<String, String>,
    /// an init container: runs to completion before the next one starts
    #[serde(skip)]
    run_to_completion: bool,
    /// not started with its pod but by a `start` step
    #[serde(default)]
    deferred: bool,
}

impl Default for ContainerSpec {
    fn default() -> Self {
        ContainerSpec {
            name: String::new(),
            image: None,
            command: default_command(),
            annotations: HashMap::new(),
            labels: HashMap::new(),
            resources: Resources::default(),
            update: None,
            mounts: vec![],
            expect: BTreeMap::new(),
            expect_updated: BTreeMap::new(),
            run_to_completion: false,
            deferred: false,
        }
    }
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct MountSpec {
    container_path: String,
    host_path: String,
    #[serde(default)]
    readonly: bool,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct PodSpec {
    /// with a manifest: overrides its metadata.name
    #[serde(default)]
    name: String,
    /// with a manifest: overrides its metadata.uid
    #[serde(default)]
    uid: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    /// with a manifest: derived from the class and uid (and checked if given)
    #[serde(default)]
    cgroup_parent: String,
    /// a Kubernetes Pod manifest (path relative to the scenario file): the
    /// containers, their CRI resources and the cgroup parent are what the
    /// kubelet would send for it, the expected values what explain predicts
    #[serde(default)]
    manifest: Option<String>,
    /// the same pod resized in place: UpdateContainerResources with the
    /// kubelet's new values for every container whose values change
    #[serde(default)]
    resize_manifest: Option<String>,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    labels: HashMap<String, String>,
    /// pod-level resources (LinuxPodSandboxConfig.resources), as newer kubelets send
    #[serde(default)]
    resources: Option<Resources>,
    /// with a manifest with pod-level resources: the same pod resized at the
    /// pod level (KEP-5419), done after its containers started as the
    /// kubelet does it (pod cgroup, UpdatePodSandboxResources, then
    /// UpdateContainerResources where a container's values follow) and
    /// checked against explain's prediction for it (`@pod-resized`)
    #[serde(default)]
    pod_resize_manifest: Option<String>,
    /// the pod cgroup values the kubelet writes before RunPodSandbox
    /// (a manifest with pod-level resources)
    #[serde(skip)]
    pod_cgroup: BTreeMap<String, String>,
    #[serde(skip)]
    pod_resize: Option<PodResize>,
    /// with a manifest: per-container overrides (command, mounts, unified, expect)
    #[serde(default)]
    containers: Vec<ContainerSpec>,
}

/// What the kubelet does for a pod-level resize (from `pod_resize_manifest`).
#[derive(Debug, Clone)]
struct PodResize {
    /// UpdatePodSandboxResources' `resources`
    resources: Resources,
    /// the pod cgroup, written first
    pod_cgroup: BTreeMap<String, String>,
    /// UpdateContainerResources per container whose values change
    containers: BTreeMap<String, Resources>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    /// cgroups to create and write before any pod starts, as the kubelet does
    /// for /kubepods, the QoS classes and each pod (path -> file -> value)
    #[serde(default)]
    cgroups: BTreeMap<String, BTreeMap<String, String>>,
    pods: Vec<PodSpec>,
    /// proactive reclaim after all containers started (needs E2E_DISK in the VM)
    #[serde(default)]
    reclaim: Option<Reclaim>,
    /// files (path -> size in bytes, zeros) made by the node before any pod, then
    /// dropped from the page cache so that the containers reading them are charged
    #[serde(default)]
    files: BTreeMap<String, u64>,
    /// like `files`, but sparse: reading them fills the page cache without
    /// the (RAM-backed) disk holding any data
    #[serde(default)]
    sparse_files: BTreeMap<String, u64>,
    /// what happens after every pod started (see steps.rs)
    #[serde(default)]
    steps: Vec<steps::Step>,
    /// `api-server`: the plugin runs with the Kubernetes API source, so
    /// explain predicts with the manifests' exact requests
    /// (`nri-qos explain --request-source api-server`)
    #[serde(default)]
    request_source: Option<String>,
    /// the kubelet's `memorySwap.swapBehavior`: `LimitedSwap` gives
    /// Burstable containers memory.swap.max from the node's SwapTotal (the
    /// guest turns swap on first); absent: NoSwap (memory.swap.max 0)
    #[serde(default)]
    swap: Option<String>,
}

fn make_files(files: &BTreeMap<String, u64>, sparse: &BTreeMap<String, u64>) -> Result<()> {
    use std::io::Write as _;
    for (path, size) in sparse {
        std::fs::File::create(path)
            .and_then(|f| f.set_len(*size))
            .with_context(|| format!("creating sparse {path}"))?;
    }
    if files.is_empty() {
        return Ok(());
    }
    let chunk = vec![0u8; 1 << 20];
    for (path, size) in files {
        let mut f = std::fs::File::create(path).with_context(|| format!("creating {path}"))?;
        let mut left = *size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping caches")?;
    Ok(())
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Reclaim {
    /// cgroup whose memory.reclaim is written, e.g. /kubepods/burstable
    cgroup: String,
    /// what is written to memory.reclaim, e.g. "1G"
    amount: String,
    /// wait until every container's memory.current reaches this many bytes
    #[serde(default)]
    fill_bytes: u64,
    #[serde(default = "default_fill_timeout")]
    fill_timeout_s: u64,
    /// "pod/ctr" -> memory.current that must remain after the reclaim
    #[serde(default)]
    min_retained: BTreeMap<String, u64>,
    /// "pod/ctr" -> memory.current it may keep at most (proves reclaim happened)
    #[serde(default)]
    max_retained: BTreeMap<String, u64>,
}

fn default_fill_timeout() -> u64 {
    120
}

fn default_command() -> Vec<String> {
    vec!["/bin/sleep".into(), "3600".into()]
}

fn default_namespace() -> String {
    "default".into()
}

fn check(name: &str, ok: bool, details: &str) -> bool {
    println!(
        "E2E-CHECK {name} {} {details}",
        if ok { "PASS" } else { "FAIL" }
    );
    ok
}

fn mem_total_bytes() -> Result<i64> {
    meminfo_bytes("MemTotal")
}

/// A /proc/meminfo value in bytes.
fn meminfo_bytes(key: &str) -> Result<i64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
            let kb: i64 = rest.trim().trim_end_matches("kB").trim().parse()?;
            return Ok(kb * 1024);
        }
    }
    bail!("no {key} in /proc/meminfo")
}

/// kubelet pkg/kubelet/qos/policy.go GetContainerOOMScoreAdjust for Burstable.
fn kubelet_burstable_oom(memory_request: i64, capacity: i64) -> i64 {
    let adj = 1000 - (1000 * memory_request) / capacity;
    if adj < 1000 - 997 {
        return 1000 - 997;
    }
    if adj == 1000 {
        return 999;
    }
    adj
}

impl Resources {
    fn oom(&self) -> Result<i64> {
        Ok(match (self.oom_score_adj, self.memory_request) {
            (Some(v), _) => v,
            (None, Some(req)) => kubelet_burstable_oom(req, mem_total_bytes()?),
            (None, None) => 0,
        })
    }

    fn to_cri(&self) -> Result<LinuxContainerResources> {
        Ok(LinuxContainerResources {
            cpu_period: self.cpu_period,
            cpu_quota: self.cpu_quota,
            cpu_shares: self.cpu_shares,
            memory_limit_in_bytes: self.memory_limit,
            oom_score_adj: self.oom()?,
            cpuset_cpus: self.cpuset_cpus.clone(),
            unified: self.unified.clone(),
            ..Default::default()
        })
    }

    /// What runc writes for this CRI request when nobody changes it (cgroup v2).
    fn cri_baseline(&self) -> Result<BTreeMap<String, String>> {
        let mut m = BTreeMap::new();
        // runc: ConvertCPUSharesToCgroupV2Value
        let weight = if self.cpu_shares == 0 {
            100
        } else {
            1 + ((self.cpu_shares - 2) * 9999) / 262142
        };
        m.insert("cpu.weight".into(), weight.to_string());
        let period = if self.cpu_period == 0 {
            100000
        } else {
            self.cpu_period
        };
        let quota = if self.cpu_quota > 0 {
            self.cpu_quota.to_string()
        } else {
            "max".into()
        };
        m.insert("cpu.max".into(), format!("{quota} {period}"));
        m.insert(
            "memory.max".into(),
            if self.memory_limit > 0 {
                self.memory_limit.to_string()
            } else {
                "max".into()
            },
        );
        m.insert("oom_score_adj".into(), self.oom()?.to_string());
        for (k, v) in &self.unified {
            // the kernel keeps memory.swap.max in whole pages
            let v = match (k.as_str(), v.parse::<u64>()) {
                ("memory.swap.max", Ok(b)) => (b - b % 4096).to_string(),
                _ => v.clone(),
            };
            m.insert(k.clone(), v);
        }
        Ok(m)
    }
}

fn sandbox_config(pod: &PodSpec) -> Result<PodSandboxConfig> {
    let mut labels = pod.labels.clone();
    labels.insert("io.kubernetes.pod.name".into(), pod.name.clone());
    labels.insert("io.kubernetes.pod.namespace".into(), pod.namespace.clone());
    labels.insert("io.kubernetes.pod.uid".into(), pod.uid.clone());
    Ok(PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt: 0,
        }),
        // hostNetwork pods share the node's UTS namespace: the kubelet sends no hostname
        hostname: String::new(),
        log_directory: pod_log_dir(pod),
        dns_config: Some(DnsConfig::default()),
        labels,
        annotations: pod.annotations.clone(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: pod.cgroup_parent.clone(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(host_net()),
            }),
            overhead: None,
            resources: pod.resources.as_ref().map(|r| r.to_cri()).transpose()?,
        }),
    })
}

/// Host network (no CNI in the VM), private PID namespace, pod IPC: as the kubelet
/// does for a hostNetwork pod.
fn host_net() -> NamespaceOption {
    NamespaceOption {
        network: cri::NS_NODE,
        pid: cri::NS_CONTAINER,
        ipc: cri::NS_POD,
    }
}

fn pod_log_dir(pod: &PodSpec) -> String {
    format!("/var/log/pods/{}_{}_{}", pod.namespace, pod.name, pod.uid)
}

fn container_config(pod: &PodSpec, c: &ContainerSpec) -> Result<ContainerConfig> {
    // The kubelet creates the container's log directory; containerd would
    // create it too, CRI-O's conmon does not (CreateContainer: exit status 1).
    let log_dir = format!("{}/{}", pod_log_dir(pod), c.name);
    std::fs::create_dir_all(&log_dir).with_context(|| format!("mkdir {log_dir}"))?;
    let mut labels = c.labels.clone();
    labels.insert("io.kubernetes.container.name".into(), c.name.clone());
    labels.insert("io.kubernetes.pod.name".into(), pod.name.clone());
    labels.insert("io.kubernetes.pod.namespace".into(), pod.namespace.clone());
    labels.insert("io.kubernetes.pod.uid".into(), pod.uid.clone());
    Ok(ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: c.name.clone(),
            attempt: 0,
        }),
        image: Some({
            let image = c.image.clone().unwrap_or_else(|| DEFAULT_IMAGE.into());
            ImageSpec {
                user_specified_image: image.clone(),
                image,
            }
        }),
        command: c.command.clone(),
        args: vec![],
        mounts: c
            .mounts
            .iter()
            .map(|m| cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly,
            })
            .collect(),
        labels,
        annotations: c.annotations.clone(),
        log_path: format!("{}/0.log", c.name),
        linux: Some(LinuxContainerConfig {
            resources: Some(c.resources.to_cri()?),
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(host_net()),
            }),
        }),
    })
}

/// The container's init pid, from ContainerStatus(verbose).info["info"].pid.
async fn container_pid(client: &mut RuntimeClient, id: &str) -> Result<(i32, u32)> {
    let st = client.container_status(id).await?;
    let state = st.status.as_ref().map(|s| s.state).unwrap_or(-1);
    let info = st
        .info
        .get("info")
        .context("ContainerStatus(verbose) has no info")?;
    let v: Value = serde_json::from_str(info).context("parsing ContainerStatus info")?;
    let pid = v
        .get("pid")
        .and_then(Value::as_u64)
        .context("no pid in ContainerStatus info")?;
    Ok((state, pid as u32))
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("<{}>", e.kind()))
}

/// The real values the kernel holds for a process: its cgroup (v2) files, its
/// parent's (the pod cgroup, prefixed `pod:`), and its oom_score_adj.
fn read_values(pid: u32) -> Result<(String, BTreeMap<String, String>)> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let path = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .context("process is not in a cgroup v2 hierarchy")?
        .to_string();
    let dir = Path::new(CGROUP_ROOT).join(path.trim_start_matches('/'));
    let mut values = BTreeMap::new();
    for f in CGROUP_FILES {
        values.insert(f.to_string(), read_trim(&dir.join(f)));
    }
    if let Some(parent) = dir.parent() {
        for f in CGROUP_FILES {
            values.insert(format!("pod:{f}"), read_trim(&parent.join(f)));
        }
    }
    values.insert(
        "oom_score_adj".into(),
        read_trim(Path::new(&format!("/proc/{pid}/oom_score_adj"))),
    );
    Ok((path, values))
}

/// mkdir the cgroup (and its missing ancestors) with every available controller
/// delegated on the way down, then write the given files: the kubelet's job on
/// a real node. Paths are applied in sorted order, so parents come first.
fn precreate_cgroups(cgroups: &BTreeMap<String, BTreeMap<String, String>>) -> bool {
    let mut ok = true;
    for (path, files) in cgroups {
        let res: Result<()> = (|| {
            let mut dir = PathBuf::from(CGROUP_ROOT);
            for part in path.trim_matches('/').split('/').filter(|p| !p.is_empty()) {
                let controllers = std::fs::read_to_string(dir.join("cgroup.controllers"))?;
                let enable: Vec<String> = controllers
                    .split_whitespace()
                    .map(|c| format!("+{c}"))
                    .collect();
                std::fs::write(dir.join("cgroup.subtree_control"), enable.join(" "))
                    .with_context(|| format!("delegating controllers in {}", dir.display()))?;
                dir.push(part);
                if !dir.exists() {
                    std::fs::create_dir(&dir)
                        .with_context(|| format!("mkdir {}", dir.display()))?;
                }
            }
            Ok(())
        })();
        if let Err(e) = res {
            ok &= check(&format!("cgroup:{path}"), false, &format!("{e:#}"));
            continue;
        }
        let dir = Path::new(CGROUP_ROOT).join(path.trim_start_matches('/'));
        for (file, value) in files {
            let res = std::fs::write(dir.join(file), value);
            let got = read_trim(&dir.join(file));
            ok &= check(
                &format!("cgroup:{path}/{file}"),
                res.is_ok(),
                &format!(
                    "wrote {value:?}, reads {got:?} {}",
                    res.err().map(|e| e.to_string()).unwrap_or_default()
                ),
            );
        }
    }
    ok
}

fn value_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Expected-values file: `{"pod/ctr": {...}}`, `{"ctr": {...}}`, optionally
/// wrapped as `{"containers": {...}}`. Keys with `@updated` address the phase
/// after UpdateContainerResources.
fn load_expect(path: &Path) -> Result<serde_json::Map<String, Value>> {
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let v = match v.get("containers") {
        Some(inner) if inner.is_object() => inner.clone(),
        _ => v,
    };
    match v {
        Value::Object(m) => Ok(m),
        _ => bail!("{}: expected a JSON object", path.display()),
    }
}

struct Started {
    pod_id: String,
}

fn cgroup_dir(pid: u32) -> Result<PathBuf> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let path = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .context("process is not in a cgroup v2 hierarchy")?;
    Ok(Path::new(CGROUP_ROOT).join(path.trim_start_matches('/')))
}

fn memory_current(dir: &Path) -> u64 {
    read_trim(&dir.join("memory.current")).parse().unwrap_or(0)
}

/// Fill, then reclaim proactively, and report what every container kept: does
/// memory.min/low protect a container inside this cgroup tree?
async fn run_reclaim(r: &Reclaim, containers: &BTreeMap<String, u32>) -> Result<bool> {
    let dirs: BTreeMap<&String, PathBuf> = containers
        .iter()
        .map(|(k, pid)| Ok((k, cgroup_dir(*pid)?)))
        .collect::<Result<_>>()?;
    let deadline = Instant::now() + Duration::from_secs(r.fill_timeout_s);
    while dirs.values().any(|d| memory_current(d) < r.fill_bytes) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // let the writers finish their sync so the page cache is clean
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before: BTreeMap<&String, u64> =
        dirs.iter().map(|(k, d)| (*k, memory_current(d))).collect();
    let target = Path::new(CGROUP_ROOT)
        .join(r.cgroup.trim_start_matches('/'))
        .join("memory.reclaim");
    let t0 = Instant::now();
    let res = std::fs::write(&target, &r.amount);
    println!(
        "E2E-INFO reclaim {} from {} in {} ms: {}",
        r.amount,
        r.cgroup,
        t0.elapsed().as_millis(),
        match &res {
            Ok(()) => "all reclaimed".to_string(),
            Err(e) => format!("{e} (less was reclaimable)"),
        }
    );
    let mut ok = true;
    for (k, d) in &dirs {
        let after = memory_current(d);
        println!(
            "E2E-RECLAIM {}",
            json!({
                "key": k, "before": before[k], "after": after,
                "memory.min": read_trim(&d.join("memory.min")),
                "memory.low": read_trim(&d.join("memory.low")),
                "pod:memory.min": d.parent().map(|p| read_trim(&p.join("memory.min"))),
            })
        );
        if let Some(min) = r.min_retained.get(*k) {
            ok &= check(
                &format!("{k}.reclaim_retained"),
                after >= *min,
                &format!(
                    "memory.current {before} -> {after}, must keep >= {min}",
                    before = before[k]
                ),
            );
        }
        if let Some(max) = r.max_retained.get(*k) {
            ok &= check(
                &format!("{k}.reclaim_released"),
                after <= *max,
                &format!(
                    "memory.current {before} -> {after}, may keep <= {max}",
                    before = before[k]
                ),
            );
        }
    }
    Ok(ok)
}

#[allow(clippy::too_many_arguments)]
fn report_and_check(
    scenario: &str,
    pod: &PodSpec,
    c: &ContainerSpec,
    phase: &str,
    id: &str,
    pid: u32,
    requested: &Resources,
    expect: &Option<serde_json::Map<String, Value>>,
    expect_cri: bool,
) -> Result<bool> {
    let (cgroup, values) = read_values(pid)?;
    let key = format!("{}/{}", pod.name, c.name);
    let suffix = if phase == "started" {
        String::new()
    } else {
        format!("@{phase}")
    };
    println!(
        "E2E-RESULT {}",
        json!({
            "scenario": scenario,
            "key": format!("{key}{suffix}"),
            "pod": pod.name,
            "container": c.name,
            "phase": phase,
            "id": id,
            "pid": pid,
            "cgroup": cgroup,
            "requested": {
                "cpu_shares": requested.cpu_shares,
                "cpu_quota": requested.cpu_quota,
                "cpu_period": requested.cpu_period,
                "memory_limit": requested.memory_limit,
                "oom_score_adj": requested.oom()?,
                "unified": requested.unified,
            },
            "values": values,
        })
    );
    let mut ok = check(
        &format!("{key}{suffix}.cgroup_parent"),
        cgroup.starts_with(&format!("{}/", pod.cgroup_parent)),
        &format!("cgroup={cgroup} parent={}", pod.cgroup_parent),
    );
    let wanted: Option<BTreeMap<String, String>> = match expect.as_ref().and_then(|m| {
        m.get(&format!("{key}{suffix}"))
            .or_else(|| m.get(&format!("{}{suffix}", c.name)))
    }) {
        Some(Value::Object(w)) => Some(w.iter().map(|(k, v)| (k.clone(), value_str(v))).collect()),
        Some(other) => bail!("expected values for {key}{suffix} must be an object, got {other}"),
        None if expect_cri => Some(requested.cri_baseline()?),
        None => None,
    };
    match wanted {
        Some(w) => {
            for (field, want) in w {
                let got = values
                    .get(&field)
                    .cloned()
                    .unwrap_or_else(|| "<not read>".into());
                // A value that depends on timing is reported, not checked.
                if want == "*" {
                    println!("E2E-INFO {key}{suffix}.{field} = {got:?} (not checked)");
                    continue;
                }
                ok &= check(
                    &format!("{key}{suffix}.{field}"),
                    got == want,
                    &format!("got={got:?} want={want:?}"),
                );
            }
        }
        None => println!("E2E-INFO no expected values for {key}{suffix}: values reported only"),
    }
    Ok(ok)
}

async fn run_scenario(
    client: &mut RuntimeClient,
    path: &Path,
    expect: Option<PathBuf>,
    expect_cri: bool,
    expect_explain: bool,
    keep: bool,
) -> Result<bool> {
    let mut scenario: Scenario = serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let name = if scenario.name.is_empty() {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        scenario.name.clone()
    };
    println!("E2E-INFO scenario {name}: {}", scenario.description);
    let mut expect = match expect {
        Some(p) if p.exists() => Some(load_expect(&p)?),
        Some(p) => {
            println!("E2E-INFO no expected-values file {}", p.display());
            None
        }
        None => None,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mem_total = mem_total_bytes()? as u64;
    let api_server = match scenario.request_source.as_deref() {
        None | Some("runtime") => false,
        Some("api-server") => true,
        Some(other) => anyhow::bail!("{name}: request_source {other:?} (api-server or runtime)"),
    };
    let swap = match scenario.swap.as_deref() {
        None | Some("NoSwap") => manifest::Swap::NoSwap,
        Some("LimitedSwap") => manifest::Swap::Limited {
            swap_total: meminfo_bytes("SwapTotal")? as u64,
        },
        Some(other) => anyhow::bail!("{name}: swap {other:?} (LimitedSwap or NoSwap)"),
    };
    for pod in &mut scenario.pods {
        let predicted = manifest::expand(pod, dir, mem_total, api_server, swap)
            .with_context(|| format!("scenario {name}, pod {}", pod.name))?;
        if !expect_explain {
            continue;
        }
        let m = expect.get_or_insert_with(Default::default);
        for (key, values) in predicted {
            // An entry of the --expect file wins over the prediction.
            if !m.contains_key(&key) {
                m.insert(key, json!(values));
            }
        }
    }
    let mut all_ok = precreate_cgroups(&scenario.cgroups);
    if let Err(e) = make_files(&scenario.files, &scenario.sparse_files) {
        all_ok &= check(&format!("{name}.files"), false, &format!("{e:#}"));
    }
    let mut started = Vec::new();
    let mut pids: BTreeMap<String, u32> = BTreeMap::new();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    let mut sandboxes: BTreeMap<String, (String, PodSandboxConfig)> = BTreeMap::new();
    let oom_kills_before = steps::kernel_oom_kills();
    for pod in &scenario.pods {
        let t0 = Instant::now();
        if !pod.pod_cgroup.is_empty() {
            // the kubelet makes the pod cgroup with its pod-level limits first
            let cg = BTreeMap::from([(pod.cgroup_parent.clone(), pod.pod_cgroup.clone())]);
            all_ok &= precreate_cgroups(&cg);
        }
        let cfg = sandbox_config(pod)?;
        let pod_id = match client.run_pod_sandbox(cfg.clone()).await {
            Ok(id) => id,
            Err(e) => {
                all_ok &= check(
                    &format!("{}.run_pod_sandbox", pod.name),
                    false,
                    &format!("{e:#}"),
                );
                continue;
            }
        };
        started.push(Started {
            pod_id: pod_id.clone(),
        });
        sandboxes.insert(pod.name.clone(), (pod_id.clone(), cfg.clone()));
        for c in &pod.containers {
            let key = format!("{}/{}", pod.name, c.name);
            if c.deferred {
                continue;
            }
            let res = create_and_start(client, pod, c, &pod_id, &cfg).await;
            let (id, pid) = match res {
                Ok(x) => x,
                Err(e) => {
                    all_ok &= check(&format!("{key}.started"), false, &format!("{e:#}"));
                    continue;
                }
            };
            if c.run_to_completion {
                check(
                    &format!("{key}.completed"),
                    true,
                    &format!(
                        "init container exited 0 after {} ms",
                        t0.elapsed().as_millis()
                    ),
                );
                continue;
            }
            check(
                &format!("{key}.started"),
                true,
                &format!("pid={pid} after {} ms", t0.elapsed().as_millis()),
            );
            pids.insert(key.clone(), pid);
            ids.insert(key.clone(), id.clone());
            all_ok &= report_and_check(
                &name,
                pod,
                c,
                "started",
                &id,
                pid,
                &c.resources,
                &expect,
                expect_cri,
            )?;
            if let Some(upd) = &c.update {
                match client.update_container_resources(&id, upd.to_cri()?).await {
                    Ok(()) => {
                        all_ok &= report_and_check(
                            &name, pod, c, "updated", &id, pid, upd, &expect, expect_cri,
                        )?;
                    }
                    Err(e) => {
                        all_ok &= check(&format!("{key}.update"), false, &format!("{e:#}"));
                    }
                }
            }
        }
        if let Some(r) = &pod.pod_resize {
            let running = Running {
                ids: &ids,
                pids: &pids,
            };
            all_ok &= resize_pod(client, &name, pod, r, &pod_id, running, &expect).await?;
        }
    }
    if !scenario.steps.is_empty() {
        let mut ctx = steps::Context {
            client,
            pods: &scenario.pods,
            sandboxes: &sandboxes,
            ids: &mut ids,
            pids: &mut pids,
            oom_kills_before,
            finished: BTreeMap::new(),
        };
        for step in &scenario.steps {
            all_ok &= ctx.run(step).await?;
        }
    }
    if let Some(r) = &scenario.reclaim {
        all_ok &= run_reclaim(r, &pids).await?;
    }
    let listed = client.list_containers().await?;
    println!(
        "E2E-INFO {} containers, {} sandboxes listed",
        listed.len(),
        client.list_pod_sandboxes().await?.len()
    );
    if !keep {
        let mut errors = Vec::new();
        for s in &started {
            if let Err(e) = client.stop_pod_sandbox(&s.pod_id).await {
                errors.push(format!("stop {}: {e:#}", s.pod_id));
            } else if let Err(e) = client.remove_pod_sandbox(&s.pod_id).await {
                errors.push(format!("remove {}: {e:#}", s.pod_id));
            }
        }
        let left = client.list_pod_sandboxes().await?.len();
        all_ok &= check(
            &format!("{name}.cleanup"),
            errors.is_empty() && left == 0,
            &format!("{} sandboxes left {}", left, errors.join("; ")),
        );
    }
    Ok(all_ok)
}

/// The running containers of a scenario ("pod/ctr" -> id, pid).
struct Running<'a> {
    ids: &'a BTreeMap<String, String>,
    pids: &'a BTreeMap<String, u32>,
}

/// A pod-level resize the way the kubelet actuates an increase (KEP-5419):
/// the pod cgroup first, then UpdatePodSandboxResources (after the pod
/// cgroup, as KEP-1287 has it; the runtime tells its NRI plugins), then
/// UpdateContainerResources for each container whose values follow the
/// pod's. The values after the sandbox update alone are reported
/// (`@pod-updated`); those at the end are checked (`@pod-resized`).
async fn resize_pod(
    client: &mut RuntimeClient,
    scenario: &str,
    pod: &PodSpec,
    r: &PodResize,
    pod_id: &str,
    running: Running<'_>,
    expect: &Option<serde_json::Map<String, Value>>,
) -> Result<bool> {
    let mut ok = precreate_cgroups(&BTreeMap::from([(
        pod.cgroup_parent.clone(),
        r.pod_cgroup.clone(),
    )]));
    let started = Instant::now();
    let sandbox = client
        .update_pod_sandbox_resources(pod_id, r.resources.to_cri()?)
        .await;
    ok &= check(
        &format!("{}.update_pod_sandbox_resources", pod.name),
        sandbox.is_ok(),
        &match &sandbox {
            Ok(()) => format!("answered in {} ms", started.elapsed().as_millis()),
            Err(e) => format!("{e:#}"),
        },
    );
    let containers = pod.containers.iter().filter(|c| !c.run_to_completion);
    let phases: [(&str, &Option<serde_json::Map<String, Value>>); 2] =
        [("pod-updated", &None), ("pod-resized", expect)];
    for (phase, expect) in phases {
        if phase == "pod-resized" {
            for (ctr, upd) in &r.containers {
                let key = format!("{}/{ctr}", pod.name);
                let Some(id) = running.ids.get(&key) else {
                    continue;
                };
                if let Err(e) = client.update_container_resources(id, upd.to_cri()?).await {
                    ok &= check(&format!("{key}.update"), false, &format!("{e:#}"));
                }
            }
        }
        for c in containers.clone() {
            let key = format!("{}/{}", pod.name, c.name);
            let (Some(id), Some(pid)) = (running.ids.get(&key), running.pids.get(&key)) else {
                continue;
            };
            let requested = r.containers.get(&c.name).unwrap_or(&c.resources);
            ok &= report_and_check(scenario, pod, c, phase, id, *pid, requested, expect, false)?;
        }
    }
    Ok(ok)
}

/// CreateContainer + StartContainer; the pid of a running container, 0 for
/// an init container that ran to completion.
async fn create_and_start(
    client: &mut RuntimeClient,
    pod: &PodSpec,
    c: &ContainerSpec,
    pod_id: &str,
    cfg: &PodSandboxConfig,
) -> Result<(String, u32)> {
    let id = client
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.to_string(),
            config: Some(container_config(pod, c)?),
            sandbox_config: Some(cfg.clone()),
        })
        .await?;
    client.start_container(&id).await?;
    if c.run_to_completion {
        wait_exited(client, &id).await?;
        return Ok((id, 0));
    }
    let (state, pid) = container_pid(client, &id).await?;
    if state != cri::CONTAINER_RUNNING {
        bail!("container state {state} after start");
    }
    Ok((id, pid))
}

/// Waits for an init container to exit 0, as the kubelet does before it
/// starts the next container.
async fn wait_exited(client: &mut RuntimeClient, id: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = client.container_status(id).await?;
        if let Some(s) = st
            .status
            .as_ref()
            .filter(|s| s.state == cri::CONTAINER_EXITED)
        {
            if s.exit_code != 0 {
                bail!("init container exited with {}", s.exit_code);
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("init container still running after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn timing(
    client: &mut RuntimeClient,
    pods: usize,
    parent: &str,
    image: &str,
    label: &str,
) -> Result<bool> {
    let mut per_pod = Vec::new();
    let mut ids = Vec::new();
    let total = Instant::now();
    for i in 0..pods {
        let t0 = Instant::now();
        let pod = PodSpec {
            name: format!("timing-{i}"),
            uid: format!("00000000-0000-4000-8000-{i:012}"),
            namespace: "default".into(),
            cgroup_parent: format!("{parent}/pod00000000-0000-4000-8000-{i:012}"),
            annotations: HashMap::new(),
            labels: HashMap::new(),
            resources: None,
            manifest: None,
            resize_manifest: None,
            pod_resize_manifest: None,
            pod_cgroup: BTreeMap::new(),
            pod_resize: None,
            containers: vec![ContainerSpec {
                name: "app".into(),
                image: Some(image.into()),
                resources: Resources {
                    cpu_shares: 2,
                    oom_score_adj: Some(1000),
                    ..Default::default()
                },
                ..Default::default()
            }],
        };
        let cfg = sandbox_config(&pod)?;
        let pod_id = client.run_pod_sandbox(cfg.clone()).await?;
        ids.push(pod_id.clone());
        let id = client
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod_id,
                config: Some(container_config(&pod, &pod.containers[0])?),
                sandbox_config: Some(cfg),
            })
            .await?;
        client.start_container(&id).await?;
        per_pod.push(t0.elapsed().as_millis() as u64);
    }
    let start_ms = total.elapsed().as_millis() as u64;
    let t1 = Instant::now();
    for id in &ids {
        client.stop_pod_sandbox(id).await?;
        client.remove_pod_sandbox(id).await?;
    }
    let cleanup_ms = t1.elapsed().as_millis() as u64;
    println!(
        "E2E-TIMING {}",
        json!({"label": label, "pods": pods, "start_total_ms": start_ms, "per_pod_ms": per_pod, "cleanup_total_ms": cleanup_ms})
    );
    let name = if label.is_empty() {
        "timing".to_string()
    } else {
        format!("timing.{label}")
    };
    Ok(check(
        &name,
        true,
        &format!("{pods} pods started in {start_ms} ms, removed in {cleanup_ms} ms"),
    ))
}

async fn connect(socket: &str, wait: u64) -> Result<RuntimeClient> {
    let deadline = Instant::now() + Duration::from_secs(wait);
    loop {
        let attempt = async {
            let mut c = RuntimeClient::connect(socket).await?;
            let v = c.version().await?;
            Ok::<_, anyhow::Error>((c, v))
        }
        .await;
        match attempt {
            Ok((c, v)) => {
                println!(
                    "E2E-INFO runtime {} {} (CRI {})",
                    v.runtime_name, v.runtime_version, v.runtime_api_version
                );
                return Ok(c);
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut client = connect(&cli.socket, cli.wait).await?;
    let ok = match cli.cmd {
        Cmd::Version => true,
        Cmd::List => {
            for p in client.list_pod_sandboxes().await? {
                println!("sandbox {} {:?} state={}", p.id, p.metadata, p.state);
            }
            for c in client.list_containers().await? {
                println!(
                    "container {} pod={} {:?} state={}",
                    c.id, c.pod_sandbox_id, c.metadata, c.state
                );
            }
            true
        }
        Cmd::Run {
            scenario,
            expect,
            expect_cri,
            expect_explain,
            keep,
        } => {
            run_scenario(
                &mut client,
                &scenario,
                expect,
                expect_cri,
                expect_explain,
                keep,
            )
            .await?
        }
        Cmd::Timing {
            pods,
            parent,
            image,
            label,
        } => timing(&mut client, pods, &parent, &image, &label).await?,
        Cmd::Cleanup => {
            let mut errors = Vec::new();
            for p in client.list_pod_sandboxes().await? {
                if let Err(e) = client.stop_pod_sandbox(&p.id).await {
                    errors.push(format!("stop {}: {e:#}", p.id));
                } else if let Err(e) = client.remove_pod_sandbox(&p.id).await {
                    errors.push(format!("remove {}: {e:#}", p.id));
                }
            }
            let left = client.list_pod_sandboxes().await?.len();
            check(
                "cleanup",
                errors.is_empty() && left == 0,
                &format!("{left} sandboxes left {}", errors.join("; ")),
            )
        }
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burstable_oom_matches_kubelet() {
        // 256Mi of a 2000 MiB machine
        assert_eq!(kubelet_burstable_oom(256 << 20, 2000 << 20), 872);
        assert_eq!(kubelet_burstable_oom(0, 2000 << 20), 999);
        assert_eq!(kubelet_burstable_oom(2000 << 20, 2000 << 20), 3);
    }

    #[test]
    fn cri_baseline_matches_runc_conversion() {
        let r = Resources {
            cpu_shares: 256,
            cpu_quota: 50000,
            cpu_period: 100000,
            memory_limit: 268435456,
            oom_score_adj: Some(500),
            ..Default::default()
        };
        let b = r.cri_baseline().unwrap();
        assert_eq!(b["cpu.weight"], "10");
        assert_eq!(b["cpu.max"], "50000 100000");
        assert_eq!(b["memory.max"], "268435456");
        let be = Resources {
            cpu_shares: 2,
            ..Default::default()
        };
        assert_eq!(be.cri_baseline().unwrap()["cpu.weight"], "1");
        assert_eq!(be.cri_baseline().unwrap()["cpu.max"], "max 100000");
    }
}
