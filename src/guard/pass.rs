//! The guard's look over the tree (the I/O edge of [`super::Throttles`]):
//! which cgroups to read, relaxing through the chosen route, and stage 2
//! through the eviction path shared with the node-pressure monitor.
//!
//! Cost while nothing is throttled: the `memory.events` and `memory.pressure`
//! of the two QoS parents (Burstable, BestEffort), four small reads per full
//! step. Their counters are hierarchical, so a class is descended into only
//! when some container below it hit its memory.high or memory.max since the
//! last look, its PSI is above threshold, or a container below is watched.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::relax::high_value;
use super::sample::{self, Sample};
use super::{Guard, GuardReport, Signal, Signals, ThrottleDecision};
use crate::evict::pods::{PauseCheck, MAX_PODS};
use crate::evict::rank::{self, Candidate};
use crate::evict::{self, ApiRound, Cause, KillOrder, Origin};
use crate::node::cluster::{EvictionNotice, EvictionReason, RelaxNotice};
use crate::node::layout::Driver;
use crate::node::{time, QosClass};

impl Guard {
    /// One look at every container worth watching; relaxes, and returns
    /// the pods (by UID) that stage 2 wants evicted, with the signal.
    pub(super) fn pass(
        &mut self,
        now: Duration,
        kp: &Path,
        driver: Driver,
        report: &mut GuardReport,
    ) -> HashMap<String, Signal> {
        let samples = self.samples(kp, driver, now);
        let mut evict: HashMap<String, Signal> = HashMap::new();
        for s in &samples {
            let decision = self.throttles.observe(now, s);
            let signals = self.throttles.signals(&s.path).unwrap_or_default();
            match decision {
                ThrottleDecision::Throttled { for_ } if for_.is_zero() => {
                    tracing::info!(
                        pod = %s.pod_uid,
                        container = %s.id,
                        class = ?s.class,
                        high_rate = signals.high_rate,
                        max_rate = signals.max_rate,
                        psi_some_avg10 = signals.psi_some_avg10,
                        grace = %self.cfg.grace_period,
                        "container under memory.high throttle; grace period starts"
                    );
                }
                ThrottleDecision::Calm
                | ThrottleDecision::Throttled { .. }
                | ThrottleDecision::Settling => {}
                ThrottleDecision::Relax => self.relax(s, &signals, report),
                ThrottleDecision::Evict { signal } => {
                    self.log_decision(s, &signals, "evict-candidate", "ranking");
                    evict.entry(s.pod_uid.clone()).or_insert(signal);
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.set_throttle_under(self.throttles.under_throttle());
        }
        evict
    }

    /// Stage 1: memory.high up to memory.max, through the chosen route.
    fn relax(&self, s: &Sample, signals: &Signals, report: &mut GuardReport) {
        if evict::kill::pause_only(&s.path, &self.scanner.tree().proc_root) {
            return;
        }
        report.relaxed.push(s.path.clone());
        if self.dry_run {
            self.log_decision(s, signals, "relax", "dry-run");
            return;
        }
        match self.relaxer.relax(&s.relax_request()) {
            Ok(route) => {
                self.log_decision(s, signals, "relax", route);
                if let Some(m) = &self.metrics {
                    m.inc_throttle_relaxed(&format!("{:?}", s.class));
                }
                self.tell_relaxed(s, signals, &self.cfg.grace_period.to_string());
            }
            // Stage 1 failed: stage 2 follows if the throttle holds.
            Err(e) => {
                self.log_decision(s, signals, "relax-failed", "none");
                tracing::warn!(error = %e, "cannot relax memory.high");
            }
        }
    }

    fn log_decision(&self, s: &Sample, signals: &Signals, action: &str, route: &str) {
        let cfg = &self.cfg;
        tracing::warn!(
            action,
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
            under_throttle_ms = time::millis(signals.under_throttle_for),
            memory_high = %high_value(s.high),
            memory_max = %high_value(s.max),
            dry_run = self.dry_run,
            path = %s.path.display(),
            "memory.high throttle decision"
        )
    }

    /// An Event on the pod through the API server, when one is configured
    /// and knows the pod (in the background: the guard never waits on it).
    fn tell_relaxed(&self, s: &Sample, signals: &Signals, grace: &str) {
        let (Some(api), Some(pod)) = (&self.cluster, self.scanner.registry().get(&s.pod_uid))
        else {
            return;
        };
        api.memory_high_relaxed(RelaxNotice {
            uid: pod.uid,
            namespace: pod.namespace,
            name: pod.name,
            container_id: s.id.clone(),
            from: high_value(s.high),
            to: s.relax_request().value,
            high_rate: signals.high_rate,
            psi_some_avg10: signals.psi_some_avg10,
            grace: grace.to_string(),
        });
    }

    /// Reads the containers worth reading; tells the guard the rest are quiet.
    fn samples(&mut self, kp: &Path, driver: Driver, now: Duration) -> Vec<Sample> {
        let psi_threshold = self.cfg.psi_some_avg10;
        let mut samples = Vec::new();
        // What this pass saw, so tracked containers it did not read are
        // judged without a syscall each: under a skipped parent or an
        // unmoved pod they are quiet; anywhere else they are gone.
        let mut quiet_under: HashSet<PathBuf> = HashSet::new();
        let mut listed: HashSet<PathBuf> = HashSet::new();
        let mut pods = None;
        for class in [QosClass::Burstable, QosClass::BestEffort] {
            let Some(parent) = sample::qos_parent(kp, driver, class) else {
                continue;
            };
            let moved = self.filter.moved(&parent, psi_threshold);
            if !moved && !self.throttles.busy_under(&parent) {
                quiet_under.insert(parent);
                continue;
            }
            listed.insert(parent);
            let pods = pods.get_or_insert_with(|| self.scanner.pod_cgroups(kp, driver));
            for pod in pods.iter().filter(|p| p.class == class).take(MAX_PODS) {
                listed.insert(pod.path.clone());
                let moved = self.filter.moved(&pod.path, psi_threshold);
                if !moved && !self.throttles.busy_under(&pod.path) {
                    quiet_under.insert(pod.path.clone());
                    continue;
                }
                for cg in sample::containers_of(&pod.path) {
                    let Some(s) = sample::read_container(&cg, &pod.uid, &pod.path, class) else {
                        continue;
                    };
                    // Only containers with a finite memory.high or a limit to
                    // hit (or already watched) are worth a decision.
                    if s.high.is_none() && s.max.is_none() && !self.throttles.is_tracked(&cg) {
                        continue;
                    }
                    samples.push(s);
                }
            }
        }
        let sampled: HashSet<&PathBuf> = samples.iter().map(|s| &s.path).collect();
        for p in self.throttles.tracked() {
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
                self.throttles.quiet(now, &p);
            } else {
                self.throttles.forget(&p);
            }
        }
        // Pods that went away are forgotten once a pass listed them.
        if pods.is_some() {
            self.filter.retain(|p| {
                listed.contains(p)
                    || quiet_under.contains(p)
                    || p.parent().is_some_and(|x| quiet_under.contains(x))
            });
        }
        samples
    }

    /// The eviction in flight: emptied, given up on, or an Eviction of ours
    /// nobody carried out, which ends in that pod's kill (the throttle held
    /// for a grace period; nothing says it ended).
    pub(super) fn settle(&mut self, now: Duration, report: &mut GuardReport) {
        let path = self.evictor.clone();
        let mut ev = evict::lock(&path);
        ev.settle(now);
        let Some(u) = ev.take_unenforced(Origin::ThrottleGuard) else {
            return;
        };
        tracing::warn!(
            victim = %u.victim.uid,
            waited_ms = time::millis(now.saturating_sub(u.since)),
            "the Eviction was not carried out in time (is the kubelet acting on it?); killing the pod's cgroup"
        );
        report.acted = ev.kill(KillOrder {
            victim: &u.victim,
            now,
            cause: Cause::UnenforcedEviction,
            origin: Origin::ThrottleGuard,
            tell_api: None,
            started: self.started,
            met_since: None,
            wake: "throttle",
        });
    }

    /// Stage 2: the throttled pods are candidates in the node-pressure
    /// ranking (same order, same exclusions, Guaranteed never); the first
    /// one the eviction path allows is evicted through the API server when
    /// there is one, else killed, on the path's safeguards (one eviction in
    /// flight across the guard and the monitor, cooldown, pause-only, stuck
    /// and node-critical pods skipped, a last look that it is populated).
    pub(super) fn evict(
        &mut self,
        now: Duration,
        pods: &HashMap<String, Signal>,
        report: &mut GuardReport,
    ) {
        let path = self.evictor.clone();
        let mut ev = evict::lock(&path);
        if ev.hold(now).is_some() {
            tracing::debug!("throttle eviction waits for the eviction in flight or its cooldown");
            return;
        }
        let cands: Vec<Candidate> = self
            .scanner
            .candidates(PauseCheck::AtPick)
            .into_iter()
            .filter(|c| c.class != QosClass::Guaranteed && pods.contains_key(&c.uid))
            .collect();
        let ranking = rank::rank(&cands, &ev.config().rank);
        let proc_root = self.scanner.tree().proc_root.clone();
        let Some(top) = ev.pick(&cands, &ranking.order, &proc_root) else {
            tracing::info!(
                candidates = pods.len(),
                excluded = ranking.excluded.len(),
                "memory.high throttle persists but no pod may be evicted (critical, pause-only or unknown)"
            );
            return;
        };
        if !evict::kill::populated(&cands[top].path) {
            return;
        }
        self.log_victim(
            &cands[top],
            pods[&cands[top].uid],
            &rank::brief(&cands, &ranking),
        );
        if self.dry_run {
            report.acted = ev.pretend(now, &cands[top].uid);
            return;
        }
        let grace = self.cfg.grace_period.to_string();
        let notice = |c: &Candidate| throttle_notice(c, pods[&c.uid], &grace);
        let cause = |c: &Candidate| Cause::Throttle {
            signal: pods[&c.uid].label(),
        };
        let victim = match ev.cluster() {
            Some(api) => {
                let from = ranking.order.iter().position(|&i| i == top).unwrap_or(0);
                let round = ApiRound {
                    cands: &cands,
                    order: &ranking.order[from..],
                    now,
                    cause: cause(&cands[top]),
                    origin: Origin::ThrottleGuard,
                    notice: &notice,
                    proc_root: &proc_root,
                };
                let outcome = ev.evict_via_api(api.as_ref(), &round);
                match outcome.left_to_kill(&mut report.acted) {
                    Some(i) => i,
                    None => return,
                }
            }
            None => top,
        };
        let victim = &cands[victim];
        report.acted = ev.kill(KillOrder {
            victim,
            now,
            cause: cause(victim),
            origin: Origin::ThrottleGuard,
            tell_api: notice(victim),
            started: self.started,
            met_since: None,
            wake: "throttle",
        });
    }

    fn log_victim(&self, victim: &Candidate, signal: Signal, ranking: &str) {
        tracing::warn!(
            victim = %victim.uid,
            namespace = victim.namespace.as_deref().unwrap_or("?"),
            name = victim.name.as_deref().unwrap_or("?"),
            class = ?victim.class,
            priority = victim.priority.unwrap_or(0),
            signal = signal.label(),
            ranking,
            path = %victim.path.display(),
            dry_run = self.dry_run,
            "evicting pod: memory.high throttle persists"
        );
    }
}

/// What the API server is told about a throttle eviction of `c`; `None`
/// for a pod it cannot name.
fn throttle_notice(c: &Candidate, signal: Signal, grace: &str) -> Option<EvictionNotice> {
    Some(EvictionNotice {
        uid: c.uid.clone(),
        namespace: c.namespace.clone()?,
        name: c.name.clone()?,
        reason: EvictionReason::Throttle {
            signal: signal.label().to_string(),
            grace: grace.to_string(),
        },
        working_set: c.working_set,
        request: c.request,
        request_source: c.request_source.to_string(),
    })
}
