//! The Kubernetes API source against a REAL API server: Debian's etcd and
//! kube-apiserver v1.36.2 on loopback (the envtest pattern: no scheduler,
//! controllers or kubelet), in RBAC mode, with nri-qos authenticated as the
//! DaemonSet's service account bound to the DaemonSet's own ClusterRole.
//!
//! Binaries: `NRI_QOS_KUBE_APISERVER`, else `../shared/tools/bin/kube-apiserver.xz`
//! beside the repository (unpacked here); etcd and kubectl from
//! `tests/kube/fetch.sh` (`$E2E_CACHE` or `tests/e2e/cache`), or
//! `NRI_QOS_ETCD` / `NRI_QOS_KUBECTL`. Without them the test says so and passes.
//!
//! One API server for the whole binary, and one test function: the steps
//! share it and one of them restarts it.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests, benches and tools cast small, known values; the cast lints guard
// the product code.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as ApiEvent, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use nri_qos::evict::rank::{self, Candidate, RankPolicy};
use nri_qos::kube::{Credentials, Kube, PodStore};
use nri_qos::node::cluster::{ClusterEvictions, EvictOutcome, EvictionNotice, EvictionReason};
use nri_qos::node::registry::PodRegistry;
use nri_qos::qos::QosClass;
use serde_json::json;

const NODE: &str = "node-a";
const NS: &str = "shop";
const SA_USER: &str = "system:serviceaccount:kube-system:nri-qos";
const MI: u64 = 1 << 20;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A binary from an environment variable, else the first existing path.
fn find(var: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).map(PathBuf::from) {
        return p.exists().then_some(p);
    }
    candidates.iter().find(|p| p.exists()).cloned()
}

fn cache() -> PathBuf {
    std::env::var_os("E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("tests/e2e/cache"))
}

fn apiserver_binary(dir: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NRI_QOS_KUBE_APISERVER").map(PathBuf::from) {
        return p.exists().then_some(p);
    }
    let xz = repo().join("../shared/tools/bin/kube-apiserver.xz");
    if !xz.exists() {
        return None;
    }
    let out = dir.join("kube-apiserver");
    let file = std::fs::File::create(&out).ok()?;
    let ok = Command::new("xz")
        .arg("-dc")
        .arg(&xz)
        .stdout(file)
        .status()
        .ok()?
        .success();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).ok()?;
    ok.then_some(out)
}

struct Cluster {
    dir: tempfile::TempDir,
    etcd: Child,
    apiserver: Option<Child>,
    apiserver_bin: PathBuf,
    apiserver_args: Vec<String>,
    port: u16,
    etcd_port: u16,
    admin: PathBuf,
    plugin: PathBuf,
    kubectl: Option<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(a) = self.apiserver.as_mut() {
            let _ = a.kill();
            let _ = a.wait();
        }
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

fn kubeconfig(path: &Path, port: u16, ca: &str, token: &str) {
    use std::io::Write;
    let b64 = base64(ca.as_bytes());
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {b64}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: t, user: u}}\ncurrent-context: c\n"
    );
    std::fs::File::create(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Cluster {
    fn start() -> Result<Cluster, String> {
        let dir = tempfile::tempdir().unwrap();
        let etcd_bin = find(
            "NRI_QOS_ETCD",
            &[cache().join("root-etcd-server/usr/bin/etcd")],
        )
        .ok_or("no etcd (run tests/kube/fetch.sh, or set NRI_QOS_ETCD)")?;
        let apiserver_bin = apiserver_binary(dir.path()).ok_or(
            "no kube-apiserver (../shared/tools/bin/kube-apiserver.xz, or set NRI_QOS_KUBE_APISERVER)",
        )?;
        let kubectl = find(
            "NRI_QOS_KUBECTL",
            &[cache().join("root-kubectl/usr/bin/kubectl")],
        );

        // Serving certificate from a test CA; the service-account key.
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params.signed_by(&key, &issuer).unwrap();
        let sa_key = KeyPair::generate().unwrap();
        let d = dir.path();
        std::fs::write(d.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(d.join("tls.key"), key.serialize_pem()).unwrap();
        std::fs::write(d.join("sa.key"), sa_key.serialize_pem()).unwrap();
        std::fs::write(d.join("sa.pub"), sa_key.public_key_pem()).unwrap();
        // The admin bypasses RBAC (system:masters); the plugin is the
        // DaemonSet's service account, so RBAC decides everything it does.
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "admin-token,admin,admin-uid,\"system:masters\"\nplugin-token,{SA_USER},sa-uid,\"system:serviceaccounts,system:serviceaccounts:kube-system\"\n"
            ),
        )
        .unwrap();

        let (client_port, peer_port, port) = (free_port(), free_port(), free_port());
        let etcd = Command::new(&etcd_bin)
            .args([
                "--name",
                "t",
                "--data-dir",
                d.join("etcd").to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &format!("t=http://127.0.0.1:{peer_port}"),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("etcd.log")).unwrap())
            .spawn()
            .map_err(|e| format!("etcd: {e}"))?;
        let p = |name: &str| d.join(name).to_str().unwrap().to_string();
        let apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", p("tls.crt")),
            format!("--tls-private-key-file={}", p("tls.key")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-issuer=https://127.0.0.1:{port}"),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", p("certs")),
        ];
        let mut c = Cluster {
            admin: d.join("admin.kubeconfig"),
            plugin: d.join("plugin.kubeconfig"),
            dir,
            etcd,
            apiserver: None,
            apiserver_bin,
            apiserver_args,
            port,
            etcd_port: client_port,
            kubectl,
        };
        kubeconfig(&c.admin, port, &ca_cert.pem(), "admin-token");
        kubeconfig(&c.plugin, port, &ca_cert.pem(), "plugin-token");
        c.start_apiserver()?;
        Ok(c)
    }

    fn start_apiserver(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("apiserver.log"))
            .unwrap();
        let child = Command::new(&self.apiserver_bin)
            .args(&self.apiserver_args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("kube-apiserver: {e}"))?;
        self.apiserver = Some(child);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            let exited = self
                .apiserver
                .as_mut()
                .and_then(|a| a.try_wait().ok().flatten());
            if exited.is_some() {
                break;
            }
            if self.kubectl_ok(&["get", "--raw", "/readyz"]) || self.ready_without_kubectl() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let log =
            std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default();
        let tail = &log[log.len().saturating_sub(3000)..];
        panic!("kube-apiserver not ready (exited or 60 s passed); its log ends:\n{tail}")
    }

    fn ready_without_kubectl(&self) -> bool {
        self.kubectl.is_none()
            && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && {
                std::thread::sleep(Duration::from_secs(3));
                true
            }
    }

    fn stop_apiserver(&mut self) {
        if let Some(mut a) = self.apiserver.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    fn kubectl_ok(&self, args: &[&str]) -> bool {
        self.kubectl_as(&self.admin, args).0
    }

    fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
        let Some(k) = &self.kubectl else {
            return (false, String::new());
        };
        match Command::new(k)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
        {
            Ok(o) => (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).trim().to_string(),
            ),
            Err(_) => (false, String::new()),
        }
    }
}

async fn client(kubeconfig: &Path) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn container(name: &str, req: Option<&str>, lim: Option<&str>) -> serde_json::Value {
    let mut resources = json!({});
    if let Some(r) = req {
        resources["requests"] = json!({"memory": r, "cpu": "100m"});
    }
    if let Some(l) = lim {
        resources["limits"] = json!({"memory": l, "cpu": "100m"});
    }
    json!({"name": name, "image": "busybox", "resources": resources})
}

fn pod(name: &str, node: &str, spec: serde_json::Value) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    let labels = spec
        .as_object_mut()
        .unwrap()
        .remove("labels")
        .unwrap_or(json!({}));
    let annotations = spec
        .as_object_mut()
        .unwrap()
        .remove("annotations")
        .unwrap_or(json!({}));
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

/// The DaemonSet file's ClusterRole and binding, applied as they are.
async fn apply_rbac(admin: &Client) {
    let text = std::fs::read_to_string(repo().join("config/kubernetes/daemonset.yaml")).unwrap();
    use serde::Deserialize;
    for de in serde_norway::Deserializer::from_str(&text) {
        let doc = serde_json::Value::deserialize(de).unwrap();
        match doc["kind"].as_str() {
            Some("ClusterRole") => {
                let r: ClusterRole = serde_json::from_value(doc).unwrap();
                Api::<ClusterRole>::all(admin.clone())
                    .create(&PostParams::default(), &r)
                    .await
                    .unwrap();
            }
            Some("ClusterRoleBinding") => {
                let b: ClusterRoleBinding = serde_json::from_value(doc).unwrap();
                Api::<ClusterRoleBinding>::all(admin.clone())
                    .create(&PostParams::default(), &b)
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
}

/// The kubelet's `rankMemoryPressure` (exceedMemoryRequests, priority,
/// memory above request), written from its description, not our code;
/// critical pods removed first as `evictPod` refuses them.
fn kubelet_order(cands: &[Candidate]) -> Vec<String> {
    let mut v: Vec<&Candidate> = cands
        .iter()
        .filter(|c| !c.static_pod && c.priority.unwrap_or(0) < 2_000_000_000)
        .collect();
    v.sort_by(|a, b| {
        let exceeds = |c: &Candidate| c.working_set > c.request;
        exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.unwrap_or(0).cmp(&b.priority.unwrap_or(0)))
            .then(
                (b.working_set as i128 - b.request as i128)
                    .cmp(&(a.working_set as i128 - a.request as i128)),
            )
            .then(a.uid.cmp(&b.uid))
    });
    v.into_iter().map(|c| c.uid.clone()).collect()
}

fn notice(f: &nri_qos::kube::ApiPodFacts, hard: bool) -> EvictionNotice {
    EvictionNotice {
        uid: f.uid.clone(),
        namespace: f.namespace.clone(),
        name: f.name.clone(),
        reason: EvictionReason::NodePressure {
            hard,
            available: 80 * MI,
            signal: "memory.available".into(),
            threshold: 100 * MI,
        },
        working_set: 700 * MI,
        request: f.memory_request,
        request_source: "api-server".into(),
    }
}

fn by_name(store: &PodStore, name: &str) -> Arc<nri_qos::kube::ApiPodFacts> {
    store
        .all()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("{name} not in the store"))
}

#[test]
fn against_a_real_api_server() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("nri_qos=debug")
        .with_test_writer()
        .try_init();
    let mut cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED kube_api: {why}");
            return;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let admin = rt.block_on(client(&cluster.admin));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    rt.block_on(async {
        apply_rbac(&admin).await;
        let ns = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        for (name, value) in [("low", 100), ("high", 1000)] {
            let pc: PriorityClass =
                serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))
                    .unwrap();
            Api::<PriorityClass>::all(admin.clone())
                .create(&PostParams::default(), &pc)
                .await
                .unwrap();
        }
        let rc: RuntimeClass = serde_json::from_value(json!({
            "metadata": {"name": "kata"}, "handler": "kata",
            "overhead": {"podFixed": {"memory": "64Mi"}}
        }))
        .unwrap();
        Api::<RuntimeClass>::all(admin.clone())
            .create(&PostParams::default(), &rc)
            .await
            .unwrap();
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "protected", "namespace": NS},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}}
        }))
        .unwrap();
        let pdbs = Api::<PodDisruptionBudget>::namespaced(admin.clone(), NS);
        let created = pdbs.create(&PostParams::default(), &pdb).await.unwrap();
        // No disruption controller here: write the status it would.
        let status = json!({"status": {
            "observedGeneration": created.metadata.generation,
            "disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2
        }});
        pdbs.patch_status(
            "protected",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    });

    // Pods bound to our node (and one to another node, never seen).
    let specs: Vec<Pod> = vec![
        pod(
            "plain",
            NODE,
            json!({"priorityClassName": "low",
            "containers": [container("a", Some("100Mi"), None), container("b", None, Some("50Mi"))]}),
        ),
        pod(
            "init-max",
            NODE,
            json!({"priorityClassName": "high",
            "initContainers": [{"restartPolicy": "Always", "name": "side", "image": "busybox", "resources": {"requests": {"memory": "10Mi"}}}, container("init", Some("500Mi"), None)],
            "containers": [container("app", Some("100Mi"), None)]}),
        ),
        pod(
            "sidecar",
            NODE,
            json!({
            "initContainers": [{"restartPolicy": "Always", "name": "side", "image": "busybox", "resources": {"requests": {"memory": "30Mi"}}}],
            "containers": [container("app", Some("200Mi"), Some("400Mi"))]}),
        ),
        pod(
            "pod-level",
            NODE,
            json!({"resources": {"requests": {"memory": "1Gi", "cpu": "1"}},
            "runtimeClassName": "kata",
            "containers": [container("a", None, None), container("b", None, None)]}),
        ),
        pod(
            "besteffort",
            NODE,
            json!({"containers": [{"name": "a", "image": "busybox"}]}),
        ),
        pod(
            "critical",
            NODE,
            json!({"priorityClassName": "system-node-critical",
            "containers": [container("a", Some("10Mi"), None)]}),
        ),
        pod(
            "mirror",
            NODE,
            json!({"annotations": {"kubernetes.io/config.mirror": "static-hash", "kubernetes.io/config.source": "file"},
            "containers": [container("a", Some("10Mi"), None)]}),
        ),
        pod(
            "protected",
            NODE,
            json!({"labels": {"app": "protected"},
            "containers": [container("a", Some("20Mi"), None)]}),
        ),
        pod(
            "protected-hard",
            NODE,
            json!({"labels": {"app": "protected"},
            "containers": [container("a", Some("20Mi"), None)]}),
        ),
        pod(
            "elsewhere",
            "node-b",
            json!({"containers": [container("a", Some("1Mi"), None)]}),
        ),
    ];
    rt.block_on(async {
        for p in &specs {
            pods.create(&PostParams::default(), p).await.unwrap();
        }
        // No kubelet here: say the protected pods run, or the Eviction API
        // ignores their budget (it does for Pending pods).
        for name in ["protected", "protected-hard"] {
            let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
            pods.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status))
                .await
                .unwrap();
        }
    });

    // The plugin's source, authenticated as the DaemonSet's service account.
    let metrics = Arc::new(nri_qos::metrics::Metrics::new());
    let kube = Kube::start(
        Credentials::Kubeconfig(cluster.plugin.clone()),
        NODE.into(),
        true,
        Some(metrics.clone()),
    )
    .expect("source starts");
    let store = kube.store();
    wait_for("the first list", Duration::from_secs(30), || {
        store.connected() && store.len() == specs.len() - 1
    });

    // Exact requests and priorities, the kubelet's way.
    let f = |n: &str| by_name(&store, n);
    assert_eq!(f("plain").memory_request, 150 * MI);
    assert_eq!(
        f("plain").container_request("b"),
        Some(50 * MI),
        "limit defaults the request"
    );
    assert_eq!(f("plain").priority, Some(100));
    assert_eq!(
        f("init-max").memory_request,
        510 * MI,
        "init 500Mi + sidecar started before it"
    );
    assert_eq!(f("init-max").priority, Some(1000));
    assert_eq!(
        f("sidecar").memory_request,
        230 * MI,
        "sidecar adds to the regular containers"
    );
    assert_eq!(f("sidecar").container_request("side"), Some(30 * MI));
    assert_eq!(
        f("pod-level").memory_request,
        1024 * MI + 64 * MI,
        "pod-level request plus RuntimeClass overhead"
    );
    assert_eq!(f("pod-level").class, QosClass::Burstable);
    assert_eq!(f("besteffort").class, QosClass::BestEffort);
    assert_eq!(f("critical").priority, Some(2_000_001_000));
    assert!(f("critical").critical() && f("mirror").critical() && !f("plain").critical());
    assert_eq!(f("mirror").runtime_uid, "static-hash");
    let info = PodRegistry::get(&*store, &f("plain").uid).unwrap();
    assert_eq!(info.request_source.to_string(), "api-server");
    assert!(store.all().iter().all(|p| p.name != "elsewhere"));

    // The monitor's ranking equals the kubelet's comparator on these pods.
    let usage: BTreeMap<&str, u64> = [
        ("plain", 400 * MI),
        ("init-max", 600 * MI),
        ("sidecar", 100 * MI),
        ("pod-level", 1100 * MI),
        ("besteffort", 50 * MI),
        ("critical", 900 * MI),
        ("mirror", 900 * MI),
        ("protected", 300 * MI),
        ("protected-hard", 30 * MI),
    ]
    .into();
    let cands: Vec<Candidate> = store
        .all()
        .iter()
        .map(|p| {
            let i = PodRegistry::get(&*store, &p.runtime_uid).unwrap();
            Candidate {
                uid: i.uid.clone(),
                namespace: Some(i.namespace),
                name: Some(i.name.clone()),
                class: i.class.unwrap(),
                class_source: "registry",
                working_set: usage[p.name.as_str()],
                request: i.memory_request.unwrap(),
                request_source: i.request_source,
                priority: i.priority,
                pause_only: false,
                static_pod: i.static_pod,
                path: PathBuf::from(&i.uid),
            }
        })
        .collect();
    let policy = RankPolicy {
        critical_namespaces: vec!["kube-system".into()],
        critical_priority: 2_000_000_000,
        require_pod_info: false,
    };
    let ours: Vec<String> = rank::rank(&cands, &policy)
        .order
        .iter()
        .map(|&i| cands[i].uid.clone())
        .collect();
    assert_eq!(
        ours,
        kubelet_order(&cands),
        "no Guaranteed pod here, so no deliberate difference"
    );
    // Priority decides between the two over-request Burstable pods.
    let pos = |n: &str| ours.iter().position(|u| *u == f(n).runtime_uid);
    assert!(pos("plain") < pos("init-max"), "priority 100 before 1000");
    assert!(
        pos("critical").is_none() && pos("mirror").is_none(),
        "critical pods are never candidates"
    );

    audit_over_the_api(&cluster, &rt, &store);

    // Soft: an Eviction moves the pod and an Event says why.
    let victim = f("plain");
    assert_eq!(
        kube.evict(&notice(&victim, false), Duration::from_secs(5)),
        EvictOutcome::Created
    );
    let evicted = rt.block_on(pods.get(&victim.name)).unwrap();
    assert!(
        evicted.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp set"
    );
    let conditions = evicted
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True"),
        "{conditions:?}"
    );
    let events = |uid: &str| {
        rt.block_on(
            Api::<ApiEvent>::namespaced(admin.clone(), NS)
                .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}"))),
        )
        .unwrap()
        .items
    };
    wait_for("the Evicted event", Duration::from_secs(10), || {
        events(&victim.uid)
            .iter()
            .any(|e| e.reason.as_deref() == Some("Evicted"))
    });
    let ev = events(&victim.uid)
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("Evicted"))
        .unwrap();
    let msg = ev.message.unwrap_or_default();
    assert!(
        msg.contains("memory.available")
            && msg.contains("700Mi")
            && msg.contains("request is 150Mi"),
        "{msg}"
    );
    assert_eq!(ev.type_.as_deref(), Some("Warning"));

    // A PodDisruptionBudget with no disruptions allowed: honoured at the
    // soft threshold (the monitor moves on), overridden at the hard one.
    let p = f("protected");
    assert_eq!(
        kube.evict(&notice(&p, false), Duration::from_secs(5)),
        EvictOutcome::RefusedByPdb
    );
    let still = rt.block_on(pods.get(&p.name)).unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "a refused eviction leaves the pod alone"
    );
    let ph = f("protected-hard");
    kube.evict_after_kill(notice(&ph, true));
    wait_for("the overridden-PDB event", Duration::from_secs(10), || {
        events(&ph.uid).iter().any(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains("overridden"))
        })
    });
    let text = metrics.render();
    assert!(
        text.contains("nri_qos_kube_evictions_total{outcome=\"created\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("nri_qos_kube_evictions_total{outcome=\"refused_pdb\"} 2"),
        "{text}"
    );
    assert!(text.contains("nri_qos_kube_connected 1"), "{text}");

    // RBAC: the DaemonSet's ClusterRole allows what we use and nothing else.
    let sa = rt.block_on(client(&cluster.plugin));
    let forbidden =
        |r: Result<(), kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    rt.block_on(async {
        let sa_pods: Api<Pod> = Api::namespaced(sa.clone(), NS);
        assert!(forbidden(
            sa_pods
                .delete("besteffort", &DeleteParams::default())
                .await
                .map(|_| ())
        ));
        assert!(forbidden(
            sa_pods
                .create(&PostParams::default(), &specs[0])
                .await
                .map(|_| ())
        ));
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(sa.clone(), NS);
        assert!(forbidden(
            secrets.list(&ListParams::default()).await.map(|_| ())
        ));
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(sa.clone());
        assert!(forbidden(
            nodes.list(&ListParams::default()).await.map(|_| ())
        ));
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(sa.clone(), NS);
        assert!(forbidden(
            pdbs.delete("protected", &DeleteParams::default())
                .await
                .map(|_| ())
        ));
    });
    if cluster.kubectl.is_some() {
        // kubectl auth can-i asks the API server (SelfSubjectAccessReview).
        let can = |verb: &str, what: &str| {
            let (res, sub) = what.split_once('/').unwrap_or((what, ""));
            let mut args = vec!["auth", "can-i", verb, res, "-n", NS];
            let flag = format!("--subresource={sub}");
            if !sub.is_empty() {
                args.push(&flag);
            }
            cluster.kubectl_as(&cluster.plugin, &args).1 == "yes"
        };
        for (verb, what) in [
            ("get", "pods"),
            ("list", "pods"),
            ("watch", "pods"),
            ("create", "pods/eviction"),
            ("create", "events"),
        ] {
            assert!(can(verb, what), "the plugin may not {verb} {what}");
        }
        for (verb, what) in [
            ("delete", "pods"),
            ("patch", "pods"),
            ("create", "pods"),
            ("update", "pods/status"),
            ("get", "secrets"),
            ("delete", "events"),
            ("create", "pods/exec"),
            ("list", "nodes"),
            ("create", "poddisruptionbudgets"),
        ] {
            assert!(!can(verb, what), "the plugin may {verb} {what}");
        }
    }

    hooks_and_memory_of_the_plugin_process(&cluster, &rt, &pods);

    // The API server restarted mid-run: the watch recovers, nothing lost.
    cluster.stop_apiserver();
    wait_for("the watch to notice", Duration::from_secs(60), || {
        !store.connected()
    });
    // Without the watch cache, a watch resumed from a compacted resource
    // version reaches etcd and gets 410 Gone (watch_expiry_relists).
    cluster.apiserver_args.push("--watch-cache=false".into());
    cluster.start_apiserver().expect("restart");
    rt.block_on(async {
        pods.create(
            &PostParams::default(),
            &pod(
                "after-restart",
                NODE,
                json!({"containers": [container("a", Some("64Mi"), None)]}),
            ),
        )
        .await
        .unwrap();
        pods.delete("besteffort", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    });
    wait_for("the watch to recover", Duration::from_secs(60), || {
        store.connected()
            && store.all().iter().any(|p| p.name == "after-restart")
            && store.all().iter().all(|p| p.name != "besteffort")
    });
    assert_eq!(f("after-restart").memory_request, 64 * MI);
    assert_eq!(
        f("init-max").memory_request,
        510 * MI,
        "kept across the restart"
    );
    eprintln!(
        "kube_api: {} pod facts after the restart; {} events",
        store.len(),
        store.events()
    );

    watch_expiry_relists(&cluster, &rt, &pods, &store);
}

/// `nri-qos audit` over the API server: one list of the node's pods (the
/// same facts the watch has), matched to the runtime's pods by UID, gives
/// the audit the exact requests (source `api-server`) and lets it check the
/// pod cgroup the keeper protected with them; without the list, that
/// protection reads as the kubelet's and goes unchecked. An API server that
/// does not answer costs the audit the bounded wait, nothing more.
fn audit_over_the_api(cluster: &Cluster, rt: &tokio::runtime::Runtime, store: &PodStore) {
    use nri_qos::audit;
    use nri_qos::node::registry::{ContainerRequests, RequestSource};
    let creds = Credentials::Kubeconfig(cluster.plugin.clone());
    let listed = rt
        .block_on(nri_qos::kube::list_node_pods(
            &creds,
            NODE,
            Duration::from_secs(10),
        ))
        .expect("the list, as the DaemonSet's service account");
    assert_eq!(listed.len(), store.len());
    for p in &listed {
        assert_eq!(*by_name(store, &p.name), *p, "the list and the watch agree");
    }
    let api = PodStore::default();
    api.replace(listed);

    // The runtime's view: the `sidecar` pod (sidecar 30Mi, app 200Mi/400Mi)
    // and a pod the API server does not know.
    let sidecar = by_name(store, "sidecar");
    let node = nri_qos::qos::NodeFacts {
        memory_capacity: 16 << 30,
        memory_allocatable: 15 << 30,
        page_size: 4096,
        cgroup_v2: true,
    };
    let mut p = common::pod("s1", &format!("/kubepods/burstable/pod{}", sidecar.uid));
    p.uid = sidecar.uid.clone();
    let unknown = common::pod("s2", "/kubepods/burstable/podunknown");
    let mut ctrs = Vec::new();
    for (id, pod, name, limit, adj) in [
        ("c-side", &p, "side", 0, 998),
        ("c-app", &p, "app", 400 * MI as i64, 988),
        ("c-other", &unknown, "other", 0, 985),
    ] {
        let mut c = common::container(id, &pod.id, 102, 0, limit, adj);
        c.name = name.into();
        c.linux.mut_or_insert_default().cgroups_path = format!("{}/{id}", pod.linux.cgroup_parent);
        ctrs.push(c);
    }
    let snap = audit::Snapshot {
        pods: vec![p, unknown],
        containers: ctrs,
        runtime: "containerd".into(),
        ..Default::default()
    };
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path();
    let run = |api: Option<&dyn ContainerRequests>| {
        audit::audit(
            &snap,
            &Default::default(),
            &node,
            &Default::default(),
            &Default::default(),
            root,
            Path::new("/nonexistent"),
            api,
        )
    };
    // The node as the plugin and the keeper with the API source left it.
    for c in &snap.containers {
        std::fs::create_dir_all(root.join(&c.linux.cgroups_path[1..])).unwrap();
    }
    for _ in 0..2 {
        let report = run(Some(&api));
        for s in report.containers.iter().chain(&report.hierarchy) {
            std::fs::create_dir_all(root.join(&s.cgroup)).unwrap();
            for c in &s.checks {
                if let Some(want) = &c.expected {
                    std::fs::write(root.join(&s.cgroup).join(&c.key), want).unwrap();
                }
            }
        }
    }
    let report = run(Some(&api));
    let table = audit::render_table(&report);
    assert_eq!(report.drift, 0, "{table}");
    let ctr = |r: &audit::AuditReport, name: &str| {
        r.containers
            .iter()
            .find(|c| c.name.ends_with(&format!("/{name}")))
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    for (name, want) in [("side", 30 * MI), ("app", 200 * MI)] {
        let c = ctr(&report, name);
        assert_eq!(c.request_source, Some(RequestSource::ApiServer), "{table}");
        assert_eq!(c.memory_request, Some(want), "{name}: {table}");
    }
    assert_eq!(
        ctr(&report, "other").request_source,
        Some(RequestSource::OomScoreAdj),
        "a pod the API server does not list keeps the runtime's reading"
    );
    let pod_cg = format!("kubepods/burstable/pod{}", sidecar.uid);
    let checked = |r: &audit::AuditReport| {
        r.hierarchy
            .iter()
            .find(|h| h.cgroup == pod_cg)
            .unwrap()
            .checks
            .iter()
            .all(|c| c.expected.is_some())
    };
    assert!(checked(&report), "{table}");
    assert!(table.contains("api-server"), "{table}");
    // Without the list: the exact protection reads as the kubelet's.
    let without = run(None);
    assert!(!checked(&without), "{}", audit::render_table(&without));

    // An API server that accepts and never answers: a bounded wait.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = cluster.dir.path().join("silent.kubeconfig");
    let text = std::fs::read_to_string(&cluster.plugin).unwrap().replace(
        &format!(":{}", cluster.port),
        &format!(":{}", silent.local_addr().unwrap().port()),
    );
    std::fs::write(&dead, text).unwrap();
    let t = Instant::now();
    let err = rt
        .block_on(nri_qos::kube::list_node_pods(
            &Credentials::Kubeconfig(dead),
            NODE,
            Duration::from_secs(1),
        ))
        .unwrap_err();
    assert!(matches!(err, nri_qos::kube::KubeError::Timeout(_)), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(silent);
}

/// A TCP relay to the API server that can be cut (live connections shut,
/// new ones dropped) and restored, while the API server keeps running.
struct Relay {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    live: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn to(port: u16) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay {
            port: listener.local_addr().unwrap().port(),
            cut: Arc::default(),
            live: Arc::default(),
        };
        let (cut, live) = (relay.cut.clone(), relay.live.clone());
        std::thread::spawn(move || {
            for down in listener.incoming().flatten() {
                if cut.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let mut l = live.lock().unwrap();
                l.push(down.try_clone().unwrap());
                l.push(up.try_clone().unwrap());
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        relay
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for c in self.live.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One call to etcd's JSON gateway; the answer's body.
fn etcd(port: u16, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "etcd {path}: {out}");
    out
}

/// etcd's current revision (a write first, so it moves past every pod event).
fn etcd_revision(port: u16) -> u64 {
    let key = base64(b"nri-qos-test");
    etcd(
        port,
        "/v3/kv/put",
        &format!(r#"{{"key":"{key}","value":"{key}"}}"#),
    );
    let out = etcd(port, "/v3/kv/range", &format!(r#"{{"key":"{key}"}}"#));
    let at = out.find(r#""revision":""#).expect("a revision") + 12;
    out[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// Watch expiry: a watch resumed from a resource version etcd
/// compacted away gets 410 Gone; the reflector relists and the relist
/// replaces the store, so a pod created during the gap appears and one
/// deleted during it disappears. The API server runs without its watch
/// cache (set at the restart before), so the resumed watch reaches etcd.
fn watch_expiry_relists(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    pods: &Api<Pod>,
    direct: &PodStore,
) {
    let relay = Relay::to(cluster.port);
    let relayed = cluster.dir.path().join("relayed.kubeconfig");
    let text = std::fs::read_to_string(&cluster.plugin)
        .unwrap()
        .replace(&format!(":{}", cluster.port), &format!(":{}", relay.port));
    std::fs::write(&relayed, text).unwrap();
    let metrics = Arc::new(nri_qos::metrics::Metrics::new());
    let kube = Kube::start(
        Credentials::Kubeconfig(relayed),
        NODE.into(),
        false,
        Some(metrics.clone()),
    )
    .unwrap();
    let store = kube.store();
    wait_for("the relayed source's list", Duration::from_secs(30), || {
        store.connected() && store.len() == direct.len()
    });
    let gone = "after-restart";
    assert!(store.all().iter().any(|p| p.name == gone));

    relay.cut();
    wait_for("the relayed watch to fail", Duration::from_secs(60), || {
        !store.connected()
    });
    rt.block_on(async {
        let p = pod(
            "in-the-gap",
            NODE,
            json!({"containers": [container("a", Some("96Mi"), None)]}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
        pods.delete(gone, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    });
    wait_for(
        "the direct watch to see the gap",
        Duration::from_secs(30),
        || {
            direct.all().iter().any(|p| p.name == "in-the-gap")
                && direct.all().iter().all(|p| p.name != gone)
        },
    );
    // Everything the relayed watch missed is compacted away.
    let rev = etcd_revision(cluster.etcd_port);
    etcd(
        cluster.etcd_port,
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    );
    relay.restore();
    wait_for("the relist after 410", Duration::from_secs(90), || {
        store.connected()
            && store.all().iter().any(|p| p.name == "in-the-gap")
            && store.all().iter().all(|p| p.name != gone)
    });
    assert_eq!(by_name(&store, "in-the-gap").memory_request, 96 * MI);
    let names = |s: &PodStore| {
        let mut v: Vec<String> = s.all().iter().map(|p| p.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&store), names(direct), "nothing lost, nothing stale");
    let text = metrics.render();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in {text}"))
    };
    assert!(value("nri_qos_kube_watch_expired_total") >= 1, "{text}");
    assert!(value("nri_qos_kube_lists_total") >= 2, "{text}");
    eprintln!(
        "kube_api: watch expiry: {} watches expired (410), {} lists",
        value("nri_qos_kube_watch_expired_total"),
        value("nri_qos_kube_lists_total")
    );
}

const BIG_NODE: &str = "node-big";
const BIG_PODS: usize = 110;

/// One plugin process over the NRI wire (the same test peer as
/// tests/protocol.rs), with or without the API source.
async fn plugin_process(
    dir: &Path,
    config: &str,
    uids: &[String],
) -> (common::PluginProcess, common::PeerSession) {
    use nri_qos::nri::proto::api;
    let sock = dir.join("nri.sock");
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, config).unwrap();
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let plugin = common::PluginProcess::external(
        &sock,
        dir,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--log-level",
            "nri_qos=debug",
        ],
    );
    let mut s = common::accept(&listener, false).await;
    s.handshake(true).await;
    // The runtime's view of the same 110 pods, as on a full node.
    let mut pods = Vec::new();
    let mut ctrs = Vec::new();
    for (i, uid) in uids.iter().enumerate() {
        let id = format!("s{i}");
        let mut p = common::pod(&id, &format!("/kubepods/burstable/pod{uid}"));
        p.uid = uid.clone();
        let mut c = common::container(&format!("c{i}"), &id, 102, 0, 0, 985);
        c.name = "app".into();
        pods.push(p);
        ctrs.push(c);
    }
    s.plugin
        .synchronize(
            common::ctx(),
            &api::SynchronizeRequest {
                pods,
                containers: ctrs,
                ..Default::default()
            },
        )
        .await
        .expect("synchronize");
    (plugin, s)
}

/// The CreateContainer hook takes the exact request from the API server
/// (request source api-server), and what the watch of a full node's pods
/// costs the plugin process in memory.
fn hooks_and_memory_of_the_plugin_process(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    pods: &Api<Pod>,
) {
    let mut uids = Vec::new();
    rt.block_on(async {
        for i in 0..BIG_PODS {
            let p = pod(
                &format!("big-{i}"),
                BIG_NODE,
                json!({"containers": [container("app", Some(&format!("{}Mi", 100 + i)), Some("1Gi"))]}),
            );
            let created = pods.create(&PostParams::default(), &p).await.unwrap();
            uids.push(created.metadata.uid.unwrap());
        }
    });
    let with_dir = tempfile::tempdir().unwrap();
    let without_dir = tempfile::tempdir().unwrap();
    let with_cfg = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\nnode-name = \"{BIG_NODE}\"\n",
        cluster.plugin.display()
    );
    let ((mut with, s_with), (mut without, s_without)) = rt.block_on(async {
        (
            plugin_process(with_dir.path(), &with_cfg, &uids).await,
            plugin_process(without_dir.path(), "[kubernetes]\nenabled = false\n", &uids).await,
        )
    });
    wait_for("the plugin's first list", Duration::from_secs(30), || {
        with.log_text().contains("listed this node's pods")
    });
    // A container created now: its request comes from the API server.
    rt.block_on(async {
        use nri_qos::nri::proto::api;
        for s in [&s_with, &s_without] {
            let mut p = common::pod("n7", &format!("/kubepods/burstable/pod{}", uids[7]));
            p.uid = uids[7].clone();
            let mut c = common::container("n7c", "n7", 102, 0, 1 << 30, 985);
            c.name = "app".into();
            s.plugin
                .create_container(
                    common::ctx(),
                    &api::CreateContainerRequest {
                        pod: protobuf::MessageField::some(p),
                        container: protobuf::MessageField::some(c),
                        ..Default::default()
                    },
                )
                .await
                .expect("create_container");
        }
    });
    let exact = (100 + 7) * MI;
    let decision = |log: &str| {
        log.lines()
            .rfind(|l| l.contains("policy decision") && l.contains("pod-n7"))
            .unwrap_or_default()
            .to_string()
    };
    let line = decision(&with.log_text());
    assert!(
        line.contains("request_source=ApiServer")
            && line.contains(&format!("memory_request=Some({exact})")),
        "{line}"
    );
    let line = decision(&without.log_text());
    assert!(line.contains("request_source=OomScoreAdj"), "{line}");
    // Resident memory once both settled (the watch's first list done).
    std::thread::sleep(Duration::from_secs(2));
    let (a, b) = (with.rss_kib(), without.rss_kib());
    eprintln!(
        "kube_api: plugin RSS with the API watch of {BIG_PODS} pods: {a} KiB; without: {b} KiB; difference {} KiB",
        a as i64 - b as i64
    );
    assert!(with.is_running() && without.is_running());
    drop((s_with, s_without));
}

/// Not a test: serves the API server with a watchable full node for
/// `scripts/bench-kube.sh` (the hook benchmark with the API source on).
/// Writes the plugin's kubeconfig to `$NRI_QOS_KUBE_SERVE` and serves until
/// that file is removed.
#[test]
#[ignore]
fn serve_for_benchmarks() {
    let Some(out) = std::env::var_os("NRI_QOS_KUBE_SERVE").map(PathBuf::from) else {
        eprintln!("set NRI_QOS_KUBE_SERVE to a path for the kubeconfig");
        return;
    };
    let cluster = Cluster::start().expect("API server");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(client(&cluster.admin));
    rt.block_on(async {
        let ns = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        apply_rbac(&admin).await;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
        for i in 0..BIG_PODS {
            let p = pod(
                &format!("big-{i}"),
                BIG_NODE,
                json!({"containers": [container("app", Some("100Mi"), None)]}),
            );
            pods.create(&PostParams::default(), &p).await.unwrap();
        }
    });
    std::fs::copy(&cluster.plugin, &out).unwrap();
    eprintln!("serving; node {BIG_NODE}, kubeconfig {}", out.display());
    while out.exists() {
        std::thread::sleep(Duration::from_millis(200));
    }
}
