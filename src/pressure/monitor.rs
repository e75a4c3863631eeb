//! The monitor's step: the quick MemAvailable check between full steps,
//! measuring the node and its pods, the decision, and what a step logs.
//! Acting on the decision is [`super::reclaim`]'s and [`super::evict`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::decide::{PressurePlan, Verdict};
use super::evict::Evicting;
use super::measure::{measure, NodeMemory};
use super::{psi, Monitor, MonitorError, StepReport, Wake};
use crate::evict::pods::{limit_hits, PauseCheck, POD_USAGE_SOURCE};
use crate::evict::rank::{self, Candidate, Ranking};
use crate::evict::{self, Settled};
use crate::node::cgroupfs::ReadError;
use crate::node::layout::Driver;

impl Monitor {
    /// A tick between full steps while calm needs only the quick check;
    /// `Some(next)` when that was enough. Cheap enough to run on the async
    /// loop without a trip to the blocking pool.
    pub fn quick(&mut self, wake: &Wake, now: Duration) -> Option<Duration> {
        let calm = matches!(wake, Wake::Tick)
            && now < self.quick.next_full
            && !self.decider.busy()
            && self.fast_until.is_none_or(|t| now >= t)
            && evict::lock(&self.evictor).hold(now).is_none();
        if calm {
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
        let capacity = self.quick.capacity;
        let threshold = self
            .cfg
            .hard_threshold
            .resolve(capacity)
            .max(self.cfg.soft_threshold.resolve(capacity));
        available.checked_sub(threshold.saturating_mul(2))?;
        Some(self.interval_for(available - threshold))
    }

    /// MemAvailable in kB from the kept-open /proc/meminfo.
    fn mem_available_kb(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let q = &mut self.quick;
        if q.meminfo.is_none() {
            q.meminfo = std::fs::File::open(self.paths.meminfo()).ok();
        }
        // MemAvailable is the third line; 4 KiB holds the whole file.
        q.buf.resize(4096, 0);
        let n = match q.meminfo.as_ref()?.read_at(&mut q.buf, 0) {
            Ok(n) => n,
            Err(_) => {
                q.meminfo = None;
                return None;
            }
        };
        let text = std::str::from_utf8(&q.buf[..n]).ok()?;
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
        let rate = self.cfg.max_fill_rate.resolve(self.quick.capacity).max(1);
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
        self.scanner.kubepods()
    }

    /// Measures and ranks without acting (for `--once` and for tests).
    pub fn snapshot(&mut self) -> Result<(NodeMemory, Vec<Candidate>, Ranking), MonitorError> {
        let node = self.measure()?;
        let cands = self.scanner.candidates(PauseCheck::EveryPod);
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
        self.quick.meminfo = None;
        self.publish_psi();
        if matches!(wake, Wake::Psi { .. }) {
            self.fast_until = Some(now + self.psi_followup);
        }
        let mut report = StepReport::new(self.cfg.pressure_interval.0);
        if let Some(next) = self.quick(wake, now) {
            report.next_check = next;
            return report;
        }
        let settled = evict::lock(&self.evictor).settle(now);
        let node = match self.measure() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot measure node memory");
                return report;
            }
        };
        report.node = Some(node);
        self.quick.capacity = node.capacity;
        let hold = evict::lock(&self.evictor).hold(now);
        let mut verdict =
            self.decider
                .observe(now, node.effective_available(), node.capacity, hold);
        verdict.kill_timed_out = settled == Settled::TimedOut;
        report.verdict = Some(verdict);
        if !self.escalate_unenforced(wake, now, &verdict, &mut report) {
            self.act(wake, now, node, verdict, &mut report);
        }
        self.end_step(now, &mut report);
        report
    }

    /// Acts on the plan.
    fn act(
        &mut self,
        wake: &Wake,
        now: Duration,
        node: NodeMemory,
        verdict: Verdict,
        report: &mut StepReport,
    ) {
        match verdict.plan {
            PressurePlan::Calm => {
                if matches!(wake, Wake::Psi { .. }) {
                    self.explain_psi(wake, now, &node, &verdict, report);
                }
            }
            PressurePlan::Watch | PressurePlan::Hold(_) => {
                tracing::debug!(plan = ?verdict.plan, available = node.effective_available(), "holding");
            }
            PressurePlan::Reclaim { deficit } => {
                let cands = self.scanner.candidates(PauseCheck::AtPick);
                let ranking = rank::rank(&cands, &self.policy);
                self.log_decision("reclaim", wake, &node, &verdict, &cands, &ranking);
                self.reclaim_top(deficit, &cands, &ranking, report);
                self.lower_besteffort_high(&cands, &ranking);
            }
            PressurePlan::Evict { reason, deficit } => {
                let e = Evicting {
                    wake,
                    now,
                    node,
                    verdict,
                    reason,
                    deficit,
                };
                self.evict(e, report)
            }
        }
    }

    /// After the plan: restore what pressure changed once it is over, and
    /// when to look next.
    fn end_step(&mut self, now: Duration, report: &mut StepReport) {
        if !self.decider.pressure() {
            if !self.lowered_high.is_empty() {
                self.restore_high();
            }
            evict::lock(&self.evictor).forget_stuck();
        }
        let following_psi = self.fast_until.is_some_and(|t| now < t);
        let holding = evict::lock(&self.evictor).hold(now).is_some();
        if !self.decider.busy() && !holding && !following_psi {
            report.next_check = self.calm_interval(report);
            self.quick.next_full = now + self.cfg.check_interval.0;
        }
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
            ranking = %rank::brief(cands, ranking),
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
            for pod in self.scanner.pod_cgroups(&kp, driver) {
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
