//! Arming and re-arming the PSI triggers of the node and of kubepods.

use std::path::PathBuf;
use std::sync::mpsc::SyncSender;

use tokio::runtime::Handle;

use super::{psi, MonitorConfig, Paths, Wake};
use crate::node::layout::find_kubepods;

/// One PSI trigger target and its watcher tasks (each holds one trigger fd).
struct TriggerTarget {
    label: &'static str,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Not pollable (a plain file in a fake tree): do not retry.
    given_up: bool,
    /// A failure was logged at warn level already; later ones go to debug.
    warned: bool,
}

impl TriggerTarget {
    fn new(label: &'static str) -> Self {
        TriggerTarget {
            label,
            tasks: Vec::new(),
            given_up: false,
            warned: false,
        }
    }

    fn disarm(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// Armed PSI triggers on the node and on kubepods. kubepods is looked up
/// at every arming attempt, so a monitor started before the kubelet arms
/// it once the kubelet has created the cgroup.
pub(crate) struct Triggers {
    targets: Vec<TriggerTarget>,
    triggers: Vec<psi::Trigger>,
    paths: Paths,
    kubepods: String,
    tx: SyncSender<Wake>,
    /// The runtime whose reactor polls the trigger fds.
    rt: Handle,
}

impl Triggers {
    pub(crate) fn new(
        cfg: &MonitorConfig,
        paths: &Paths,
        tx: SyncSender<Wake>,
        rt: Handle,
    ) -> Self {
        let mut targets = Vec::new();
        if cfg.psi_node {
            targets.push(TriggerTarget::new("node"));
        }
        if cfg.psi_kubepods {
            targets.push(TriggerTarget::new("kubepods"));
        }
        // validate() already checked every trigger string.
        let triggers = cfg
            .psi_triggers
            .iter()
            .filter_map(|t| t.parse().ok())
            .collect();
        Triggers {
            targets,
            triggers,
            paths: paths.clone(),
            kubepods: cfg.kubepods.clone(),
            tx,
            rt,
        }
    }

    fn path_of(&self, label: &str) -> Option<PathBuf> {
        match label {
            "node" => Some(self.paths.node_psi()),
            _ => find_kubepods(&self.paths.cgroup_root, &self.kubepods)
                .map(|(kp, _)| kp.join("memory.pressure")),
        }
    }

    /// Arms every target that is not armed yet: all of its triggers or none.
    pub(crate) fn arm(&mut self) {
        for i in 0..self.targets.len() {
            let t = &self.targets[i];
            if !t.tasks.is_empty() || t.given_up || self.triggers.is_empty() {
                continue;
            }
            let label = t.label;
            let Some(path) = self.path_of(label) else {
                self.note_failure(i, &format!("{label}: cgroup not found"));
                continue;
            };
            if !psi::is_kernel_psi_file(&path) {
                tracing::warn!(psi_target = label, path = %path.display(),
                    "not on procfs/cgroup2 (fake tree?); no psi triggers, relying on check-interval");
                self.targets[i].given_up = true;
                continue;
            }
            let mut tasks = Vec::new();
            let mut failure = None;
            for trig in &self.triggers {
                let name = format!("{label}:{trig}");
                match psi::arm(&path, trig) {
                    Ok(f) => match psi::watch(name, f, self.tx.clone(), &self.rt) {
                        Ok(h) => tasks.push(h),
                        Err(e) => {
                            tracing::warn!(psi_target = label, path = %path.display(), error = %e,
                                "psi file not pollable (not a PSI file?); relying on check-interval");
                            self.targets[i].given_up = true;
                            failure = Some(String::new());
                            break;
                        }
                    },
                    Err(e) => {
                        failure = Some(e.to_string());
                        break;
                    }
                }
            }
            match failure {
                None => {
                    tracing::info!(psi_target = label, path = %path.display(),
                        triggers = ?self.triggers.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
                        "psi triggers armed");
                    self.targets[i].tasks = tasks;
                }
                Some(msg) => {
                    for h in tasks {
                        h.abort();
                    }
                    if !msg.is_empty() {
                        self.note_failure(i, &msg);
                    }
                }
            }
        }
    }

    fn note_failure(&mut self, i: usize, msg: &str) {
        let t = &mut self.targets[i];
        if t.warned {
            tracing::debug!(psi_target = t.label, error = msg, "cannot arm psi triggers");
        } else {
            tracing::warn!(
                psi_target = t.label,
                error = msg,
                "cannot arm psi triggers; relying on check-interval, retrying on ticks"
            );
            t.warned = true;
        }
    }

    /// A trigger reported POLLERR: drop the whole target, re-arm on a tick.
    pub(crate) fn lost(&mut self, source: &str) {
        let label = source.split(':').next().unwrap_or(source);
        for t in self.targets.iter_mut().filter(|t| t.label == label) {
            tracing::warn!(
                psi_target = t.label,
                "psi trigger source lost; re-arming on next tick"
            );
            t.disarm();
        }
    }

    pub(crate) fn armed(&self) -> usize {
        self.targets.iter().filter(|t| !t.tasks.is_empty()).count()
    }
}

impl Drop for Triggers {
    fn drop(&mut self) {
        for t in &mut self.targets {
            t.disarm();
        }
    }
}
