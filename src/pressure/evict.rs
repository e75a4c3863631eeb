//! The node path's eviction: walk the kubelet's ranking, reclaim first
//! where configured, recheck on fresh numbers, ask the API server at the
//! soft threshold, else kill; all through the eviction path it shares with
//! the throttle guard ([`crate::evict::Evictor`]). Also the Eviction
//! nobody carried out, which ends in that pod's own kill.

use std::time::Duration;

use super::decide::{Reason, Verdict};
use super::measure::NodeMemory;
use super::{Monitor, StepReport, Wake};
use crate::evict::pods::{limit_hits, PauseCheck, POD_USAGE_SOURCE};
use crate::evict::rank::{self, Candidate};
use crate::evict::{self, Acted, ApiRound, Cause, KillOrder, Origin};
use crate::node::cluster::{EvictionNotice, EvictionReason};
use crate::node::time;

/// What a step that decided to evict knows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Evicting<'a> {
    pub wake: &'a Wake,
    pub now: Duration,
    pub node: NodeMemory,
    pub verdict: Verdict,
    pub reason: Reason,
    pub deficit: u64,
}

impl Evicting<'_> {
    fn cause(&self) -> Cause {
        Cause::NodePressure {
            hard: self.reason == Reason::Hard,
        }
    }

    fn threshold(&self) -> u64 {
        match self.reason {
            Reason::Hard => self.verdict.hard,
            Reason::Soft => self.verdict.soft,
        }
    }
}

impl StepReport {
    pub(super) fn absorb(&mut self, a: Acted) {
        self.killed = self.killed.take().or(a.killed);
        self.would_kill = self.would_kill.take().or(a.would_kill);
        self.evicted = self.evicted.take().or(a.evicted);
        self.emptied_after = self.emptied_after.take().or(a.emptied_after);
    }
}

impl Monitor {
    /// PressurePlan::Evict: one pod, the first the ranking and the path's
    /// safeguards allow.
    pub(super) fn evict(&mut self, e: Evicting<'_>, report: &mut StepReport) {
        let cands = self.scanner.candidates(PauseCheck::AtPick);
        let ranking = rank::rank(&cands, &self.policy);
        let action = match e.reason {
            Reason::Hard => "evict-hard",
            Reason::Soft => "evict-soft",
        };
        self.log_decision(action, e.wake, &e.node, &e.verdict, &cands, &ranking);
        let path = self.evictor.clone();
        let mut ev = evict::lock(&path);
        let proc_root = self.paths.proc_root.clone();
        let Some(top) = ev.pick(&cands, &ranking.order, &proc_root) else {
            tracing::error!(
                excluded = ranking.excluded.len(),
                "memory pressure but no eviction candidate"
            );
            return;
        };
        // A synchronous memory.reclaim can take tens of ms; past the hard
        // threshold that delay can let the kernel OOM killer win the race,
        // so it is opt-in there (the soft band already reclaimed on the way down).
        if self.cfg.reclaim && (e.reason == Reason::Soft || self.cfg.reclaim_before_hard_kill) {
            self.reclaim_top(e.deficit, &cands, &ranking, report);
        }
        let Some(fresh) = self.recheck(&e, &cands[top]) else {
            return;
        };
        let notice = |c: &Candidate| node_notice(c, &e, &fresh);
        let from = ranking.order.iter().position(|&i| i == top).unwrap_or(0);
        let victim = match (e.reason, ev.cluster()) {
            // Soft threshold with the API server: an Eviction moves the pod
            // (the kubelet terminates it gracefully), and a budget's refusal
            // passes the turn to the next candidate. No answer: kill.
            (Reason::Soft, Some(api)) => {
                let round = ApiRound {
                    cands: &cands,
                    order: &ranking.order[from..],
                    now: e.now,
                    cause: e.cause(),
                    origin: Origin::NodePressure,
                    notice: &notice,
                    proc_root: &proc_root,
                };
                let mut acted = Acted::default();
                let left = ev
                    .evict_via_api(api.as_ref(), &round)
                    .left_to_kill(&mut acted);
                report.absorb(acted);
                match left {
                    Some(i) => i,
                    None => return,
                }
            }
            _ => top,
        };
        let victim = &cands[victim];
        self.log_kill(victim, &e, &fresh);
        let wake = e.wake.to_string();
        let acted = ev.kill(KillOrder {
            victim,
            now: e.now,
            cause: e.cause(),
            origin: Origin::NodePressure,
            tell_api: notice(victim),
            started: self.step_started,
            met_since: self.decider.met_since(),
            wake: &wake,
        });
        report.absorb(acted);
    }

    /// Right before the kill, on fresh numbers: still warranted, and the
    /// victim still populated?
    fn recheck(&self, e: &Evicting<'_>, victim: &Candidate) -> Option<NodeMemory> {
        let fresh = match self.measure() {
            Ok(n) => n,
            Err(err) => {
                tracing::error!(error = %err, "cannot re-measure before kill; not killing");
                return None;
            }
        };
        if !self
            .decider
            .still_warranted(e.now, fresh.effective_available(), fresh.capacity)
        {
            tracing::info!(
                available = fresh.effective_available(),
                signal = fresh.signal(),
                before = e.node.available,
                "recheck: threshold clear, no kill"
            );
            return None;
        }
        if !evict::kill::populated(&victim.path) {
            tracing::info!(pod = %victim.uid, "recheck: victim already empty, deciding again");
            return None;
        }
        Some(fresh)
    }

    fn log_kill(&self, victim: &Candidate, e: &Evicting<'_>, fresh: &NodeMemory) {
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
            reason = ?e.reason,
            available = fresh.effective_available(),
            signal = fresh.signal(),
            ws_source = fresh.source,
            path = %victim.path.display(),
            dry_run = self.cfg.dry_run,
            "killing pod"
        );
    }

    /// An Eviction the API server accepted but nobody carried out (no
    /// kubelet, or a slow one) must not make the next pods pay for it: past
    /// kill-timeout, or at once past the hard threshold, its cgroup is
    /// killed as if there were no API server. True when it was.
    pub(super) fn escalate_unenforced(
        &mut self,
        wake: &Wake,
        now: Duration,
        verdict: &Verdict,
        report: &mut StepReport,
    ) -> bool {
        let path = self.evictor.clone();
        let mut ev = evict::lock(&path);
        let pending = match ev.take_unenforced(Origin::NodePressure) {
            Some(u) => Some(u),
            None if verdict.hard_met => ev.withdraw_api_eviction(Origin::NodePressure),
            None => None,
        };
        let Some(u) = pending else {
            return false;
        };
        if !verdict.hard_met && !self.decider.pressure() {
            tracing::info!(victim = %u.victim.uid, "pressure is over; the evicted pod is left to the kubelet");
            return false;
        }
        tracing::warn!(
            victim = %u.victim.uid,
            waited_ms = time::millis(now.saturating_sub(u.since)),
            hard = verdict.hard_met,
            "the Eviction was not carried out in time (is the kubelet acting on it?); killing the pod's cgroup"
        );
        let wake = wake.to_string();
        let acted = ev.kill(KillOrder {
            victim: &u.victim,
            now,
            cause: Cause::UnenforcedEviction,
            origin: Origin::NodePressure,
            tell_api: None,
            started: self.step_started,
            met_since: self.decider.met_since(),
            wake: &wake,
        });
        report.absorb(acted);
        true
    }
}

/// What the API server is told about a node-pressure eviction of `c`;
/// `None` for a pod it cannot name.
fn node_notice(c: &Candidate, e: &Evicting<'_>, fresh: &NodeMemory) -> Option<EvictionNotice> {
    Some(EvictionNotice {
        uid: c.uid.clone(),
        namespace: c.namespace.clone()?,
        name: c.name.clone()?,
        reason: EvictionReason::NodePressure {
            hard: e.reason == Reason::Hard,
            available: fresh.effective_available(),
            signal: fresh.signal().to_string(),
            threshold: e.threshold(),
        },
        working_set: c.working_set,
        request: c.request,
        request_source: c.request_source.to_string(),
    })
}
