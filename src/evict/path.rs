//! The one eviction path the node-pressure monitor and the throttle guard
//! share, whichever of them run: at most one pod in flight across both, a
//! cooldown after it, a pod that would not die skipped after kill-timeout,
//! never a pod with only its sandbox left and never a node-critical one;
//! an Eviction through the API server where the caller asks for one, else
//! `cgroup.kill`. Each caller holds the lock for its whole decision, so two
//! callers never pick at once.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::kill::{self, ProcessOps};
use super::rank::{Candidate, RankPolicy};
use crate::metrics::Metrics;
use crate::node::cluster::{self, ClusterEvictions, EvictOutcome, EvictionNotice};
use crate::node::{time, QosClass};

/// The safeguards' settings (the `[monitor]` keys of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct EvictConfig {
    /// Log what would be killed, kill nothing.
    pub dry_run: bool,
    /// No new eviction this long after one finished.
    pub cooldown: Duration,
    /// Stop waiting for a victim's cgroup to empty after this.
    pub kill_timeout: Duration,
    /// Right after a kill, poll the victim's cgroup.events this long.
    pub kill_wait: Duration,
    /// Release killed processes' memory with process_mrelease.
    pub mrelease: bool,
    /// Who may never be evicted.
    pub rank: RankPolicy,
}

/// Why no eviction may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    KillInFlight,
    Cooldown { remaining: Duration },
}

/// Who asked for an eviction: an Eviction nobody carried out goes back to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    NodePressure,
    ThrottleGuard,
}

/// Why a pod is evicted (log lines and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Node memory below a threshold; `hard`: the hard one.
    NodePressure { hard: bool },
    /// The throttle guard's stage 2, naming the signal that held.
    Throttle { signal: &'static str },
    /// An Eviction through the API server (counted when it was created)
    /// that nobody carried out in time.
    UnenforcedEviction,
}

impl Cause {
    fn count(self, m: &Metrics, class: QosClass) {
        let class = format!("{class:?}");
        match self {
            Cause::NodePressure { hard } => {
                m.inc_eviction(&class, if hard { "hard" } else { "soft" })
            }
            Cause::Throttle { signal } => m.inc_throttle_eviction(&class, signal),
            Cause::UnenforcedEviction => {}
        }
    }
}

/// What one attempt did, for the callers' step reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Acted {
    /// UID of the pod killed.
    pub killed: Option<String>,
    /// UID dry-run would have killed.
    pub would_kill: Option<String>,
    /// UID evicted through the API server (not killed).
    pub evicted: Option<String>,
    /// The victim's cgroup emptied within kill-wait, after this long.
    pub emptied_after: Option<Duration>,
}

/// What [`Evictor::settle`] found about the pod in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Nothing,
    /// Its cgroup is empty: the cooldown runs.
    Emptied,
    /// Still populated after kill-timeout: a killed pod is skipped from now
    /// on; an Eviction nobody carried out waits for its caller
    /// ([`Evictor::take_unenforced`]).
    TimedOut,
}

#[derive(Debug, Clone)]
struct InFlight {
    uid: String,
    path: PathBuf,
    since: Duration,
    origin: Origin,
    /// Evicted through the API server, not killed.
    via_api: Option<Candidate>,
}

/// An Eviction the API server accepted that had not emptied the pod's
/// cgroup by kill-timeout.
#[derive(Debug, Clone)]
pub struct Unenforced {
    pub victim: Candidate,
    pub since: Duration,
}

/// One kill, as a caller orders it.
pub struct KillOrder<'a> {
    pub victim: &'a Candidate,
    pub now: Duration,
    pub cause: Cause,
    pub origin: Origin,
    /// What the API server learns after the kill, when there is one.
    pub tell_api: Option<EvictionNotice>,
    /// When the caller's step began (wake-up to kill latency).
    pub started: Instant,
    /// When the condition first held, if the caller knows.
    pub met_since: Option<Duration>,
    /// What woke the caller, for the log line.
    pub wake: &'a str,
}

/// A round of Evictions through the API server, down a ranking.
pub struct ApiRound<'a> {
    pub cands: &'a [Candidate],
    /// Candidates to try, best first (indices into `cands`).
    pub order: &'a [usize],
    pub now: Duration,
    pub cause: Cause,
    pub origin: Origin,
    /// The Eviction for a candidate; `None` for a pod the API cannot name.
    pub notice: &'a dyn Fn(&Candidate) -> Option<EvictionNotice>,
    pub proc_root: &'a Path,
}

/// How an [`ApiRound`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiOutcome {
    /// An Eviction was created for this UID; it is in flight until its
    /// cgroup empties.
    Evicted(String),
    /// Kill this candidate's cgroup instead: the API server did not
    /// answer, or the pod is one it cannot name.
    Kill(usize),
    /// Every candidate's PodDisruptionBudget refused: nothing evicted, the
    /// cooldown runs.
    Refused,
}

impl ApiOutcome {
    /// What is left for the caller: the candidate whose cgroup to kill,
    /// or `None` when the round settled it (an Eviction, noted in `acted`,
    /// or every budget refusing).
    pub fn left_to_kill(self, acted: &mut Acted) -> Option<usize> {
        match self {
            ApiOutcome::Evicted(uid) => {
                acted.evicted = Some(uid);
                None
            }
            ApiOutcome::Refused => None,
            ApiOutcome::Kill(i) => Some(i),
        }
    }
}

/// The path's state. Shared between callers as a [`SharedEvictor`].
pub struct Evictor {
    cfg: EvictConfig,
    ops: Arc<dyn ProcessOps>,
    cluster: Option<Arc<dyn ClusterEvictions>>,
    metrics: Option<Arc<Metrics>>,
    mrelease: bool,
    in_flight: Option<InFlight>,
    unenforced: Option<(Origin, Unenforced)>,
    cooldown_until: Option<Duration>,
    /// Pods still populated after kill-timeout (e.g. a task stuck in D
    /// state): skipped so the next pod gets its turn. Bounded by the pod
    /// count: gone cgroups are dropped, and the node path clears it when a
    /// pressure episode ends.
    stuck: HashSet<PathBuf>,
}

/// The evictor as its callers hold it; one lock per decision.
pub type SharedEvictor = Arc<Mutex<Evictor>>;

impl Evictor {
    pub fn new(cfg: EvictConfig, ops: Arc<dyn ProcessOps>) -> Self {
        Evictor {
            mrelease: cfg.mrelease,
            cfg,
            ops,
            cluster: None,
            metrics: None,
            in_flight: None,
            unenforced: None,
            cooldown_until: None,
            stuck: HashSet::new(),
        }
    }

    /// Also evict through the API server (see [`cluster`]).
    pub fn with_cluster(mut self, cluster: Arc<dyn ClusterEvictions>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Counts evictions in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn shared(self) -> SharedEvictor {
        Arc::new(Mutex::new(self))
    }

    pub fn config(&self) -> &EvictConfig {
        &self.cfg
    }

    /// The API server, when there is one and the path is not a dry run.
    pub fn cluster(&self) -> Option<Arc<dyn ClusterEvictions>> {
        self.cluster.clone().filter(|_| !self.cfg.dry_run)
    }

    /// Looks at the pod in flight: emptied, or given up on after kill-timeout.
    pub fn settle(&mut self, now: Duration) -> Settled {
        let Some(v) = &self.in_flight else {
            self.stuck.retain(|p| p.exists());
            return Settled::Nothing;
        };
        if !kill::populated(&v.path) {
            tracing::info!(victim = %v.uid, took_ms = time::millis(now.saturating_sub(v.since)), "victim pod cgroup is empty");
            self.finish(now);
            return Settled::Emptied;
        }
        if now.saturating_sub(v.since) < self.cfg.kill_timeout {
            return Settled::Nothing;
        }
        let Some(v) = self.in_flight.take() else {
            return Settled::Nothing;
        };
        self.finish(now);
        match v.via_api {
            Some(victim) => {
                let since = v.since;
                self.unenforced = Some((v.origin, Unenforced { victim, since }));
            }
            None => {
                tracing::warn!(victim = %v.uid, path = %v.path.display(), "victim cgroup still populated after kill-timeout; skipping it until pressure ends");
                self.stuck.insert(v.path);
            }
        }
        Settled::TimedOut
    }

    /// Why no eviction may start now, if one may not.
    pub fn hold(&self, now: Duration) -> Option<Hold> {
        if self.in_flight.is_some() || self.unenforced.is_some() {
            return Some(Hold::KillInFlight);
        }
        match self.cooldown_until {
            Some(until) if now < until => Some(Hold::Cooldown {
                remaining: until - now,
            }),
            _ => None,
        }
    }

    /// An Eviction `origin` asked for that nobody carried out: the caller
    /// kills it or leaves it to the kubelet.
    pub fn take_unenforced(&mut self, origin: Origin) -> Option<Unenforced> {
        match self.unenforced.take() {
            Some((o, u)) if o == origin => Some(u),
            other => {
                self.unenforced = other;
                None
            }
        }
    }

    /// Takes back an Eviction of `origin`'s still in flight (the caller
    /// kills that pod at once: past the hard threshold nothing waits).
    pub fn withdraw_api_eviction(&mut self, origin: Origin) -> Option<Unenforced> {
        match self.in_flight.take() {
            Some(InFlight {
                via_api: Some(victim),
                since,
                origin: o,
                ..
            }) if o == origin => Some(Unenforced { victim, since }),
            other => {
                self.in_flight = other;
                None
            }
        }
    }

    /// A pressure episode ended: pods that would not die get a new chance.
    pub fn forget_stuck(&mut self) {
        self.stuck.clear();
    }

    /// May this candidate be the victim now? Not one that would not die,
    /// not one with only its sandbox left, not a node-critical one.
    pub fn eligible(&self, c: &Candidate, proc_root: &Path) -> bool {
        if self.stuck.contains(&c.path) {
            tracing::info!(pod = %c.uid, "skipping pod that did not die after an earlier kill");
            return false;
        }
        if kill::pause_only(&c.path, proc_root) {
            tracing::info!(pod = %c.uid, "skipping pod with only the sandbox (pause) or nothing left");
            return false;
        }
        if c.class == QosClass::Burstable && kill::holds_node_critical_score(&c.path, proc_root) {
            tracing::info!(pod = %c.uid, oom_score_adj = kill::NODE_CRITICAL_OOM_SCORE_ADJ, "skipping node-critical pod (the kubelet's oom_score_adj for system-node-critical)");
            return false;
        }
        true
    }

    /// The first eligible candidate of `order`.
    pub fn pick(&self, cands: &[Candidate], order: &[usize], proc_root: &Path) -> Option<usize> {
        order
            .iter()
            .copied()
            .find(|&i| self.eligible(&cands[i], proc_root))
    }

    /// Evictions through the API server down `round.order`: the first one
    /// created is in flight; a PodDisruptionBudget's refusal passes the
    /// turn to the next eligible candidate.
    pub fn evict_via_api(
        &mut self,
        api: &dyn ClusterEvictions,
        round: &ApiRound<'_>,
    ) -> ApiOutcome {
        let mut refused = 0;
        for &i in round.order {
            let c = &round.cands[i];
            if !self.eligible(c, round.proc_root) {
                continue;
            }
            let Some(n) = (round.notice)(c) else {
                return ApiOutcome::Kill(i);
            };
            match api.evict(&n, cluster::SOFT_EVICTION_WAIT) {
                EvictOutcome::Created => {
                    tracing::warn!(
                        victim = %c.uid,
                        namespace = %n.namespace,
                        name = %n.name,
                        class = ?c.class,
                        working_set = n.working_set,
                        request = n.request,
                        request_source = %n.request_source,
                        priority = c.priority.unwrap_or(0),
                        why = %n.reason,
                        "evicted pod through the API server (the kubelet terminates it gracefully)"
                    );
                    if let Some(m) = &self.metrics {
                        round.cause.count(m, c.class);
                    }
                    self.in_flight = Some(InFlight {
                        uid: c.uid.clone(),
                        path: c.path.clone(),
                        since: round.now,
                        origin: round.origin,
                        via_api: Some(c.clone()),
                    });
                    return ApiOutcome::Evicted(c.uid.clone());
                }
                EvictOutcome::RefusedByPdb => {
                    refused += 1;
                    tracing::info!(pod = %format_args!("{}/{}", n.namespace, n.name), "PodDisruptionBudget refused the eviction; trying the next candidate");
                }
                EvictOutcome::Unreachable => {
                    tracing::warn!(pod = %format_args!("{}/{}", n.namespace, n.name), "API server unreachable; killing the pod's cgroup instead");
                    return ApiOutcome::Kill(i);
                }
            }
        }
        tracing::warn!(
            refused,
            "every candidate's PodDisruptionBudget refused an eviction; nothing evicted"
        );
        self.finish(round.now);
        ApiOutcome::Refused
    }

    /// A dry run's kill: nothing happens, but the cooldown runs, so a dry
    /// run logs once per cooldown.
    pub fn pretend(&mut self, now: Duration, uid: &str) -> Acted {
        self.finish(now);
        Acted {
            would_kill: Some(uid.to_string()),
            ..Acted::default()
        }
    }

    /// The kill: cgroup.kill + process_mrelease, then watching the cgroup
    /// empty for kill-wait; the pod stays in flight until it does.
    pub fn kill(&mut self, o: KillOrder<'_>) -> Acted {
        let victim = o.victim;
        if self.cfg.dry_run {
            return self.pretend(o.now, &victim.uid);
        }
        let t = Instant::now();
        match kill::kill_pod(&victim.path, self.ops.as_ref(), self.mrelease) {
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
                    // Detection to decision: the wake-up until the kill is issued.
                    wake_to_kill_us = time::micros(t.duration_since(o.started)),
                    met_to_kill_ms = o.met_since.map_or(0, |m| time::millis(o.now.saturating_sub(m))),
                    wake = o.wake,
                    cause = ?o.cause,
                    "killed pod"
                );
                // Killed first; the API learns of it in the background.
                if let (Some(api), Some(n)) = (&self.cluster, o.tell_api) {
                    api.evict_after_kill(n);
                }
                if let Some(m) = &self.metrics {
                    o.cause.count(m, victim.class);
                }
                self.in_flight = Some(InFlight {
                    uid: victim.uid.clone(),
                    path: victim.path.clone(),
                    since: o.now,
                    origin: o.origin,
                    via_api: None,
                });
                Acted {
                    killed: Some(victim.uid.clone()),
                    emptied_after: self.wait_empty(victim, o.now, t),
                    ..Acted::default()
                }
            }
            Err(e) => {
                tracing::error!(victim = %victim.uid, error = %e, "kill failed");
                // Cool down anyway so a broken cgroup is not hammered.
                self.finish(o.now);
                Acted::default()
            }
        }
    }

    /// Nothing else may happen while a kill is in flight, so watch the
    /// cgroup empty closely for a short while: frees the cooldown sooner
    /// and measures kill-to-empty to ~5 ms.
    fn wait_empty(&mut self, victim: &Candidate, now: Duration, t: Instant) -> Option<Duration> {
        while t.elapsed() < self.cfg.kill_wait {
            if !kill::populated(&victim.path) {
                let took = t.elapsed();
                tracing::info!(victim = %victim.uid, took_ms = time::millis(took), "victim pod cgroup is empty");
                self.finish(now + took);
                return Some(took);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// The pod in flight is done with (or there was none): cooldown.
    fn finish(&mut self, now: Duration) {
        self.in_flight = None;
        self.cooldown_until = Some(now + self.cfg.cooldown);
    }
}

/// Locks the shared evictor (a caller that panicked mid-decision leaves
/// state that is still consistent: each field is set in one assignment).
pub fn lock(e: &SharedEvictor) -> MutexGuard<'_, Evictor> {
    crate::node::lock(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evict::kill::fake::FakeOps;
    use crate::evict::pods::{PauseCheck, PodScanner};
    use crate::evict::testing::*;
    use crate::node::layout::Driver;

    fn evictor() -> Evictor {
        Evictor::new(evict_config(), Arc::new(FakeOps::default()))
    }

    fn two_pods() -> (Fake, Vec<Candidate>) {
        let f = Fake::new(Driver::Cgroupfs);
        f.pod("a-1", QosClass::BestEffort, 300 << 20, 0, "web");
        f.pod("b-1", QosClass::Burstable, 300 << 20, 64 << 20, "api");
        let cands =
            PodScanner::new(f.tree(), Arc::new(Pods::default())).candidates(PauseCheck::AtPick);
        (f, cands)
    }

    fn order(ev: &mut Evictor, c: &Candidate, now: Duration, origin: Origin) -> Acted {
        ev.kill(KillOrder {
            victim: c,
            now,
            cause: Cause::NodePressure { hard: true },
            origin,
            tell_api: None,
            started: Instant::now(),
            met_since: None,
            wake: "test",
        })
    }

    /// One pod in flight until its cgroup empties, then the cooldown.
    #[test]
    fn one_in_flight_then_cooldown() {
        let (f, cands) = two_pods();
        let mut ev = evictor();
        assert_eq!(ev.hold(ms(0)), None);
        let acted = order(&mut ev, &cands[0], ms(0), Origin::ThrottleGuard);
        assert_eq!(acted.killed.as_deref(), Some("a-1"));
        assert_eq!(ev.settle(ms(100)), Settled::Nothing);
        assert_eq!(ev.hold(ms(100)), Some(Hold::KillInFlight));
        f.gone(&cands[0].path);
        assert_eq!(ev.settle(ms(300)), Settled::Emptied);
        assert_eq!(
            ev.hold(ms(400)),
            Some(Hold::Cooldown { remaining: ms(900) })
        );
        assert_eq!(ev.hold(ms(1300)), None);
    }

    /// A killed pod that does not die is given up on after kill-timeout and
    /// skipped from then on, until a pressure episode ends or it is gone.
    #[test]
    fn a_pod_that_does_not_die_is_skipped_after_kill_timeout() {
        let (f, cands) = two_pods();
        let mut ev = evictor();
        let all = [0, 1];
        order(&mut ev, &cands[0], ms(0), Origin::NodePressure);
        assert_eq!(ev.settle(ms(4999)), Settled::Nothing);
        assert_eq!(ev.settle(ms(5000)), Settled::TimedOut);
        assert!(matches!(ev.hold(ms(5000)), Some(Hold::Cooldown { .. })));
        assert_eq!(ev.pick(&cands, &all, &f.proc_root), Some(1));
        ev.forget_stuck();
        assert_eq!(ev.pick(&cands, &all, &f.proc_root), Some(0));
        order(&mut ev, &cands[0], ms(7000), Origin::NodePressure);
        assert_eq!(ev.settle(ms(12_000)), Settled::TimedOut);
        f.gone(&cands[0].path);
        ev.settle(ms(13_000));
        assert!(ev.stuck.is_empty(), "a gone cgroup is not remembered");
    }

    /// An Eviction nobody carried out goes back to whoever asked, and
    /// holds every other user until then; one still in flight can be
    /// taken back at once.
    #[test]
    fn an_unenforced_eviction_goes_back_to_its_origin() {
        let (_f, cands) = two_pods();
        let mut ev = evictor();
        ev.in_flight = Some(InFlight {
            uid: "a-1".into(),
            path: cands[0].path.clone(),
            since: ms(0),
            origin: Origin::NodePressure,
            via_api: Some(cands[0].clone()),
        });
        assert!(ev.withdraw_api_eviction(Origin::ThrottleGuard).is_none());
        assert_eq!(ev.settle(ms(5000)), Settled::TimedOut);
        assert_eq!(ev.hold(ms(9000)), Some(Hold::KillInFlight));
        assert!(ev.take_unenforced(Origin::ThrottleGuard).is_none());
        let u = ev.take_unenforced(Origin::NodePressure).unwrap();
        assert_eq!((u.victim.uid.as_str(), u.since), ("a-1", ms(0)));
        assert_eq!(ev.hold(ms(9000)), None);

        ev.in_flight = Some(InFlight {
            uid: "b-1".into(),
            path: cands[1].path.clone(),
            since: ms(10_000),
            origin: Origin::NodePressure,
            via_api: Some(cands[1].clone()),
        });
        let u = ev.withdraw_api_eviction(Origin::NodePressure).unwrap();
        assert_eq!(u.victim.uid, "b-1");
        assert_eq!(ev.hold(ms(10_000)), None);
    }
}
