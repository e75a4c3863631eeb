//! The API server side: one thread with its own runtime runs the watch of
//! this node's pods and carries out eviction and event requests sent to it
//! over a bounded channel.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as ApiEvent, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, EvictParams, PostParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::facts::{self, ApiPodFacts};
use super::messages::{evicted_message, relaxed_message};
use super::store::PodStore;
use super::{Credentials, KubeError};
use crate::metrics::Metrics;
use crate::node::cluster::{ClusterEvictions, EvictOutcome, EvictionNotice, RelaxNotice};

/// Requests waiting for the API thread; more are refused, never queued
/// without bound (the monitor then kills as it would without the API).
const QUEUE: usize = 64;
/// No API call waits longer than this (the hard path's Eviction and Events).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

enum Request {
    Evict {
        notice: EvictionNotice,
        limit: Duration,
        reply: Option<std::sync::mpsc::SyncSender<EvictOutcome>>,
    },
    Event {
        pod: PodRef,
        reason: String,
        message: String,
        warning: bool,
    },
}

/// The pod an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A running API source: the snapshot, and the way to the API thread.
#[derive(Clone)]
pub struct Kube {
    store: Arc<PodStore>,
    tx: mpsc::Sender<Request>,
    node_name: String,
    evict: bool,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("node_name", &self.node_name)
            .field("pods", &self.store.len())
            .finish_non_exhaustive()
    }
}

pub(super) async fn client(credentials: &Credentials) -> Result<Client, KubeError> {
    let config = match credentials {
        Credentials::InCluster => kube::Config::incluster().map_err(KubeError::InCluster)?,
        Credentials::Kubeconfig(path) => {
            let err = |source| KubeError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(err)?
        }
    };
    let mut config = config;
    // A 429 from the Eviction API is a PodDisruptionBudget's answer, not a
    // transient failure to retry; the watcher has a backoff of its own.
    config.default_retry = false;
    Client::try_from(config).map_err(KubeError::Client)
}

impl Kube {
    /// Builds the client (errors in the credentials are reported here) and
    /// starts the API thread. Call outside any async runtime.
    pub fn start(
        credentials: Credentials,
        node_name: String,
        evict: bool,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Kube, KubeError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| KubeError::Start {
                what: "starting the API runtime",
                source,
            })?;
        // The kubeconfig is read here so its errors are the caller's; the
        // client (TLS set-up) is built on the API thread: a pre-launched
        // plugin must register within the runtime's timeout (containerd: 5 s
        // from launch), and under emulation building it here made the
        // plugin miss that in the VM test.
        if let Credentials::Kubeconfig(path) = &credentials {
            kube::config::Kubeconfig::read_from(path).map_err(|source| KubeError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
        }
        let store = Arc::new(PodStore::default());
        let (tx, rx) = mpsc::channel(QUEUE);
        if let Some(m) = &metrics {
            m.set_kube_configured();
        }
        let kube = Kube {
            store: store.clone(),
            tx,
            node_name: node_name.clone(),
            evict,
            metrics: metrics.clone(),
        };
        info!(node = %node_name, credentials = ?credentials, evict, "Kubernetes API source starting");
        std::thread::Builder::new()
            .name("nri-qos-kube".into())
            .spawn(move || {
                rt.block_on(async move {
                    let client = match client(&credentials).await {
                        Ok(c) => c,
                        Err(e) => {
                            error!(error = %e, "Kubernetes API source not started; running on the runtime's pod facts alone");
                            return;
                        }
                    };
                    let api = ApiThread {
                        client,
                        node_name,
                        store,
                        metrics,
                    };
                    tokio::join!(api.watch(), api.serve(rx));
                })
            })
            .map_err(|source| KubeError::Start {
                what: "starting the API thread",
                source,
            })?;
        Ok(kube)
    }

    /// The snapshot of this node's pods.
    pub fn store(&self) -> Arc<PodStore> {
        self.store.clone()
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Posts an Event on a pod, in the background (never waits).
    pub fn post_event(&self, pod: PodRef, reason: &str, message: String, warning: bool) {
        let req = Request::Event {
            pod,
            reason: reason.into(),
            message,
            warning,
        };
        if self.tx.try_send(req).is_err() {
            debug!(reason, "API request queue full or closed; event dropped");
        }
    }

    /// The throttle guard's stage 1 relaxed a pod's memory.high: a Normal
    /// Event `MemoryHighRelaxed` on the pod says so.
    pub fn post_memory_high_relaxed(&self, pod: PodRef, message: String) {
        self.post_event(pod, "MemoryHighRelaxed", message, false);
    }

    fn count(&self, outcome: EvictOutcome) {
        if let Some(m) = &self.metrics {
            m.inc_kube_eviction(outcome);
        }
    }
}

impl ClusterEvictions for Kube {
    fn evict(&self, notice: &EvictionNotice, limit: Duration) -> EvictOutcome {
        if !self.evict {
            return EvictOutcome::Unreachable;
        }
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let req = Request::Evict {
            notice: notice.clone(),
            limit,
            reply: Some(reply),
        };
        let outcome = if self.tx.try_send(req).is_err() {
            EvictOutcome::Unreachable
        } else {
            // The API thread gives up at `limit` too; a little slack for the hop.
            answer
                .recv_timeout(limit + Duration::from_millis(100))
                .unwrap_or(EvictOutcome::Unreachable)
        };
        self.count(outcome);
        outcome
    }

    fn evict_after_kill(&self, notice: EvictionNotice) {
        if !self.evict {
            return;
        }
        let req = Request::Evict {
            notice,
            limit: CALL_TIMEOUT,
            reply: None,
        };
        if self.tx.try_send(req).is_err() {
            self.count(EvictOutcome::Unreachable);
        }
    }

    fn memory_high_relaxed(&self, notice: RelaxNotice) {
        let message = relaxed_message(&notice);
        let pod = PodRef {
            namespace: notice.namespace,
            name: notice.name,
            uid: notice.uid,
        };
        self.post_memory_high_relaxed(pod, message);
    }
}

struct ApiThread {
    client: Client,
    node_name: String,
    store: Arc<PodStore>,
    metrics: Option<Arc<Metrics>>,
}

fn reduce(pod: &Pod) -> Option<ApiPodFacts> {
    match facts::from_api(pod) {
        Ok(f) => Some(f),
        Err(e) => {
            let m = &pod.metadata;
            warn!(pod = %format_args!("{}/{}", m.namespace.as_deref().unwrap_or(""), m.name.as_deref().unwrap_or("")), error = %e, "pod spec not understood; its facts come from the runtime");
            None
        }
    }
}

/// When the API server last wrote the pod: the newest managed-fields time,
/// creation or deletion timestamp.
fn last_write(pod: &Pod) -> Option<SystemTime> {
    let m = &pod.metadata;
    let managed = m
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.time.as_ref());
    managed
        .chain(m.creation_timestamp.as_ref())
        .chain(m.deletion_timestamp.as_ref())
        .map(|t| SystemTime::from(t.0))
        .max()
}

impl ApiThread {
    /// The reflector: list, then watch; the watcher relists after a 410
    /// (expired resource version) or any break, with backoff.
    async fn watch(&self) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut listing: Vec<ApiPodFacts> = Vec::new();
        let mut failures = 0u64;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => listing.clear(),
                Ok(Event::InitApply(p)) => listing.extend(reduce(&p)),
                Ok(Event::InitDone) => {
                    let n = listing.len();
                    self.store.replace(std::mem::take(&mut listing));
                    listing.shrink_to_fit();
                    self.connected(true);
                    if let Some(m) = &self.metrics {
                        m.inc_kube_relist();
                    }
                    info!(pods = n, node = %self.node_name, after_failures = failures, "listed this node's pods from the API server");
                    failures = 0;
                }
                Ok(Event::Apply(p)) => {
                    self.lag(&p);
                    if let Some(f) = reduce(&p) {
                        self.store.upsert(f);
                    }
                    self.connected(true);
                }
                Ok(Event::Delete(p)) => {
                    if let Some(f) = reduce(&p) {
                        self.store.remove(&f.runtime_uid);
                    }
                    self.connected(true);
                }
                Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                    // Not a failure: the resource version we resumed from
                    // was compacted away. The watcher relists at once and
                    // the relist replaces the store, dropping what went.
                    if let Some(m) = &self.metrics {
                        m.inc_kube_watch_expired();
                    }
                    info!(reason = %status.reason, message = %status.message, "watch expired (410 Gone); relisting this node's pods");
                }
                Err(e) => {
                    failures += 1;
                    self.connected(false);
                    // The first failure of a run is news; the retries are not.
                    if failures == 1 {
                        warn!(error = %e, "API server watch failed; retrying with backoff (pod facts kept as they were)");
                    } else {
                        debug!(error = %e, failures, "API server watch still failing");
                    }
                }
            }
            if let Some(m) = &self.metrics {
                m.set_kube_pods(self.store.len() as u64);
            }
        }
    }

    fn connected(&self, up: bool) {
        self.store.set_connected(up);
        if let Some(m) = &self.metrics {
            m.set_kube_connected(up);
        }
    }

    fn lag(&self, pod: &Pod) {
        let (Some(m), Some(at)) = (&self.metrics, last_write(pod)) else {
            return;
        };
        // Second resolution on the server side; clock skew shows here too.
        if let Ok(lag) = SystemTime::now().duration_since(at) {
            m.set_kube_watch_lag(lag);
        }
    }

    async fn serve(&self, mut rx: mpsc::Receiver<Request>) {
        while let Some(req) = rx.recv().await {
            match req {
                Request::Evict {
                    notice,
                    limit,
                    reply,
                } => {
                    let waited = reply.is_some();
                    let outcome = self.evict(&notice, limit).await;
                    match reply {
                        Some(r) => {
                            let _ = r.try_send(outcome);
                        }
                        None => {
                            if let Some(m) = &self.metrics {
                                m.inc_kube_eviction(outcome);
                            }
                        }
                    }
                    self.after_evict(&notice, outcome, waited).await;
                }
                Request::Event {
                    pod,
                    reason,
                    message,
                    warning,
                } => self.event(&pod, &reason, &message, warning).await,
            }
        }
    }

    async fn evict(&self, n: &EvictionNotice, limit: Duration) -> EvictOutcome {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &n.namespace);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                // Past the hard threshold the cgroup is gone already; the
                // kubelet uses no grace for hard evictions either.
                grace_period_seconds: n.hard().then_some(0),
                // This pod, not a namesake created since.
                preconditions: Some(Preconditions {
                    uid: Some(n.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        match tokio::time::timeout(limit, api.evict(&n.name, &params)).await {
            Ok(Ok(_)) => EvictOutcome::Created,
            Ok(Err(kube::Error::Api(s))) if s.code == 429 => EvictOutcome::RefusedByPdb,
            Ok(Err(e)) => {
                warn!(pod = %format_args!("{}/{}", n.namespace, n.name), error = %e, "Eviction failed");
                EvictOutcome::Unreachable
            }
            Err(_) => {
                warn!(pod = %format_args!("{}/{}", n.namespace, n.name), limit_ms = crate::node::time::millis(limit), "Eviction got no answer in time");
                EvictOutcome::Unreachable
            }
        }
    }

    async fn after_evict(&self, n: &EvictionNotice, outcome: EvictOutcome, waited: bool) {
        let pod = PodRef {
            namespace: n.namespace.clone(),
            name: n.name.clone(),
            uid: n.uid.clone(),
        };
        let killed = !waited;
        match (outcome, killed) {
            (EvictOutcome::Created, _) => {
                info!(pod = %format_args!("{}/{}", n.namespace, n.name), hard = n.hard(), "Eviction created")
            }
            (EvictOutcome::RefusedByPdb, true) => warn!(
                pod = %format_args!("{}/{}", n.namespace, n.name),
                "PodDisruptionBudget overridden: past the hard threshold the pod's cgroup was killed although its budget refused the Eviction"
            ),
            // The monitor moves on (soft) or killed the cgroup anyway.
            _ => return,
        }
        self.event(&pod, "Evicted", &evicted_message(n, outcome, killed), true)
            .await;
    }

    async fn event(&self, pod: &PodRef, reason: &str, message: &str, warning: bool) {
        let api: Api<ApiEvent> = Api::namespaced(self.client.clone(), &pod.namespace);
        let now = chrono_now();
        let ev = ApiEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", pod.name)),
                namespace: Some(pod.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource {
                component: Some("nri-qos".into()),
                host: Some(self.node_name.clone()),
            }),
            reporting_component: Some("nri-qos".into()),
            reporting_instance: Some(self.node_name.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(reason.into()),
            count: Some(1),
            ..Default::default()
        };
        match tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &ev)).await {
            Ok(Ok(_)) => debug!(pod = %pod.name, reason, "event posted"),
            Ok(Err(e)) => warn!(pod = %pod.name, reason, error = %e, "could not post event"),
            Err(_) => warn!(pod = %pod.name, reason, "posting the event timed out"),
        }
    }
}

fn chrono_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
