//! The hierarchy keeper: writes memory.min / memory.low of the pod-level,
//! QoS-level and kubepods cgroups so container-level protection is effective.
//!
//! Plain file I/O on an injected root rather than cgroups-rs: we only write
//! two files of cgroups the kubelet (or the runtime) already created, and an
//! injectable root lets every test run on a temp directory.
//!
//! Crash-safe by construction: targets are derived from the runtime's view
//! (rebuilt on every Synchronize) and current values are read back from the
//! tree, so a restart computes the same writes; writes are idempotent and a
//! failed one is retried on the next event or tick.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::plan::{self, PodProtection, Targets, Write};
use crate::node::cgroup_files::MEMORY_MIN;
use crate::node::cgroupfs::{read_populated, read_protection, Owner, Protection};
use crate::node::layout::{pod_cgroups, PodCgroups};
use crate::node::registry::{within_pod_limit, Registry};
use crate::node::{join_inside, UnsafePath};
use crate::qos::KubeletMemoryQos;

mod owner;
mod task;

use owner::{FoundValue, KubeletSignal};

pub use task::run;

/// `[hierarchy]` in `config/nri-qos.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct HierarchyConfig {
    /// Keep pod/QoS/kubepods protection in line with the containers' own.
    pub enabled: bool,
    /// Never protect more than this share of (MemTotal − reserve) in total.
    pub budget_share: f64,
    /// Bytes always left unprotected for the system, before the share applies.
    pub reserve_bytes: u64,
    /// Re-check the tree this often even without events (retries, drift).
    pub resync_seconds: u64,
}

impl Default for HierarchyConfig {
    fn default() -> Self {
        HierarchyConfig {
            enabled: true,
            budget_share: 0.9,
            reserve_bytes: 512 << 20,
            resync_seconds: 30,
        }
    }
}

#[derive(Debug, Error)]
pub enum KeeperError {
    #[error("cannot write {value} to {path}")]
    Write {
        path: PathBuf,
        value: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to write below the cgroup root")]
    Path(#[from] UnsafePath),
}

/// What one reconcile pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub written: usize,
    /// Cgroups whose protection the kubelet owns (never written).
    pub kubelet_owned: usize,
    pub failed: usize,
    /// Cgroups not (yet) on disk: retried next time.
    pub missing: usize,
    pub scaled: bool,
    pub requested: u64,
    pub budget: u64,
    /// The budget would have scaled every value to 0: nothing was written.
    pub refused: bool,
}

/// Running totals since start (for logs and metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeeperStats {
    pub passes: u64,
    pub writes: u64,
    pub failed_writes: u64,
}

/// Writes protection files below `root` (the cgroup v2 mount point).
pub struct Keeper {
    root: PathBuf,
    cfg: HierarchyConfig,
    mem_total: u64,
    warned_layouts: HashSet<String>,
    warned_budget: bool,
    warned_zero_budget: bool,
    stats: KeeperStats,
    kubelet_memory_qos: KubeletMemoryQos,
    /// Who owns each cgroup's protection, decided once (nri-qos may still
    /// give way to the kubelet, never the other way round).
    owners: HashMap<PathBuf, Owner>,
    /// What we last wrote, or found and took as ours, per cgroup: anything
    /// else appearing there was written by someone else.
    ours: HashMap<PathBuf, Protection>,
}

/// Bound on unknown pod cgroups considered per pass (a node runs ~110 pods).
const MAX_UNKNOWN_PODS: usize = 4096;

impl Keeper {
    pub fn new(root: PathBuf, cfg: HierarchyConfig, mem_total: u64) -> Self {
        Keeper {
            root,
            cfg,
            mem_total,
            warned_layouts: HashSet::new(),
            warned_budget: false,
            warned_zero_budget: false,
            stats: KeeperStats::default(),
            kubelet_memory_qos: KubeletMemoryQos::Auto,
            owners: HashMap::new(),
            ours: HashMap::new(),
        }
    }

    /// Ownership decided so far, per cgroup (relative to the root).
    pub fn owners(&self) -> &HashMap<PathBuf, Owner> {
        &self.owners
    }

    fn read_protection(&self, cg: &Path) -> Protection {
        read_protection(&self.root.join(cg))
    }

    pub fn stats(&self) -> KeeperStats {
        self.stats
    }

    /// Pod protection from the registry; unknown layouts are logged once.
    pub fn pods_from_registry(&mut self, reg: &Registry) -> Vec<PodProtection> {
        let mut per_pod: HashMap<&str, (u64, u64, bool)> = HashMap::new();
        for c in reg.containers.values() {
            let e = per_pod.entry(&*c.pod_id).or_default();
            e.0 = e.0.saturating_add(c.memory_min);
            e.1 = e.1.saturating_add(c.memory_low);
            e.2 |= c.kubelet_memory_qos;
        }
        // `[policy] kubelet-memory-qos` as in force: alpha/tiered give the
        // kubelet every pod, QoS and kubepods cgroup; none keeps them ours.
        self.kubelet_memory_qos = reg.kubelet_memory_qos;
        // The plugin decides pods it saw the kubelet protect before any container.
        for (cg, owner) in &reg.owners {
            if *owner == Owner::Kubelet {
                self.owners.insert(cg.clone(), Owner::Kubelet);
            }
        }
        let mut out = Vec::new();
        for (pod_id, pod) in &reg.pods {
            let parent = &pod.cgroup_parent;
            let Some(cgroups) = pod_cgroups(parent) else {
                if !parent.is_empty() && self.warned_layouts.insert(parent.to_string()) {
                    info!(cgroup_parent = %parent, pod = %pod.name, "not a kubelet cgroup layout; pod-level protection left alone");
                }
                continue;
            };
            let (min, low, kubelet) = per_pod.get(pod_id.as_str()).copied().unwrap_or_default();
            out.push(PodProtection {
                cgroups,
                memory_min: within_pod_limit(min, pod.memory_limit),
                memory_low: within_pod_limit(low, pod.memory_limit),
                kubelet,
            });
        }
        out
    }

    fn current(&self, cgroups: &BTreeMap<PathBuf, Protection>) -> BTreeMap<PathBuf, Protection> {
        cgroups
            .keys()
            .map(|cg| {
                let Ok(dir) = join_inside(&self.root, cg) else {
                    return (cg.clone(), Protection::default());
                };
                (cg.clone(), read_protection(&dir))
            })
            .collect()
    }

    fn write(&self, w: &Write) -> Result<(), KeeperError> {
        let path = join_inside(&self.root, &w.cgroup)?.join(w.file);
        std::fs::write(&path, w.value.to_string()).map_err(|source| KeeperError::Write {
            path,
            value: w.value,
            source,
        })
    }

    /// Pod cgroups on disk, under the kubepods cgroups of `known`, that
    /// `known` does not hold, with the protection they carry now. The
    /// runtime's view can be incomplete: containerd 1.7 never synchronizes a
    /// pre-launched plugin, so after a restart every running pod is unknown,
    /// and containers created during a sync can be missed. Leaving such pods
    /// out of their parents' sums would lower the parents below them, and
    /// the kernel caps a child's protection at its parent's.
    fn unknown_pods(&self, known: &[PodProtection]) -> Vec<PodProtection> {
        let known_paths: HashSet<&Path> = known.iter().map(|p| p.cgroups.pod.as_path()).collect();
        let roots: BTreeSet<&PathBuf> = known.iter().map(|p| &p.cgroups.kubepods).collect();
        let children = |dir: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(self.root.join(dir))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| dir.join(e.file_name()))
                .collect()
        };
        let mut out = Vec::new();
        for root in roots {
            // Guaranteed pods and the QoS cgroups sit in kubepods; the other
            // pods one level down. MAX_UNKNOWN_PODS bounds what we keep.
            let mut candidates = children(root);
            let nested: Vec<PathBuf> = candidates.iter().flat_map(|c| children(c)).collect();
            candidates.extend(nested);
            for path in candidates {
                if out.len() >= MAX_UNKNOWN_PODS || known_paths.contains(path.as_path()) {
                    continue;
                }
                let Some(cgroups) = path.to_str().and_then(pod_cgroups) else {
                    continue;
                };
                // Only a pod where its name says it belongs.
                if cgroups.pod != path || &cgroups.kubepods != root {
                    continue;
                }
                let dir = self.root.join(&path);
                // A pod that is gone but whose cgroup the kubelet has not
                // removed yet holds nothing to protect; counting it would
                // lend its share to the wrong siblings (memory_recursiveprot).
                // Unreadable counts as empty here: we only add protection
                // for pods we can see running.
                if !read_populated(&dir).unwrap_or(false) {
                    continue;
                }
                let Protection {
                    min: memory_min,
                    low: memory_low,
                } = read_protection(&dir);
                if memory_min > 0 || memory_low > 0 {
                    out.push(PodProtection {
                        cgroups,
                        memory_min,
                        memory_low,
                        kubelet: false,
                    });
                }
            }
        }
        out
    }

    /// One pass: compute targets, read what is there, write the difference
    /// in a safe order. Cgroups that do not exist yet are skipped; pods the
    /// runtime did not tell us about count in their parents' sums with what
    /// they carry, and are never written.
    pub fn reconcile(&mut self, pods: &[PodProtection]) -> PassReport {
        let budget = plan::budget(
            self.mem_total,
            self.cfg.reserve_bytes,
            self.cfg.budget_share,
        );
        self.forget_removed_cgroups();
        let unknown = self.unknown_pods(pods);
        if !unknown.is_empty() {
            debug!(
                pods = unknown.len(),
                "protected pod cgroups the runtime did not report; counted in their parents, left alone"
            );
        }
        let all: Vec<PodProtection> = pods.iter().chain(&unknown).cloned().collect();
        let kubelet_pods = self.decide_pod_owners(pods, &all, budget);
        let all = self.with_kubelets_values(all);
        let mut t = plan::targets(&all, budget);
        for p in &unknown {
            t.by_cgroup.remove(&p.cgroups.pod);
        }
        let missing = self.keep_existing(&mut t);
        self.decide_parent_owners(&t, &all, &kubelet_pods);
        let kubelet_owned = self.leave_the_kubelets(&mut t);
        self.warn_once_when_scaled(&t);
        if self.refuses_zero_budget(&t) {
            self.stats.passes += 1;
            return PassReport {
                missing,
                scaled: true,
                requested: t.requested,
                budget: t.budget,
                refused: true,
                ..Default::default()
            };
        }
        let mut report = PassReport {
            missing,
            kubelet_owned,
            scaled: t.scaled,
            requested: t.requested,
            budget: t.budget,
            ..Default::default()
        };
        self.write_targets(&t, &mut report);
        self.stats.passes += 1;
        self.stats.writes += report.written as u64;
        self.stats.failed_writes += report.failed as u64;
        report
    }

    /// Decisions about cgroups that are gone go with them.
    fn forget_removed_cgroups(&mut self) {
        let root = self.root.clone();
        self.owners.retain(|cg, _| root.join(cg).exists());
        self.ours.retain(|cg, _| root.join(cg).exists());
    }

    /// Pod cgroups first: the kubelet owns a pod when a container came with
    /// its Memory QoS, or the cgroup holds protection we did not write
    /// (checked from the start: the kubelet writes a pod's values before its
    /// sandbox exists, and our own value from before a restart is never
    /// above what we would write now). Returns the kubelet's pods.
    fn decide_pod_owners(
        &mut self,
        pods: &[PodProtection],
        all: &[PodProtection],
        budget: u64,
    ) -> Vec<PodCgroups> {
        let first = plan::targets(all, budget);
        let unscaled = plan::targets(all, u64::MAX);
        let mut kubelet_pods = Vec::new();
        for p in pods {
            let cg = &p.cgroups.pod;
            if !self.root.join(cg).join(MEMORY_MIN).exists() {
                continue;
            }
            let current = self.read_protection(cg);
            let targets =
                [&first, &unscaled].map(|t| t.by_cgroup.get(cg).copied().unwrap_or_default());
            let signal = if p.kubelet {
                KubeletSignal::Present
            } else {
                KubeletSignal::Absent
            };
            let found = FoundValue::KubeletsIfAboveTargets;
            if self.decide_owner(cg, signal, current, &targets, found) == Owner::Kubelet {
                kubelet_pods.push(p.cgroups.clone());
            }
        }
        kubelet_pods
    }

    /// Kubelet-owned pods count in their parents with what they carry.
    fn with_kubelets_values(&self, all: Vec<PodProtection>) -> Vec<PodProtection> {
        all.into_iter()
            .map(|mut p| {
                if self.owners.get(&p.cgroups.pod) == Some(&Owner::Kubelet) {
                    let cur = self.read_protection(&p.cgroups.pod);
                    p.memory_min = cur.min;
                    p.memory_low = cur.low;
                }
                p
            })
            .collect()
    }

    /// Only cgroups that exist: we never create what the kubelet owns.
    /// Returns how many targets were dropped for a missing cgroup.
    fn keep_existing(&self, t: &mut Targets) -> usize {
        let mut missing = 0;
        t.by_cgroup.retain(|cg, _| {
            let exists = join_inside(&self.root, cg).is_ok_and(|d| d.join(MEMORY_MIN).exists());
            if !exists {
                missing += 1;
            }
            exists
        });
        missing
    }

    /// QoS and kubepods: the kubelet's as soon as one of its pods is, or
    /// once a value we wrote there changes under us.
    fn decide_parent_owners(
        &mut self,
        t: &Targets,
        all: &[PodProtection],
        kubelet_pods: &[PodCgroups],
    ) {
        let parents = t
            .by_cgroup
            .iter()
            .filter(|(cg, _)| all.iter().all(|p| &p.cgroups.pod != *cg));
        for (cg, want) in parents {
            let signal = if kubelet_pods
                .iter()
                .any(|p| &p.kubepods == cg || p.qos.as_ref() == Some(cg))
            {
                KubeletSignal::Present
            } else {
                KubeletSignal::Absent
            };
            let current = self.read_protection(cg);
            self.decide_owner(cg, signal, current, &[*want], FoundValue::Adopted);
        }
    }

    /// Drops the targets of cgroups the kubelet owns; returns how many.
    fn leave_the_kubelets(&self, t: &mut Targets) -> usize {
        let before = t.by_cgroup.len();
        t.by_cgroup
            .retain(|cg, _| self.owners.get(cg) != Some(&Owner::Kubelet));
        before - t.by_cgroup.len()
    }

    /// Says once that the budget scales protection down, again after it
    /// stopped doing so.
    fn warn_once_when_scaled(&mut self, t: &Targets) {
        if t.scaled && !self.warned_budget {
            warn!(
                requested = t.requested,
                budget = t.budget,
                "memory requests exceed the protection budget; scaling pod and QoS protection down proportionally"
            );
            self.warned_budget = true;
        } else if !t.scaled {
            self.warned_budget = false;
        }
    }

    /// A budget that scales everything to 0 is a misconfiguration (or a
    /// bug), never a reason to strip every pod of its protection: true when
    /// this pass must write nothing for that reason.
    fn refuses_zero_budget(&mut self, t: &Targets) -> bool {
        let all_zero =
            !t.by_cgroup.is_empty() && t.by_cgroup.values().all(|p| p.min == 0 && p.low == 0);
        if !(t.scaled && all_zero) {
            self.warned_zero_budget = false;
            return false;
        }
        if !self.warned_zero_budget {
            error!(
                requested = t.requested,
                budget = t.budget,
                mem_total = self.mem_total,
                reserve_bytes = self.cfg.reserve_bytes,
                budget_share = self.cfg.budget_share,
                "the protection budget leaves nothing to protect; keeping the current pod and QoS protection instead of lowering it to 0"
            );
            self.warned_zero_budget = true;
        }
        true
    }

    /// Writes the difference between `t` and the tree in a safe order,
    /// counting writes and failures in `report`.
    fn write_targets(&mut self, t: &Targets, report: &mut PassReport) {
        let current = self.current(&t.by_cgroup);
        for w in plan::ordered_writes(&t.by_cgroup, &current) {
            match self.write(&w) {
                Ok(()) => {
                    let ours = self.ours.entry(w.cgroup.clone()).or_default();
                    if w.file == MEMORY_MIN {
                        ours.min = w.value;
                    } else {
                        ours.low = w.value;
                    }
                    debug!(cgroup = %w.cgroup.display(), file = w.file, value = w.value, "protection written");
                    report.written += 1;
                }
                Err(e) => {
                    warn!(error = %e, "protection write failed; retrying on the next pass");
                    report.failed += 1;
                }
            }
        }
    }
}

/// For tests and `audit`: the pod cgroups a registry implies.
pub fn layouts(reg: &Registry) -> Vec<PodCgroups> {
    reg.pods
        .values()
        .filter_map(|p| pod_cgroups(&p.cgroup_parent))
        .collect()
}

#[cfg(test)]
// Tests cast small, known values; the cast lints guard the product code.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::node::registry::{ContainerRecord, PodRecord};
    use crate::qos::QosClass;
    use std::collections::BTreeMap;

    /// A memory.min/low value as the kernel shows it (`max` = u64::MAX).
    fn read_value(path: &Path) -> Option<u64> {
        let v = crate::node::cgroupfs::read_single(path).ok()?;
        Some(v.unwrap_or(u64::MAX))
    }

    fn tree(root: &Path, dirs: &[&str]) {
        for d in dirs {
            let p = root.join(d);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("memory.min"), "0\n").unwrap();
            std::fs::write(p.join("memory.low"), "0\n").unwrap();
        }
    }

    /// A keeper on the temp tree `root` of a 16 GiB node, default settings.
    fn keeper(root: &Path) -> Keeper {
        Keeper::new(root.to_path_buf(), HierarchyConfig::default(), 16 << 30)
    }

    /// One pass over the pods `reg` holds.
    fn pass(k: &mut Keeper, reg: &Registry) -> PassReport {
        let pods = k.pods_from_registry(reg);
        k.reconcile(&pods)
    }

    fn read(root: &Path, cg: &str, file: &str) -> u64 {
        read_value(&root.join(cg).join(file)).unwrap()
    }

    fn registry(entries: &[(&str, &str, u64, u64)]) -> Registry {
        let mut reg = Registry::default();
        for (i, (pod, parent, min, low)) in entries.iter().enumerate() {
            reg.pods.insert(
                pod.to_string(),
                PodRecord {
                    id: (*pod).into(),
                    name: (*pod).into(),
                    cgroup_parent: (*parent).into(),
                    ..Default::default()
                },
            );
            reg.containers.insert(
                format!("c{i}"),
                ContainerRecord {
                    id: format!("c{i}").into(),
                    pod_id: (*pod).into(),
                    name: format!("c{i}").into(),
                    class: QosClass::Burstable,
                    memory_request: None,
                    request_source: crate::qos::RequestSource::Unknown,
                    memory_min: *min,
                    memory_low: *low,
                    memory_high: 0,
                    kubelet_memory_qos: false,
                    oom_score_adj: None,
                    cgroups_path: "".into(),
                },
            );
        }
        reg
    }

    #[test]
    fn cgroupfs_tree_gets_sums_and_removal_lowers_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(
            root,
            &[
                "kubepods",
                "kubepods/burstable",
                "kubepods/besteffort",
                "kubepods/poda",
                "kubepods/burstable/podb",
            ],
        );
        let mut k = keeper(root);
        let mut reg = registry(&[
            ("a", "/kubepods/poda", 1 << 30, 0),
            ("b", "/kubepods/burstable/podb", 0, 256 << 20),
            ("b", "/kubepods/burstable/podb", 0, 256 << 20),
        ]);
        let pods = k.pods_from_registry(&reg);
        let r = k.reconcile(&pods);
        assert_eq!(r.failed, 0);
        assert_eq!(read(root, "kubepods", "memory.min"), 1 << 30);
        assert_eq!(read(root, "kubepods", "memory.low"), 512 << 20);
        assert_eq!(read(root, "kubepods/burstable", "memory.low"), 512 << 20);
        assert_eq!(
            read(root, "kubepods/burstable/podb", "memory.low"),
            512 << 20
        );
        assert_eq!(read(root, "kubepods/poda", "memory.min"), 1 << 30);

        // A second pass changes nothing (idempotent).
        let r = k.reconcile(&pods);
        assert_eq!(r.written, 0);

        // Pod a goes away: its protection leaves kubepods too.
        reg.pods.remove("a");
        reg.containers.retain(|_, c| &*c.pod_id != "a");
        pass(&mut k, &reg);
        assert_eq!(read(root, "kubepods", "memory.min"), 0);
        assert_eq!(read(root, "kubepods", "memory.low"), 512 << 20);
    }

    /// Containers inheriting their pod's limit (pod-level resources) each
    /// ask for it whole; the pod and its parents get no more than the pod
    /// may hold, and follow the limit when the pod is resized.
    #[test]
    fn a_pods_protection_stops_at_its_memory_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root, &["kubepods", "kubepods/podg"]);
        let mut k = keeper(root);
        let mut reg = registry(&[
            ("g", "/kubepods/podg", 1 << 30, 0),
            ("g", "/kubepods/podg", 1 << 30, 0),
        ]);
        pass(&mut k, &reg);
        assert_eq!(read(root, "kubepods/podg", "memory.min"), 2 << 30);
        reg.pods.get_mut("g").unwrap().memory_limit = Some(1 << 30);
        pass(&mut k, &reg);
        assert_eq!(read(root, "kubepods/podg", "memory.min"), 1 << 30);
        assert_eq!(read(root, "kubepods", "memory.min"), 1 << 30);
        reg.pods.get_mut("g").unwrap().memory_limit = Some(3 << 29);
        pass(&mut k, &reg);
        assert_eq!(read(root, "kubepods/podg", "memory.min"), 3 << 29);
        assert_eq!(read(root, "kubepods", "memory.min"), 3 << 29);
    }

    #[test]
    fn systemd_tree_and_restart_recompute_the_same_values() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(
            root,
            &[
                "kubepods.slice",
                "kubepods.slice/kubepods-burstable.slice",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice",
            ],
        );
        let reg = registry(&[("x", "kubepods-burstable-podx.slice", 0, 100 << 20)]);
        let mut k = keeper(root);
        pass(&mut k, &reg);
        assert_eq!(read(root, "kubepods.slice", "memory.low"), 100 << 20);
        // A new keeper (plugin restart) finds nothing to do.
        let mut k2 = keeper(root);
        assert_eq!(pass(&mut k2, &reg).written, 0);
    }

    #[test]
    fn missing_cgroups_and_unknown_layouts_are_skipped_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root, &["kubepods"]);
        let reg = registry(&[
            ("a", "/kubepods/burstable/poda", 0, 40960),
            ("b", "/my/custom/parent", 0, 40960),
        ]);
        let mut k = keeper(root);
        let pods = k.pods_from_registry(&reg);
        assert_eq!(pods.len(), 1);
        let r = k.reconcile(&pods);
        assert_eq!(r.missing, 2);
        assert!(!root.join("kubepods/burstable").exists());
        assert_eq!(read(root, "kubepods", "memory.low"), 40960);
    }

    /// A pod cgroup the runtime did not report, carrying `min`/`low`.
    fn unknown_pod(root: &Path, cg: &str, min: u64, low: u64, populated: bool) {
        tree(root, &[cg]);
        std::fs::write(root.join(cg).join("memory.min"), min.to_string()).unwrap();
        std::fs::write(root.join(cg).join("memory.low"), low.to_string()).unwrap();
        let events = format!("populated {}\nfrozen 0\n", u8::from(populated));
        std::fs::write(root.join(cg).join("cgroup.events"), events).unwrap();
    }

    #[test]
    fn pods_the_runtime_did_not_report_keep_their_parents_protection() {
        // containerd 1.7 never synchronizes a pre-launched plugin: after a
        // restart it learns only of new pods, while older ones still run
        // with the protection an earlier plugin process gave them.
        for (kubepods, qos, known_parent, old, gone, guaranteed) in [
            (
                "kubepods",
                "kubepods/burstable",
                "/kubepods/burstable/podnew",
                "kubepods/burstable/podold",
                "kubepods/burstable/podgone",
                "kubepods/podg",
            ),
            (
                "kubepods.slice",
                "kubepods.slice/kubepods-burstable.slice",
                "kubepods-burstable-podnew.slice",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podold.slice",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podgone.slice",
                "kubepods.slice/kubepods-podg.slice",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            tree(root, &[kubepods, qos]);
            let new_pod = pod_cgroups(known_parent).unwrap().pod;
            tree(root, &[new_pod.to_str().unwrap()]);
            unknown_pod(root, old, 0, 300 << 20, true);
            unknown_pod(root, guaranteed, 1 << 30, 0, true);
            // removed by the runtime, cgroup not yet by the kubelet: empty
            unknown_pod(root, gone, 0, 500 << 20, false);
            let reg = registry(&[("new", known_parent, 0, 100 << 20)]);
            let mut k = keeper(root);
            let pods = k.pods_from_registry(&reg);
            let r = k.reconcile(&pods);
            assert_eq!(r.failed, 0, "{kubepods}");
            assert_eq!(read(root, qos, "memory.low"), 400 << 20, "{kubepods}");
            assert_eq!(read(root, kubepods, "memory.low"), 400 << 20, "{kubepods}");
            assert_eq!(read(root, kubepods, "memory.min"), 1 << 30, "{kubepods}");
            // Unknown pods are read, never written.
            assert_eq!(read(root, old, "memory.low"), 300 << 20, "{kubepods}");
            assert_eq!(read(root, gone, "memory.low"), 500 << 20, "{kubepods}");
            let new_pod = new_pod.to_str().unwrap();
            assert_eq!(read(root, new_pod, "memory.low"), 100 << 20, "{kubepods}");

            // Once the old pod's cgroup is gone, its share leaves the parents.
            std::fs::remove_dir_all(root.join(old)).unwrap();
            k.reconcile(&pods);
            assert_eq!(read(root, qos, "memory.low"), 100 << 20, "{kubepods}");
        }
    }

    #[test]
    fn a_failed_write_is_counted_and_retried() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root, &["kubepods", "kubepods/poda"]);
        // A directory where the file should be makes the write fail.
        std::fs::remove_file(root.join("kubepods/poda/memory.low")).unwrap();
        std::fs::create_dir(root.join("kubepods/poda/memory.low")).unwrap();
        let reg = registry(&[("a", "/kubepods/poda", 0, 40960)]);
        let mut k = keeper(root);
        let pods = k.pods_from_registry(&reg);
        assert_eq!(k.reconcile(&pods).failed, 1);
        std::fs::remove_dir(root.join("kubepods/poda/memory.low")).unwrap();
        std::fs::write(root.join("kubepods/poda/memory.low"), "0").unwrap();
        let r = k.reconcile(&pods);
        assert_eq!(r.failed, 0);
        assert_eq!(read(root, "kubepods/poda", "memory.low"), 40960);
        assert_eq!(k.stats().failed_writes, 1);
    }

    /// A tiny deterministic generator: the test replays the same 10,000 steps.
    struct XorShift(u64);
    impl XorShift {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    #[test]
    fn a_kubelet_writing_at_random_times_is_never_overwritten_and_other_pods_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(
            root,
            &["kubepods", "kubepods/burstable", "kubepods/besteffort"],
        );
        // Room for every pod: the budget never scales (another test covers that).
        let mut k = Keeper::new(root.to_path_buf(), HierarchyConfig::default(), 1 << 40);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut reg = Registry::default();
        // Kubelet pods: cgroup -> (guaranteed, request). Its files and the
        // values it last wrote there (or found when it took them over).
        let mut kubelet_pods: BTreeMap<String, (bool, u64)> = BTreeMap::new();
        let mut kubelet_files: BTreeMap<PathBuf, u64> = BTreeMap::new();
        let mut kubelet_started = false;
        let (mut next, mut passes, mut checked_kept) = (0u64, 0u64, 0u64);
        let file = |cg: &str, f: &str| root.join(cg).join(f);
        for step in 0..10_000 {
            // About 20 pods at a time, like a busy node's churn.
            let mut action = rng.below(11);
            if action <= 2 && reg.pods.len() >= 24 {
                action = 3;
            }
            match action {
                // The kubelet creates a protected pod: cgroup and value before the sandbox.
                0 | 1 => {
                    next += 1;
                    let guaranteed = rng.below(3) == 0;
                    let req = (1 + rng.below(512)) << 20;
                    let (parent, f) = if guaranteed {
                        (format!("/kubepods/podk{next}"), "memory.min")
                    } else {
                        (format!("/kubepods/burstable/podk{next}"), "memory.low")
                    };
                    let cg = parent.trim_start_matches('/').to_string();
                    tree(root, &[&cg]);
                    std::fs::write(file(&cg, f), req.to_string()).unwrap();
                    std::fs::write(file(&cg, "cgroup.events"), "populated 1\n").unwrap();
                    kubelet_files.insert(file(&cg, "memory.min"), if guaranteed { req } else { 0 });
                    kubelet_files.insert(file(&cg, "memory.low"), if guaranteed { 0 } else { req });
                    if !kubelet_started {
                        kubelet_started = true;
                        for qos in ["kubepods", "kubepods/burstable"] {
                            for f in ["memory.min", "memory.low"] {
                                let v = read(root, qos, f);
                                kubelet_files.insert(file(qos, f), v);
                            }
                        }
                    }
                    kubelet_pods.insert(cg, (guaranteed, req));
                    // Half the runtimes show the kubelet's keys (containerd
                    // 2.2+); the others hide them and the policy stays off.
                    let visible = rng.below(2) == 0;
                    let mut one = registry(&[(&format!("k{next}"), &parent, 0, 0)]);
                    for c in one.containers.values_mut() {
                        c.id = format!("k{next}").into();
                        c.kubelet_memory_qos = visible;
                        if visible {
                            (c.memory_min, c.memory_low) =
                                if guaranteed { (req, 0) } else { (0, req) };
                        }
                    }
                    reg.pods.extend(one.pods);
                    reg.containers
                        .extend(one.containers.into_values().map(|c| (c.id.to_string(), c)));
                }
                // A pod the kubelet does not protect: nri-qos's alone.
                2 => {
                    next += 1;
                    let parent = format!("/kubepods/burstable/podu{next}");
                    tree(root, &[parent.trim_start_matches('/')]);
                    let low = (1 + rng.below(256)) << 20;
                    let one = registry(&[(&format!("u{next}"), &parent, 0, low)]);
                    reg.pods.extend(one.pods);
                    for (_, mut c) in one.containers {
                        c.id = format!("u{next}").into();
                        reg.containers.insert(c.id.to_string(), c);
                    }
                }
                // A pod goes away (the kubelet removes its cgroup).
                3 | 4 => {
                    let ids: Vec<String> = reg.pods.keys().cloned().collect();
                    if let Some(id) = ids.get(rng.below(ids.len() as u64) as usize) {
                        let cg = pod_cgroups(&reg.pods[id].cgroup_parent).unwrap().pod;
                        reg.pods.remove(id);
                        reg.containers.retain(|_, c| *c.pod_id != **id);
                        std::fs::remove_dir_all(root.join(&cg)).unwrap();
                        let cg = cg.to_str().unwrap().to_string();
                        kubelet_pods.remove(&cg);
                        kubelet_files.retain(|f, _| !f.starts_with(root.join(&cg)));
                    }
                }
                // The kubelet's QoS reconcile writes its own sums.
                5 if kubelet_started => {
                    let g: u64 = kubelet_pods
                        .values()
                        .filter(|(g, _)| *g)
                        .map(|(_, r)| r)
                        .sum();
                    let b: u64 = kubelet_pods
                        .values()
                        .filter(|(g, _)| !*g)
                        .map(|(_, r)| r)
                        .sum();
                    for (f, v) in [
                        (file("kubepods", "memory.min"), g + b),
                        (file("kubepods/burstable", "memory.low"), b),
                    ] {
                        std::fs::write(&f, v.to_string()).unwrap();
                        kubelet_files.insert(f, v);
                    }
                }
                // A keeper pass (an event or the resync tick).
                _ => {
                    let pods = k.pods_from_registry(&reg);
                    let r = k.reconcile(&pods);
                    assert_eq!(r.failed, 0, "step {step}");
                    passes += 1;
                    for (f, want) in &kubelet_files {
                        let have = read_value(f).unwrap();
                        assert_eq!(
                            have,
                            *want,
                            "step {step}: nri-qos wrote the kubelet's {}",
                            f.display()
                        );
                    }
                    // Pods the kubelet does not protect carry their containers' sum.
                    for (id, p) in &reg.pods {
                        if !id.starts_with('u') {
                            continue;
                        }
                        let cg = pod_cgroups(&p.cgroup_parent).unwrap().pod;
                        let want: u64 = reg
                            .containers
                            .values()
                            .filter(|c| *c.pod_id == **id)
                            .map(|c| c.memory_low)
                            .sum();
                        assert_eq!(
                            read(root, cg.to_str().unwrap(), "memory.low"),
                            want,
                            "step {step}: {id}"
                        );
                        checked_kept += 1;
                    }
                }
            }
        }
        assert!(
            passes > 2500 && checked_kept > 1000,
            "{passes} passes, {checked_kept} kept pods checked"
        );
        assert!(k.owners().values().any(|o| *o == Owner::Kubelet));
    }

    #[test]
    fn a_restart_under_a_changed_budget_scale_keeps_our_own_pods() {
        // Our scaled values from before a restart are below what we would
        // write now; they must not look like the kubelet's.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(
            root,
            &[
                "kubepods",
                "kubepods/burstable",
                "kubepods/poda",
                "kubepods/burstable/podb",
            ],
        );
        let cfg = HierarchyConfig {
            budget_share: 0.5,
            reserve_bytes: 0,
            ..Default::default()
        };
        let mut reg = registry(&[("a", "/kubepods/poda", 3 << 30, 0)]);
        let mut k = Keeper::new(root.to_path_buf(), cfg.clone(), 4 << 30);
        let pods = k.pods_from_registry(&reg);
        assert!(k.reconcile(&pods).scaled);
        // Restart; meanwhile another pod came, so the scale differs.
        let more = registry(&[("b", "/kubepods/burstable/podb", 0, 1 << 30)]);
        reg.pods.extend(more.pods);
        reg.containers
            .extend(more.containers.into_values().map(|mut c| {
                c.id = "cb".into();
                (c.id.to_string(), c)
            }));
        let mut k2 = Keeper::new(root.to_path_buf(), cfg, 4 << 30);
        let r = pass(&mut k2, &reg);
        assert_eq!(r.kubelet_owned, 0, "{:?}", k2.owners());
        assert!(k2.owners().values().all(|o| *o == Owner::NriQos));
        assert_eq!(
            read(root, "kubepods/poda", "memory.min")
                + read(root, "kubepods/burstable/podb", "memory.low"),
            2 << 30
        );
    }

    #[test]
    fn the_operators_setting_decides_without_detection() {
        for (setting, written) in [
            (KubeletMemoryQos::Tiered, 0),
            (KubeletMemoryQos::Alpha, 0),
            (KubeletMemoryQos::None, 3),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            tree(
                root,
                &["kubepods", "kubepods/burstable", "kubepods/burstable/poda"],
            );
            let mut reg = registry(&[("a", "/kubepods/burstable/poda", 0, 40960)]);
            reg.kubelet_memory_qos = setting;
            let mut k = keeper(root);
            assert_eq!(pass(&mut k, &reg).written, written, "{setting:?}");
        }
    }

    #[test]
    fn writes_never_leave_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cg");
        tree(&root, &["kubepods"]);
        tree(dir.path(), &["outside"]);
        let k = Keeper::new(root.clone(), HierarchyConfig::default(), 16 << 30);
        for cg in ["../outside", "kubepods/../../outside"] {
            let w = Write {
                cgroup: PathBuf::from(cg),
                file: "memory.min",
                value: 4096,
            };
            assert!(matches!(k.write(&w), Err(KeeperError::Path(_))), "{cg}");
        }
        assert_eq!(read(dir.path(), "outside", "memory.min"), 0);
    }

    #[test]
    fn a_zero_budget_never_strips_protection() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root, &["kubepods", "kubepods/poda"]);
        let reg = registry(&[("a", "/kubepods/poda", 1 << 30, 0)]);
        let mut k = keeper(root);
        let pods = k.pods_from_registry(&reg);
        k.reconcile(&pods);
        assert_eq!(read(root, "kubepods/poda", "memory.min"), 1 << 30);
        // nan, a negative share, or a reserve above MemTotal: budget 0.
        for cfg in [
            HierarchyConfig {
                budget_share: f64::NAN,
                ..Default::default()
            },
            HierarchyConfig {
                budget_share: -1.0,
                ..Default::default()
            },
            HierarchyConfig {
                reserve_bytes: 32 << 30,
                ..Default::default()
            },
        ] {
            let mut k = Keeper::new(root.to_path_buf(), cfg, 16 << 30);
            let r = k.reconcile(&pods);
            assert!(r.refused && r.written == 0, "{r:?}");
            assert_eq!(read(root, "kubepods", "memory.min"), 1 << 30);
            assert_eq!(read(root, "kubepods/poda", "memory.min"), 1 << 30);
        }
    }

    #[test]
    fn budget_caps_the_total() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root, &["kubepods", "kubepods/poda"]);
        let reg = registry(&[("a", "/kubepods/poda", 8 << 30, 0)]);
        let cfg = HierarchyConfig {
            budget_share: 0.5,
            reserve_bytes: 0,
            ..Default::default()
        };
        let mut k = Keeper::new(root.to_path_buf(), cfg, 4 << 30);
        let r = pass(&mut k, &reg);
        assert!(r.scaled);
        assert_eq!(read(root, "kubepods", "memory.min"), 2 << 30);
    }
}
