//! Acting on a decision: memory.reclaim of the top-ranked pods, lowering
//! BestEffort memory.high while pressure lasts, and the eviction: walk the
//! ranking, recheck on fresh numbers, ask the API server at the soft
//! threshold, else the one kill path (shared with the throttle guard).

use std::time::{Duration, Instant};

use super::decide::{Reason, Verdict};
use super::measure::{self, limit_hits, NodeMemory};
use super::rank::{self, Candidate, Ranking};
use super::{act, Cause, Monitor, StepReport, Victim, Wake, POD_USAGE_SOURCE};
use crate::node::cgroupfs as stat;
use crate::node::cluster;
use crate::node::time;
use crate::qos::QosClass;

/// Below this a pod is not worth a memory.reclaim write.
const MIN_RECLAIM: u64 = 1 << 20;

impl Monitor {
    pub(super) fn reclaim_top(
        &self,
        deficit: u64,
        cands: &[Candidate],
        ranking: &Ranking,
        report: &mut StepReport,
    ) {
        if !self.cfg.reclaim || ranking.order.is_empty() {
            return;
        }
        let top: Vec<&Candidate> = ranking
            .order
            .iter()
            .take(self.cfg.reclaim_top_n.max(1))
            .map(|&i| &cands[i])
            .collect();
        let each = deficit.div_ceil(top.len() as u64).max(4096);
        let swap = measure::swap_free(&self.paths);
        for c in top {
            let can = measure::reclaimable(&c.path, swap);
            let bytes = each.min(can);
            if bytes < MIN_RECLAIM {
                tracing::debug!(pod = %c.uid, reclaimable = can, swap_free = swap, "nothing to reclaim from this pod");
                continue;
            }
            report.reclaimed.push(c.uid.clone());
            if self.cfg.dry_run {
                tracing::info!(pod = %c.uid, bytes, "dry-run: would write memory.reclaim");
                continue;
            }
            let t = Instant::now();
            match act::reclaim(&c.path, bytes) {
                Ok(outcome) => {
                    tracing::info!(pod = %c.uid, bytes, reclaimable = can, ?outcome, took_us = time::micros(t.elapsed()), "memory.reclaim")
                }
                Err(e) => tracing::warn!(pod = %c.uid, error = %e, "memory.reclaim failed"),
            }
        }
    }

    pub(super) fn lower_besteffort_high(&mut self, cands: &[Candidate], ranking: &Ranking) {
        let factor = self.cfg.besteffort_memory_high_factor;
        if factor <= 0.0 {
            return;
        }
        for &i in ranking.order.iter().take(self.cfg.reclaim_top_n.max(1)) {
            let c = &cands[i];
            if c.class != QosClass::BestEffort || self.lowered_high.contains_key(&c.path) {
                continue;
            }
            // factor is validated to [0, 1): the product is finite, non-negative, at most working_set.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let high = ((c.working_set as f64 * factor) as u64 / 4096 * 4096).max(4096);
            let path = c.path.join("memory.high");
            let original = stat::read(&path)
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "max".into());
            if self.cfg.dry_run {
                tracing::info!(pod = %c.uid, high, "dry-run: would lower memory.high");
                continue;
            }
            match stat::write_file(&path, &high.to_string()) {
                Ok(()) => {
                    tracing::info!(pod = %c.uid, high, original = %original, "lowered memory.high until pressure ends");
                    self.lowered_high.insert(c.path.clone(), original);
                }
                Err(e) => tracing::warn!(pod = %c.uid, error = %e, "cannot lower memory.high"),
            }
        }
    }

    pub(super) fn restore_high(&mut self) {
        for (cg, original) in self.lowered_high.drain() {
            if let Err(e) = stat::write_file(&cg.join("memory.high"), &original) {
                tracing::debug!(error = %e, "cannot restore memory.high (pod gone?)");
            } else {
                tracing::info!(path = %cg.display(), high = %original, "restored memory.high");
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn evict(
        &mut self,
        wake: &Wake,
        now: Duration,
        node: NodeMemory,
        v: Verdict,
        reason: Reason,
        deficit: u64,
        report: &mut StepReport,
    ) {
        let cands = self.candidates(false);
        let ranking = rank::rank(&cands, &self.policy);
        self.log_decision(
            if reason == Reason::Hard {
                "evict-hard"
            } else {
                "evict-soft"
            },
            wake,
            &node,
            &v,
            &cands,
            &ranking,
        );
        // Never the sandbox alone, never an emptied pod: walk down the ranking.
        let proc_root = &self.paths.proc_root;
        let stuck = &self.stuck;
        let top = ranking.order.iter().copied().find(|&i| {
            if stuck.contains(&cands[i].path) {
                tracing::info!(pod = %cands[i].uid, "skipping pod that did not die after an earlier kill");
                return false;
            }
            let skip = act::pause_only(&cands[i].path, proc_root);
            if skip {
                tracing::info!(pod = %cands[i].uid, "skipping pod with only the sandbox (pause) or nothing left");
            }
            !skip
        });
        let Some(top) = top else {
            tracing::error!(
                excluded = ranking.excluded.len(),
                "memory pressure but no eviction candidate"
            );
            return;
        };
        // A synchronous memory.reclaim can take tens of ms; past the hard
        // threshold that delay can let the kernel OOM killer win, so it is
        // opt-in there (the soft band already reclaimed on the way down).
        if self.cfg.reclaim && (reason == Reason::Soft || self.cfg.reclaim_before_hard_kill) {
            self.reclaim_top(deficit, &cands, &ranking, report);
        }
        // Recheck right before the kill, on fresh numbers.
        let fresh = match self.measure() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot re-measure before kill; not killing");
                return;
            }
        };
        if !self
            .decider
            .still_warranted(now, fresh.effective_available(), fresh.capacity)
        {
            tracing::info!(
                available = fresh.effective_available(),
                signal = fresh.signal(),
                before = node.available,
                "recheck: threshold clear, no kill"
            );
            return;
        }
        if !act::populated(&cands[top].path) {
            tracing::info!(pod = %cands[top].uid, "recheck: victim already empty, deciding again");
            return;
        }
        let threshold = if reason == Reason::Hard {
            v.hard
        } else {
            v.soft
        };
        let notice = |c: &Candidate| {
            Some(cluster::EvictionNotice {
                uid: c.uid.clone(),
                namespace: c.namespace.clone()?,
                name: c.name.clone()?,
                hard: reason == Reason::Hard,
                available: fresh.effective_available(),
                signal: fresh.signal().to_string(),
                threshold,
                working_set: c.working_set,
                request: c.request,
                request_source: c.request_source.to_string(),
            })
        };
        // Soft threshold with the API server: an Eviction moves the pod (the
        // kubelet terminates it gracefully), and a PodDisruptionBudget's
        // refusal passes the turn to the next candidate. No answer: kill.
        let cluster = self.cluster.clone().filter(|_| reason == Reason::Soft);
        let mut top = top;
        if let (Some(api), false) = (cluster, self.cfg.dry_run) {
            let mut refused = 0;
            let mut next = ranking.order.iter().copied().skip_while(|&i| i != top);
            loop {
                let Some(i) = next.next() else {
                    tracing::warn!(refused, "every candidate's PodDisruptionBudget refused an eviction at the soft threshold; nothing evicted");
                    self.decider.kill_started(now);
                    self.decider.kill_finished(now);
                    return;
                };
                if self.stuck.contains(&cands[i].path) || act::pause_only(&cands[i].path, proc_root)
                {
                    continue;
                }
                let Some(n) = notice(&cands[i]) else {
                    top = i;
                    break;
                };
                match api.evict(&n, cluster::SOFT_EVICTION_WAIT) {
                    cluster::EvictOutcome::Created => {
                        tracing::warn!(
                            victim = %cands[i].uid,
                            namespace = %n.namespace,
                            name = %n.name,
                            class = ?cands[i].class,
                            working_set = n.working_set,
                            request = n.request,
                            request_source = %n.request_source,
                            priority = cands[i].priority.unwrap_or(0),
                            available = n.available,
                            signal = %n.signal,
                            "evicted pod through the API server (the kubelet terminates it gracefully)"
                        );
                        report.evicted = Some(cands[i].uid.clone());
                        if let Some(m) = &self.metrics {
                            m.inc_eviction(
                                &format!("{:?}", cands[i].class),
                                &format!("{reason:?}"),
                            );
                        }
                        self.decider.kill_started(now);
                        self.victim = Some(Victim {
                            uid: cands[i].uid.clone(),
                            path: cands[i].path.clone(),
                            since: now,
                            via_api: Some(cands[i].clone()),
                        });
                        return;
                    }
                    cluster::EvictOutcome::RefusedByPdb => {
                        refused += 1;
                        tracing::info!(pod = %format_args!("{}/{}", n.namespace, n.name), "PodDisruptionBudget refused the eviction at the soft threshold; trying the next candidate");
                    }
                    cluster::EvictOutcome::Unreachable => {
                        tracing::warn!(pod = %format_args!("{}/{}", n.namespace, n.name), "API server unreachable; killing the pod's cgroup instead");
                        top = i;
                        break;
                    }
                }
            }
        }
        let victim = &cands[top];
        tracing::warn!(
            victim = %victim.uid,
            namespace = victim.namespace.as_deref().unwrap_or("?"),
            name = victim.name.as_deref().unwrap_or("?"),
            class = ?victim.class,
            class_source = victim.class_source,
            working_set = victim.working_set,
            usage_source = POD_USAGE_SOURCE,
            request = victim.request,
            request_source = %victim.request_source,
            priority = victim.priority.unwrap_or(0),
            exceeds_request = victim.exceeds_request(),
            // memory.events.local max of the pod and its containers: a pod
            // at its own limit is logged, not spared (the kubelet ignores it too).
            limit_hits = limit_hits(&victim.path),
            reason = ?reason,
            available = fresh.effective_available(),
            signal = fresh.signal(),
            ws_source = fresh.source,
            path = %victim.path.display(),
            dry_run = self.cfg.dry_run,
            "killing pod"
        );
        let tell_api = notice(victim);
        self.kill(
            victim.clone(),
            wake,
            now,
            Cause::Node(reason),
            tell_api,
            report,
        );
    }

    /// The one kill path (node pressure and the throttle guard): dry-run,
    /// cgroup.kill + process_mrelease, watch the cgroup empty, then the
    /// decider's in-flight / cooldown. `tell_api`: what the API server
    /// learns after the kill, when it is configured.
    pub(super) fn kill(
        &mut self,
        victim: Candidate,
        wake: &Wake,
        now: Duration,
        cause: Cause,
        tell_api: Option<cluster::EvictionNotice>,
        report: &mut StepReport,
    ) {
        let victim = &victim;
        if self.cfg.dry_run {
            report.would_kill = Some(victim.uid.clone());
            // Behave as if it finished at once, so dry-run logs once per cooldown.
            self.decider.kill_started(now);
            self.decider.kill_finished(now);
            return;
        }
        let t = Instant::now();
        // Detection to decision: the wake-up until the kill is issued.
        let wake_to_kill = t.duration_since(self.step_started);
        match act::kill_pod(&victim.path, self.ops.as_ref(), self.mrelease) {
            Ok(r) => {
                if r.mrelease_unsupported {
                    tracing::info!("process_mrelease unsupported by this kernel; not trying again");
                    self.mrelease = false;
                }
                tracing::warn!(
                    victim = %victim.uid,
                    method = ?r.method,
                    pids = r.pids,
                    mreleased = r.mreleased,
                    mrelease_exiting = r.mrelease_exiting,
                    // cgroup.kill (or per-pid SIGKILL) plus process_mrelease.
                    kill_us = time::micros(t.elapsed()),
                    wake_to_kill_us = time::micros(wake_to_kill),
                    met_to_kill_ms = self
                        .decider
                        .met_since()
                        .map_or(0, |m| time::millis(now.saturating_sub(m))),
                    wake = %wake,
                    cause = ?cause,
                    "killed pod"
                );
                report.killed = Some(victim.uid.clone());
                // Killed first; the API learns of it in the background.
                if let (Some(api), Some(n)) = (&self.cluster, tell_api) {
                    api.evict_after_kill(n);
                }
                if let Some(m) = &self.metrics {
                    let class = format!("{:?}", victim.class);
                    match cause {
                        Cause::Node(reason) => m.inc_eviction(&class, &format!("{reason:?}")),
                        Cause::Throttle(signal) => m.inc_throttle_eviction(&class, signal.label()),
                        Cause::UnenforcedEviction => {}
                    }
                }
                self.decider.kill_started(now);
                // Nothing else may happen while the kill is in flight, so
                // watch the cgroup empty closely for a short while: frees the
                // cooldown sooner and measures kill-to-empty to ~5 ms.
                let wait = self.cfg.kill_wait.0;
                while t.elapsed() < wait {
                    if !act::populated(&victim.path) {
                        let took = t.elapsed();
                        tracing::info!(victim = %victim.uid, took_ms = time::millis(took), "victim pod cgroup is empty");
                        report.emptied_after = Some(took);
                        self.decider.kill_finished(now + took);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.victim = Some(Victim {
                    uid: victim.uid.clone(),
                    path: victim.path.clone(),
                    since: now,
                    via_api: None,
                });
            }
            Err(e) => {
                tracing::error!(victim = %victim.uid, error = %e, "kill failed");
                // Cool down anyway so a broken cgroup is not hammered.
                self.decider.kill_started(now);
                self.decider.kill_finished(now);
            }
        }
    }
}
