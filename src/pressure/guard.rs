//! The throttle guard's pass over the tree (the I/O edge of [`throttle`]):
//! which cgroups to read, and acting on the guard's decisions with the
//! monitor's relax route and its one kill path.
//!
//! Cost while nothing is throttled: the `memory.events` and `memory.pressure`
//! of the two QoS parents (Burstable, BestEffort), four small reads per full
//! step. Their counters are hierarchical, so a class is descended into only
//! when some container below it hit its memory.high or memory.max since the
//! last look, its PSI is above threshold, or a container below is watched.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use super::throttle::{self, Decision, Sample, Signal};
use super::{act, rank, Cause, Monitor, StepReport, Wake};
use crate::node::cluster::RelaxNotice;
use crate::node::layout::Driver;
use crate::qos::QosClass;

impl Monitor {
    /// One look at every container worth watching; relaxes or evicts.
    pub(super) fn throttle_pass(&mut self, wake: &Wake, now: Duration, report: &mut StepReport) {
        let Some((kp, driver)) = self.kubepods() else {
            return;
        };
        let samples = self.throttle_samples(&kp, driver, now);
        let cfg = self.cfg.throttle.clone();
        let dry_run = self.cfg.dry_run || cfg.dry_run;
        let mut evict: HashMap<String, Signal> = HashMap::new();
        for s in &samples {
            let decision = self.guard.observe(now, s);
            let signals = self.guard.signals(&s.path).unwrap_or_default();
            let log = |what: &str, route: &str| {
                tracing::warn!(
                    action = what,
                    route,
                    pod = %s.pod_uid,
                    container = %s.id,
                    class = ?s.class,
                    high_rate = signals.high_rate,
                    high_rate_threshold = cfg.high_rate,
                    max_rate = signals.max_rate,
                    max_rate_threshold = cfg.max_rate,
                    psi_some_avg10 = signals.psi_some_avg10,
                    psi_threshold = cfg.psi_some_avg10,
                    grace = %cfg.grace_period,
                    memory_high = %throttle::high_value(s.high),
                    memory_max = %throttle::high_value(s.max),
                    dry_run,
                    path = %s.path.display(),
                    "memory.high throttle decision"
                )
            };
            match decision {
                Decision::Throttled { for_ } if for_.is_zero() => {
                    tracing::info!(
                        pod = %s.pod_uid,
                        container = %s.id,
                        class = ?s.class,
                        high_rate = signals.high_rate,
                        max_rate = signals.max_rate,
                        psi_some_avg10 = signals.psi_some_avg10,
                        grace = %cfg.grace_period,
                        "container under memory.high throttle; grace period starts"
                    );
                }
                Decision::Calm | Decision::Throttled { .. } | Decision::Settling => {}
                Decision::Relax => {
                    if act::pause_only(&s.path, &self.paths.proc_root) {
                        continue;
                    }
                    report.relaxed.push(s.path.clone());
                    if dry_run {
                        log("relax", "dry-run");
                        continue;
                    }
                    match self.relaxer.relax(&s.relax_request()) {
                        Ok(route) => {
                            log("relax", route);
                            if let Some(m) = &self.metrics {
                                m.inc_throttle_relaxed(&format!("{:?}", s.class));
                            }
                            self.tell_relaxed(s, &signals, &cfg.grace_period.to_string());
                        }
                        // Stage 1 failed: stage 2 follows if the throttle holds.
                        Err(e) => {
                            log("relax-failed", "none");
                            tracing::warn!(error = %e, "cannot relax memory.high");
                        }
                    }
                }
                Decision::Evict { signal } => {
                    log("evict-candidate", "ranking");
                    evict.entry(s.pod_uid.clone()).or_insert(signal);
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.set_throttle_under(self.guard.under_throttle());
        }
        if !evict.is_empty() {
            self.throttle_evict(wake, now, &evict, report);
        }
    }

    /// An Event on the pod through the API server, when one is configured
    /// and knows the pod (in the background: the guard never waits on it).
    fn tell_relaxed(&self, s: &Sample, signals: &throttle::Signals, grace: &str) {
        let (Some(api), Some(pod)) = (&self.cluster, self.pods.get(&s.pod_uid)) else {
            return;
        };
        api.memory_high_relaxed(RelaxNotice {
            uid: pod.uid,
            namespace: pod.namespace,
            name: pod.name,
            container_id: s.id.clone(),
            from: throttle::high_value(s.high),
            to: s.relax_request().value,
            high_rate: signals.high_rate,
            psi_some_avg10: signals.psi_some_avg10,
            grace: grace.to_string(),
        });
    }

    /// Reads the containers worth reading; tells the guard the rest are quiet.
    fn throttle_samples(
        &mut self,
        kp: &std::path::Path,
        driver: Driver,
        now: Duration,
    ) -> Vec<Sample> {
        let psi_threshold = self.cfg.throttle.psi_some_avg10;
        let mut samples = Vec::new();
        // What this pass saw, so tracked containers it did not read are
        // judged without a syscall each: under a skipped parent or an
        // unmoved pod they are quiet; anywhere else they are gone.
        let mut quiet_under: HashSet<PathBuf> = HashSet::new();
        let mut listed: HashSet<PathBuf> = HashSet::new();
        let mut pods = None;
        for class in [QosClass::Burstable, QosClass::BestEffort] {
            let Some(parent) = throttle::qos_parent(kp, driver, class) else {
                continue;
            };
            let moved = self.throttle_filter.moved(&parent, psi_threshold);
            if !moved && !self.guard.busy_under(&parent) {
                quiet_under.insert(parent);
                continue;
            }
            listed.insert(parent);
            let pods = pods.get_or_insert_with(|| self.discovery.scan(kp, driver));
            for pod in pods
                .iter()
                .filter(|p| p.class == class)
                .take(super::MAX_PODS)
            {
                listed.insert(pod.path.clone());
                let moved = self.throttle_filter.moved(&pod.path, psi_threshold);
                if !moved && !self.guard.busy_under(&pod.path) {
                    quiet_under.insert(pod.path.clone());
                    continue;
                }
                for cg in throttle::containers_of(&pod.path) {
                    let Some(s) = throttle::read_container(&cg, &pod.uid, &pod.path, class) else {
                        continue;
                    };
                    // Only containers with a finite memory.high or a limit to
                    // hit (or already watched) are worth a decision.
                    if s.high.is_none() && s.max.is_none() && !self.guard.is_tracked(&cg) {
                        continue;
                    }
                    samples.push(s);
                }
            }
        }
        let sampled: HashSet<&PathBuf> = samples.iter().map(|s| &s.path).collect();
        for p in self.guard.tracked() {
            if sampled.contains(&p) {
                continue;
            }
            // A container cgroup sits in its pod, the pod in its QoS parent.
            let pod = p.parent();
            let parent = pod.and_then(|x| x.parent());
            if [pod, parent]
                .into_iter()
                .flatten()
                .any(|x| quiet_under.contains(x))
            {
                self.guard.quiet(now, &p);
            } else {
                self.guard.forget(&p);
            }
        }
        // Pods that went away are forgotten once a pass listed them.
        if pods.is_some() {
            self.throttle_filter.retain(|p| {
                listed.contains(p)
                    || quiet_under.contains(p)
                    || p.parent().is_some_and(|x| quiet_under.contains(x))
            });
        }
        samples
    }

    /// Stage 2: the throttled pods are candidates in the node-pressure
    /// ranking (same order, same exclusions); the first one is killed on
    /// the node path's safeguards (one kill in flight, cooldown, pause-only
    /// and stuck pods skipped, a last look that it is still populated).
    fn throttle_evict(
        &mut self,
        wake: &Wake,
        now: Duration,
        pods: &HashMap<String, Signal>,
        report: &mut StepReport,
    ) {
        if self.decider.holding(now) || self.victim.is_some() {
            tracing::debug!("throttle eviction waits for the kill in flight or its cooldown");
            return;
        }
        let cands: Vec<rank::Candidate> = self
            .candidates(false)
            .into_iter()
            .filter(|c| c.class != QosClass::Guaranteed && pods.contains_key(&c.uid))
            .collect();
        let ranking = rank::rank(&cands, &self.policy);
        let proc_root = &self.paths.proc_root;
        let stuck = &self.stuck;
        let top = ranking.order.iter().copied().find(|&i| {
            !stuck.contains(&cands[i].path) && !act::pause_only(&cands[i].path, proc_root)
        });
        let Some(top) = top else {
            tracing::info!(
                candidates = pods.len(),
                excluded = ranking.excluded.len(),
                "memory.high throttle persists but no pod may be evicted (critical, pause-only or unknown)"
            );
            return;
        };
        let victim = cands[top].clone();
        let signal = pods[&victim.uid];
        if !act::populated(&victim.path) {
            return;
        }
        tracing::warn!(
            victim = %victim.uid,
            namespace = victim.namespace.as_deref().unwrap_or("?"),
            name = victim.name.as_deref().unwrap_or("?"),
            class = ?victim.class,
            priority = victim.priority.unwrap_or(0),
            signal = signal.label(),
            ranking = %Self::ranking_brief(&cands, &ranking),
            path = %victim.path.display(),
            dry_run = self.cfg.dry_run || self.cfg.throttle.dry_run,
            "killing pod: memory.high throttle persists"
        );
        if self.cfg.throttle.dry_run && !self.cfg.dry_run {
            report.would_kill = Some(victim.uid.clone());
            self.decider.kill_started(now);
            self.decider.kill_finished(now);
            return;
        }
        // The API server is not told of a throttle kill: its notice carries
        // node-pressure figures (available, threshold) that do not apply.
        self.kill(victim, wake, now, Cause::Throttle(signal), None, report);
    }
}
