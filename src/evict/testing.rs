//! Fake cgroup/proc trees, pod facts and API server for the tests of the
//! rooms that evict (the node-pressure monitor and the throttle guard).
//! Nothing here touches the real /sys/fs/cgroup or /proc.

// Tests cast small, known values; the cast lints guard the product code.
#![allow(clippy::cast_possible_truncation, clippy::cast_lossless)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::rank::RankPolicy;
use super::{EvictConfig, PodTree};
use crate::node::cluster;
use crate::node::layout::Driver;
use crate::node::registry::{PodInfo, PodRegistry, RequestSource};
use crate::node::QosClass;

/// Pod facts a test hands the monitor, as the plugin or the API server would.
#[derive(Default)]
pub struct Pods(Mutex<HashMap<String, PodInfo>>);

impl Pods {
    pub fn upsert(&self, info: PodInfo) {
        self.0.lock().unwrap().insert(info.uid.clone(), info);
    }
}

impl PodRegistry for Pods {
    fn get(&self, uid: &str) -> Option<PodInfo> {
        self.0.lock().unwrap().get(uid).cloned()
    }
}

pub const MI: u64 = 1 << 20;
pub const GI: u64 = 1 << 30;
pub const TOTAL: u64 = 16 * GI;

pub struct Fake {
    _dir: tempfile::TempDir,
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
    pub kp: PathBuf,
    driver: Driver,
    next_pid: std::cell::Cell<i32>,
}

pub fn w(path: &Path, text: &str) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    fs::write(path, text).unwrap();
}

impl Fake {
    pub fn new(driver: Driver) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cgroup_root = dir.path().join("cgroup");
        let kp = cgroup_root.join(match driver {
            Driver::Systemd => "kubepods.slice",
            Driver::Cgroupfs => "kubepods",
        });
        fs::create_dir_all(&kp).unwrap();
        let f = Fake {
            proc_root: dir.path().join("proc"),
            _dir: dir,
            cgroup_root,
            kp,
            driver,
            next_pid: std::cell::Cell::new(1000),
        };
        f.node_ws(4 * GI);
        f.psi(&f.node_psi(), 0.0, 0.0);
        f.psi(&f.kp.join("memory.pressure"), 0.0, 0.0);
        f
    }

    pub fn meminfo(&self) -> PathBuf {
        self.proc_root.join("meminfo")
    }

    pub fn node_psi(&self) -> PathBuf {
        self.proc_root.join("pressure/memory")
    }

    /// Where the pods live, as the eviction path sees it.
    pub fn tree(&self) -> PodTree {
        PodTree {
            cgroup_root: self.cgroup_root.clone(),
            proc_root: self.proc_root.clone(),
            kubepods: "auto".into(),
        }
    }

    /// Node working set via the root memory.stat (anon only, no cache).
    pub fn node_ws(&self, ws: u64) {
        let free = TOTAL - ws;
        w(
            &self.meminfo(),
            &format!(
                "MemTotal: {} kB\nMemFree: {} kB\nMemAvailable: {} kB\nInactive(file): 0 kB\n",
                TOTAL / 1024,
                free / 1024,
                free / 1024
            ),
        );
        w(
            &self.cgroup_root.join("memory.stat"),
            &format!("anon {ws}\nfile 0\ninactive_file 0\n"),
        );
    }

    pub fn psi(&self, path: &Path, some10: f64, full10: f64) {
        w(
            path,
            &format!(
                "some avg10={some10:.2} avg60=0.00 avg300=0.00 total=1\nfull avg10={full10:.2} avg60=0.00 avg300=0.00 total=1\n"
            ),
        );
    }

    pub fn pod_path(&self, uid: &str, class: QosClass) -> PathBuf {
        let u = uid.replace('-', "_");
        match (self.driver, class) {
            (Driver::Cgroupfs, QosClass::Guaranteed) => self.kp.join(format!("pod{uid}")),
            (Driver::Cgroupfs, QosClass::Burstable) => self.kp.join(format!("burstable/pod{uid}")),
            (Driver::Cgroupfs, QosClass::BestEffort) => {
                self.kp.join(format!("besteffort/pod{uid}"))
            }
            (Driver::Systemd, QosClass::Guaranteed) => {
                self.kp.join(format!("kubepods-pod{u}.slice"))
            }
            (Driver::Systemd, QosClass::Burstable) => self.kp.join(format!(
                "kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
            )),
            (Driver::Systemd, QosClass::BestEffort) => self.kp.join(format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"
            )),
        }
    }

    /// A pod with a pause container and one app container whose memory.min
    /// carries the request (MemoryQoS); working set `ws` plus 10Mi of
    /// inactive file cache that must not count.
    pub fn pod(
        &self,
        uid: &str,
        class: QosClass,
        ws: u64,
        request: u64,
        app_comm: &str,
    ) -> PathBuf {
        let p = self.pod_path(uid, class);
        let cache = 64 * MI;
        w(&p.join("memory.current"), &format!("{}\n", ws + cache));
        w(
            &p.join("memory.stat"),
            &format!("anon {ws}\nfile {cache}\ninactive_file {cache}\n"),
        );
        w(
            &p.join("memory.max"),
            &if class == QosClass::Guaranteed {
                request.to_string()
            } else {
                "max".into()
            },
        );
        w(&p.join("memory.min"), "0\n");
        w(&p.join("memory.high"), "max\n");
        w(
            &p.join("memory.events.local"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        );
        w(&p.join("cgroup.events"), "populated 1\nfrozen 0\n");
        w(&p.join("cgroup.kill"), "");
        w(&p.join("memory.reclaim"), "");
        w(&p.join("cgroup.procs"), "");
        for (ctr, comm, min) in [("pause", "pause", 0), ("app", app_comm, request)] {
            let pid = self.next_pid.get();
            self.next_pid.set(pid + 1);
            let c = p.join(ctr);
            w(&c.join("cgroup.procs"), &format!("{pid}\n"));
            w(&c.join("memory.min"), &format!("{min}\n"));
            w(
                &c.join("memory.events.local"),
                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
            );
            w(
                &self.proc_root.join(format!("{pid}/comm")),
                &format!("{comm}\n"),
            );
        }
        p
    }

    pub fn gone(&self, pod: &Path) {
        fs::remove_dir_all(pod).unwrap();
    }
}

pub fn info(uid: &str, ns: &str, prio: Option<i32>) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        namespace: ns.into(),
        name: format!("{uid}-name"),
        priority: prio,
        memory_request: None,
        request_source: RequestSource::Unknown,
        class: None,
        static_pod: false,
    }
}

pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Whether `cgroup.kill` of the pod cgroup at `p` was written.
pub fn killed(p: &Path) -> bool {
    fs::read_to_string(p.join("cgroup.kill")).unwrap_or_default() == "1"
}

/// The API server's answers, scripted per pod; records what was asked.
#[derive(Default)]
pub struct FakeCluster {
    pub refuse: Vec<&'static str>,
    pub unreachable: bool,
    pub asked: Mutex<Vec<(String, bool)>>,
    pub relaxed: Mutex<Vec<cluster::RelaxNotice>>,
}

impl cluster::ClusterEvictions for FakeCluster {
    fn evict(&self, n: &cluster::EvictionNotice, _limit: Duration) -> cluster::EvictOutcome {
        self.asked.lock().unwrap().push((n.uid.clone(), n.hard()));
        if self.unreachable {
            cluster::EvictOutcome::Unreachable
        } else if self.refuse.contains(&n.uid.as_str()) {
            cluster::EvictOutcome::RefusedByPdb
        } else {
            cluster::EvictOutcome::Created
        }
    }
    fn evict_after_kill(&self, n: cluster::EvictionNotice) {
        self.asked.lock().unwrap().push((n.uid.clone(), n.hard()));
    }
    fn memory_high_relaxed(&self, n: cluster::RelaxNotice) {
        self.relaxed.lock().unwrap().push(n);
    }
}

/// The eviction path's defaults (`[monitor]`'s), with no kill wait: fake
/// pods never die by themselves.
pub fn evict_config() -> EvictConfig {
    EvictConfig {
        dry_run: false,
        cooldown: ms(1000),
        kill_timeout: ms(5000),
        kill_wait: Duration::ZERO,
        mrelease: true,
        rank: RankPolicy {
            critical_namespaces: vec!["kube-system".into()],
            critical_priority: 2_000_000_000,
            require_pod_info: false,
        },
    }
}
