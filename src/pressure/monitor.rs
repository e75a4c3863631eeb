//! The monitor's step: the quick MemAvailable check between full steps,
//! measuring the node and its pods, the decision, and what a step logs.
//! Acting on the decision (reclaim, evict, kill) is [`super::evict`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::decide::{Plan, Verdict};
use super::measure::{cgroup_working_set, derive_request, limit_hits, measure, NodeMemory};
use super::rank::{self, Candidate, Ranking};
use super::{
    act, psi, Cause, Monitor, MonitorError, StepReport, Victim, Wake, MAX_PODS, POD_USAGE_SOURCE,
};
use crate::node::cgroupfs::ReadError;
use crate::node::layout::{find_kubepods, Driver};
use crate::node::time;

impl Monitor {
    /// A tick between full steps while calm needs only the quick check;
    /// `Some(next)` when that was enough. Cheap enough to run on the async
    /// loop without a trip to the blocking pool.
    pub fn quick(&mut self, wake: &Wake, now: Duration) -> Option<Duration> {
        let calm = self.victim.is_none()
            && !self.decider.busy()
            && !self.guard.busy()
            && self.fast_until.is_none_or(|t| now >= t);
        if matches!(wake, Wake::Tick) && calm && now < self.next_full {
            self.quick_check()
        } else {
            None
        }
    }

    /// Between full steps while calm: one read of /proc/meminfo. Returns when
    /// to look again, or `None` when MemAvailable is within one threshold of
    /// the thresholds (or unreadable) and a full step should run now. This is
    /// what keeps fast checks cheap: earlyoom's cadence at meminfo's cost.
    fn quick_check(&mut self) -> Option<Duration> {
        let kb = self.mem_available_kb()?;
        let available = kb.checked_mul(1024)?;
        let threshold = self
            .cfg
            .hard_threshold
            .resolve(self.capacity)
            .max(self.cfg.soft_threshold.resolve(self.capacity));
        available.checked_sub(threshold.saturating_mul(2))?;
        Some(self.interval_for(available - threshold))
    }

    /// MemAvailable in kB from the kept-open /proc/meminfo.
    fn mem_available_kb(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        if self.meminfo.is_none() {
            self.meminfo = std::fs::File::open(self.paths.meminfo()).ok();
        }
        // MemAvailable is the third line; 4 KiB holds the whole file.
        self.meminfo_buf.resize(4096, 0);
        let n = match self.meminfo.as_ref()?.read_at(&mut self.meminfo_buf, 0) {
            Ok(n) => n,
            Err(_) => {
                self.meminfo = None;
                return None;
            }
        };
        let text = std::str::from_utf8(&self.meminfo_buf[..n]).ok()?;
        text.lines().find_map(|l| {
            l.strip_prefix("MemAvailable:")?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
    }

    /// Sooner the closer `headroom` bytes are to being used up at
    /// `max-fill-rate`, between pressure-interval and check-interval.
    fn interval_for(&self, headroom: u64) -> Duration {
        let (slow, fast) = (self.cfg.check_interval.0, self.cfg.pressure_interval.0);
        let rate = self.cfg.max_fill_rate.resolve(self.capacity).max(1);
        Duration::from_secs_f64(headroom as f64 / rate as f64).clamp(fast.min(slow), slow)
    }

    pub(super) fn measure(&self) -> Result<NodeMemory, MonitorError> {
        let kp = self.kubepods().map(|k| k.0);
        measure(
            &self.paths,
            kp.as_deref().filter(|_| self.cfg.allocatable_signal),
            self.cfg.mem_available_signal,
        )
    }

    pub fn kubepods(&self) -> Option<(PathBuf, Driver)> {
        find_kubepods(&self.paths.cgroup_root, &self.cfg.kubepods)
    }

    /// Every pod under kubepods with its numbers, in UID order.
    /// `check_pause` inspects every pod's processes; eviction skips that and
    /// checks only the pods it is about to pick (cheaper under pressure).
    pub fn candidates(&mut self, check_pause: bool) -> Vec<Candidate> {
        let Some((kp, driver)) = self.kubepods() else {
            tracing::warn!(root = %self.paths.cgroup_root.display(), kubepods = %self.cfg.kubepods, "kubepods cgroup not found");
            return Vec::new();
        };
        let mut out = Vec::new();
        for pod in self.discovery.scan(&kp, driver).into_iter().take(MAX_PODS) {
            let ws = match cgroup_working_set(&pod.path) {
                Ok(ws) => ws,
                Err(e) => {
                    // Usually a pod that just went away.
                    tracing::debug!(pod = %pod.uid, error = %e, "skipping pod without stats");
                    continue;
                }
            };
            let info = self.pods.get(&pod.uid);
            let (class, class_source) = match info.as_ref().and_then(|i| i.class) {
                Some(c) => (c, "registry"),
                None => (pod.class, "cgroup-path"),
            };
            let (request, request_source) = match info
                .as_ref()
                .and_then(|i| i.memory_request.map(|r| (r, i.request_source)))
            {
                Some(r) => r,
                None => derive_request(&pod.path, class),
            };
            out.push(Candidate {
                namespace: info.as_ref().map(|i| i.namespace.clone()),
                name: info.as_ref().map(|i| i.name.clone()),
                priority: info.as_ref().and_then(|i| i.priority),
                uid: pod.uid,
                class,
                class_source,
                working_set: ws,
                request,
                request_source,
                pause_only: check_pause && act::pause_only(&pod.path, &self.paths.proc_root),
                static_pod: info.as_ref().is_some_and(|i| i.static_pod),
                path: pod.path,
            });
        }
        out
    }

    /// Measures and ranks without acting (for `--once` and for tests).
    pub fn snapshot(&mut self) -> Result<(NodeMemory, Vec<Candidate>, Ranking), MonitorError> {
        let node = self.measure()?;
        let cands = self.candidates(true);
        let ranking = rank::rank(&cands, &self.policy);
        Ok((node, cands, ranking))
    }

    fn psi_fields(&self) -> (String, String) {
        let show = |p: Result<psi::Psi, ReadError>| match p {
            Ok(p) => format!(
                "some10={:.2} full10={:.2}",
                p.some.avg10,
                p.full.map_or(0.0, |f| f.avg10)
            ),
            Err(_) => "n/a".into(),
        };
        let node = show(psi::read(&self.paths.node_psi()));
        let kp = match self.kubepods() {
            Some((kp, _)) => show(psi::read(&kp.join("memory.pressure"))),
            None => "n/a".into(),
        };
        (node, kp)
    }

    fn publish_psi(&self) {
        let (Some(m), Ok(p)) = (&self.metrics, psi::read(&self.paths.node_psi())) else {
            return;
        };
        m.set_pressure("memory", "some_avg10", p.some.avg10);
        m.set_pressure("memory", "some_avg60", p.some.avg60);
        m.set_pressure("memory", "some_avg300", p.some.avg300);
        if let Some(f) = p.full {
            m.set_pressure("memory", "full_avg10", f.avg10);
            m.set_pressure("memory", "full_avg60", f.avg60);
            m.set_pressure("memory", "full_avg300", f.avg300);
        }
    }

    pub fn step(&mut self, wake: &Wake, now: Duration) -> StepReport {
        self.step_started = Instant::now();
        self.meminfo = None;
        self.publish_psi();
        if matches!(wake, Wake::Psi { .. }) {
            self.fast_until = Some(now + self.psi_followup);
        }
        let mut report = StepReport {
            verdict: None,
            node: None,
            killed: None,
            would_kill: None,
            evicted: None,
            reclaimed: Vec::new(),
            emptied_after: None,
            limit_bound: Vec::new(),
            relaxed: Vec::new(),
            next_check: self.cfg.pressure_interval.0,
        };

        if let Some(next) = self.quick(wake, now) {
            report.next_check = next;
            return report;
        }

        if let Some(v) = &self.victim {
            if !act::populated(&v.path) {
                tracing::info!(victim = %v.uid, took_ms = time::millis(now.saturating_sub(v.since)), "victim pod cgroup is empty");
                self.decider.kill_finished(now);
                self.victim = None;
            }
        }

        let node = match self.measure() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot measure node memory");
                return report;
            }
        };
        report.node = Some(node);
        self.capacity = node.capacity;
        let verdict = self
            .decider
            .observe(now, node.effective_available(), node.capacity);
        report.verdict = Some(verdict);
        // An Eviction the API server accepted but nobody carried out (no
        // kubelet, or a slow one) must not make the next pods pay for it:
        // past kill-timeout, or at once past the hard threshold, its cgroup
        // is killed as if there were no API server.
        let unenforced = self.victim.as_ref().is_some_and(|v| v.via_api.is_some())
            && (verdict.kill_timed_out || verdict.hard_met);
        let mut escalated = false;
        if unenforced {
            if let Some(Victim {
                uid,
                via_api: Some(cand),
                since,
                ..
            }) = self.victim.take()
            {
                if verdict.hard_met || self.decider.pressure() {
                    tracing::warn!(
                        victim = %uid,
                        waited_ms = time::millis(now.saturating_sub(since)),
                        hard = verdict.hard_met,
                        "the Eviction was not carried out in time (is the kubelet acting on it?); killing the pod's cgroup"
                    );
                    self.kill(
                        cand,
                        wake,
                        now,
                        Cause::UnenforcedEviction,
                        None,
                        &mut report,
                    );
                    escalated = true;
                } else {
                    tracing::info!(victim = %uid, "pressure is over; the evicted pod is left to the kubelet");
                }
            }
        } else if verdict.kill_timed_out {
            if let Some(v) = self.victim.take() {
                self.stuck.insert(v.path.clone());
                tracing::warn!(victim = %v.uid, path = %v.path.display(), "victim cgroup still populated after kill-timeout; skipping it until pressure ends");
            }
        }

        match verdict.plan {
            _ if escalated => {}
            Plan::Calm => {
                if matches!(wake, Wake::Psi { .. }) {
                    self.explain_psi(wake, now, &node, &verdict, &mut report);
                }
            }
            Plan::Watch | Plan::Hold(_) => {
                tracing::debug!(plan = ?verdict.plan, available = node.effective_available(), "holding");
            }
            Plan::Reclaim { deficit } => {
                let cands = self.candidates(false);
                let ranking = rank::rank(&cands, &self.policy);
                self.log_decision("reclaim", wake, &node, &verdict, &cands, &ranking);
                self.reclaim_top(deficit, &cands, &ranking, &mut report);
                self.lower_besteffort_high(&cands, &ranking);
            }
            Plan::Evict { reason, deficit } => {
                self.evict(wake, now, node, verdict, reason, deficit, &mut report)
            }
        }

        if self.cfg.throttle.enabled && self.victim.is_none() && report.killed.is_none() {
            self.throttle_pass(wake, now, &mut report);
        }

        if !self.decider.pressure() {
            if !self.lowered_high.is_empty() {
                self.restore_high();
            }
            self.stuck.clear();
        }
        let following_psi = self.fast_until.is_some_and(|t| now < t);
        if !self.decider.busy() && !following_psi {
            report.next_check = self.calm_interval(&report);
            self.next_full = now + self.cfg.check_interval.0;
        }
        if self.guard.busy() {
            report.next_check = report.next_check.min(self.cfg.throttle.interval.0);
        }
        report
    }

    /// While calm: sooner the closer memory.available is to the first
    /// threshold we act on, as earlyoom does (headroom / max fill rate).
    fn calm_interval(&self, report: &StepReport) -> Duration {
        let (Some(node), Some(v)) = (report.node, report.verdict) else {
            return self.cfg.check_interval.0;
        };
        self.interval_for(
            node.effective_available()
                .saturating_sub(v.soft.max(v.hard)),
        )
    }

    pub(super) fn ranking_brief(cands: &[Candidate], ranking: &Ranking) -> String {
        ranking
            .order
            .iter()
            .take(5)
            .enumerate()
            .map(|(n, &i)| format!("#{} {}", n + 1, cands[i].brief()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(super) fn log_decision(
        &self,
        what: &str,
        wake: &Wake,
        node: &NodeMemory,
        v: &Verdict,
        cands: &[Candidate],
        ranking: &Ranking,
    ) {
        let (psi_node, psi_kubepods) = self.psi_fields();
        tracing::warn!(
            action = what,
            wake = %wake,
            available = node.effective_available(),
            signal = node.signal(),
            node_available = node.available,
            allocatable_available = ?node.allocatable_available,
            mem_available = ?node.mem_available,
            capacity = node.capacity,
            working_set = node.working_set,
            ws_source = node.source,
            hard_threshold = v.hard,
            soft_threshold = v.soft,
            hard_met = v.hard_met,
            soft_met = v.soft_met,
            psi_node = %psi_node,
            psi_kubepods = %psi_kubepods,
            candidates = ranking.order.len(),
            excluded = ranking.excluded.len(),
            usage_source = POD_USAGE_SOURCE,
            ranking = %Self::ranking_brief(cands, ranking),
            dry_run = self.cfg.dry_run,
            "memory pressure decision"
        );
    }

    /// PSI fired but no threshold is met: say why we are not acting, naming
    /// pods that hit their own memory.max since last time.
    fn explain_psi(
        &mut self,
        wake: &Wake,
        now: Duration,
        node: &NodeMemory,
        v: &Verdict,
        report: &mut StepReport,
    ) {
        let mut seen = HashMap::new();
        if let Some((kp, driver)) = self.kubepods() {
            for pod in self.discovery.scan(&kp, driver).into_iter().take(MAX_PODS) {
                let hits = limit_hits(&pod.path);
                let before = self.limit_seen.get(&pod.path).copied().unwrap_or(0);
                if hits > before {
                    report
                        .limit_bound
                        .push(format!("{}(+{})", pod.uid, hits - before));
                }
                seen.insert(pod.path, hits);
            }
        }
        // Keeps only pods that still exist: bounded by the pod count.
        self.limit_seen = seen;
        let quiet = self
            .last_psi_note
            .is_some_and(|t| now.saturating_sub(t) < self.cfg.transition_period.0);
        if quiet {
            return;
        }
        self.last_psi_note = Some(now);
        let (psi_node, psi_kubepods) = self.psi_fields();
        tracing::info!(
            wake = %wake,
            available = node.effective_available(),
            ws_source = node.source,
            hard_threshold = v.hard,
            soft_threshold = v.soft,
            psi_node = %psi_node,
            psi_kubepods = %psi_kubepods,
            limit_bound = %report.limit_bound.join(","),
            "memory pressure without node shortage: not acting"
        );
    }
}
