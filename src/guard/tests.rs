//! Guard tests on fake cgroup/proc trees (`crate::evict::testing`) with a
//! fake clock: the guard alone, through the API server, and sharing the
//! eviction path with the node-pressure monitor's users.

// Tests cast small, known values; the cast lints guard the product code.
#![allow(clippy::cast_possible_truncation, clippy::cast_lossless)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::evict::kill::fake::FakeOps;
use crate::evict::testing::*;
use crate::evict::{Cause, Evictor, Hold, KillOrder, Origin};
use crate::node::layout::Driver;
use crate::node::QosClass;

/// Writes a container's throttle files, mirroring its counters into the pod
/// and the QoS parent (memory.events is hierarchical).
fn throttle_files(
    f: &Fake,
    pod: &Path,
    counters: (u64, u64),
    psi: f64,
    high: &str,
    max: &str,
) -> PathBuf {
    let app = pod.join("app");
    let events = format!(
        "low 0\nhigh {}\nmax {}\noom 0\noom_kill 0\n",
        counters.0, counters.1
    );
    for cg in [app.as_path(), pod, pod.parent().unwrap()] {
        w(&cg.join("memory.events"), &events);
        f.psi(&cg.join("memory.pressure"), psi, 0.0);
    }
    w(&app.join("memory.high"), &format!("{high}\n"));
    w(&app.join("memory.max"), &format!("{max}\n"));
    app
}

fn throttle_monitor(f: &Fake, reg: Pods) -> (Guard, Arc<FakeOps>) {
    guard_with(f, ThrottleConfig::default(), reg, |e| e)
}

/// A guard on `f` whose eviction path `with` may give an API server.
fn guard_with(
    f: &Fake,
    cfg: ThrottleConfig,
    reg: Pods,
    with: impl FnOnce(Evictor) -> Evictor,
) -> (Guard, Arc<FakeOps>) {
    let ops = Arc::new(FakeOps::default());
    let evictor = with(Evictor::new(evict_config(), ops.clone())).shared();
    (Guard::new(cfg, f.tree(), Arc::new(reg), evictor), ops)
}

/// 200 high events/s for 30 s on a Burstable container (236Mi of 256Mi):
/// memory.high goes to memory.max once, after the grace period; a
/// Guaranteed pod whose counters move just as much is never touched.
#[test]
fn throttle_sustained_high_relaxes_once_through_the_file() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-1", QosClass::Burstable, 240 * MI, 64 * MI, "memhog");
    let g = f.pod("g-1", QosClass::Guaranteed, 100 * MI, 256 * MI, "db");
    let (mut m, ops) = throttle_monitor(&f, Pods::default());
    let (high, max) = ((236 * MI).to_string(), (256 * MI).to_string());
    let mut relaxed_at = Vec::new();
    for i in 0..60u64 {
        let now = ms(i * 500);
        // Once relaxed, the file says high == max and the events stop.
        let app = b.join("app");
        let cur = fs::read_to_string(app.join("memory.high")).unwrap_or(high.clone());
        let events = if cur.trim() == max { 2000 } else { i * 100 };
        throttle_files(&f, &b, (events, 0), 20.0, cur.trim(), &max);
        throttle_files(&f, &g, (i * 100, 0), 20.0, &max, &max);
        let r = m.step(now);
        if !r.relaxed.is_empty() {
            relaxed_at.push((now, r.relaxed.clone()));
        }
        assert!(r.acted.killed.is_none(), "step {i}: {r:?}");
    }
    assert_eq!(relaxed_at.len(), 1, "{relaxed_at:?}");
    let (at, which) = &relaxed_at[0];
    assert_eq!(which, &vec![b.join("app")]);
    // First rate after RATE_WINDOW (2 s), then the 10 s grace period.
    assert!(*at >= ms(10_000) && *at <= ms(12_500), "relaxed at {at:?}");
    assert_eq!(
        fs::read_to_string(b.join("app/memory.high"))
            .unwrap()
            .trim(),
        max
    );
    assert_eq!(
        fs::read_to_string(g.join("app/memory.high"))
            .unwrap()
            .trim(),
        max
    );
    assert!(ops.killed.lock().unwrap().is_empty());
    assert!(!killed(&b) && !killed(&g));
}

/// A transient 5 s burst (shorter than the grace period) and a container
/// restart (counters back to 0, then climbing slowly) never act.
#[test]
fn throttle_transient_spike_and_restart_do_nothing() {
    let f = Fake::new(Driver::Cgroupfs);
    let b = f.pod("b-2", QosClass::Burstable, 240 * MI, 64 * MI, "memhog");
    let (mut m, _) = throttle_monitor(&f, Pods::default());
    let (high, max) = ((236 * MI).to_string(), (256 * MI).to_string());
    let mut n = 0;
    for i in 0..80u64 {
        let (burst, psi) = if (4..14).contains(&i) {
            (500, 30.0)
        } else {
            (0, 0.0)
        };
        n += burst;
        if i == 40 {
            n = 3; // restart: a new cgroup, counters from 0
        }
        throttle_files(&f, &b, (n, 0), psi, &high, &max);
        let r = m.step(ms(i * 500));
        assert!(
            r.relaxed.is_empty() && r.acted.killed.is_none(),
            "step {i}: {r:?}"
        );
    }
    assert_eq!(
        fs::read_to_string(b.join("app/memory.high")).unwrap(),
        format!("{high}\n")
    );
}

/// Stage 2 without a `high` signal: two pods stalled (PSI only) past the
/// grace period; the ranking picks the larger usage above request first
/// (the kubelet's order, as under node pressure), and nothing is relaxed.
#[test]
fn throttle_psi_only_evicts_in_ranking_order() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-3", QosClass::Burstable, 300 * MI, 64 * MI, "worker");
    let e = f.pod("e-3", QosClass::BestEffort, 400 * MI, 0, "batch");
    let (mut m, _) = throttle_monitor(&f, Pods::default());
    let mut killed_at = None;
    for i in 0..30u64 {
        let max = (512 * MI).to_string();
        throttle_files(&f, &b, (0, 0), 40.0, &max, &max);
        throttle_files(&f, &e, (0, 0), 40.0, &(400 * MI).to_string(), "max");
        let r = m.step(ms(i * 500));
        assert!(r.relaxed.is_empty(), "step {i}: {r:?}");
        if let Some(uid) = r.acted.killed.clone() {
            killed_at = Some((ms(i * 500), uid));
            break;
        }
    }
    let (at, uid) = killed_at.expect("a stalled pod is evicted");
    assert_eq!(uid, "e-3");
    assert!(at >= ms(10_000), "{at:?}");
    assert!(killed(&e) && !killed(&b));
    // The runtime has not removed the emptied cgroup yet and its PSI still
    // reads high: the guard lets it go instead of deciding again each pass.
    for cg in [e.clone(), e.join("app"), e.join("pause")] {
        w(&cg.join("cgroup.events"), "populated 0\nfrozen 0\n");
    }
    for i in 1..=4u64 {
        let r = m.step(at + ms(i * 500));
        assert!(r.acted.killed.is_none(), "{r:?}");
    }
    assert!(!m.throttles.is_tracked(&e.join("app")));
    assert!(m.throttles.is_tracked(&b.join("app")));
}

/// Critical pods are never throttle victims; dry-run relaxes nothing.
#[test]
fn throttle_never_critical_and_dry_run_writes_nothing() {
    let f = Fake::new(Driver::Systemd);
    let reg = Pods::default();
    reg.upsert(info("c-4", "kube-system", None));
    let c = f.pod("c-4", QosClass::Burstable, 300 * MI, 64 * MI, "dns");
    let (mut m, _) = throttle_monitor(&f, reg);
    let (high, max) = ((236 * MI).to_string(), (256 * MI).to_string());
    for i in 0..60u64 {
        throttle_files(&f, &c, (0, i * 100), 40.0, &max, &max);
        let r = m.step(ms(i * 500));
        assert!(r.acted.killed.is_none(), "step {i}: {r:?}");
    }
    assert!(!killed(&c));

    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-4", QosClass::Burstable, 240 * MI, 64 * MI, "memhog");
    let cfg = ThrottleConfig {
        dry_run: true,
        ..ThrottleConfig::default()
    };
    let (mut m, _) = guard_with(&f, cfg, Pods::default(), |e| e);
    let mut would = 0;
    for i in 0..30u64 {
        throttle_files(&f, &b, (i * 100, 0), 5.0, &high, &max);
        would += m.step(ms(i * 500)).relaxed.len();
    }
    assert_eq!(would, 1);
    assert_eq!(
        fs::read_to_string(b.join("app/memory.high")).unwrap(),
        format!("{high}\n")
    );
}

/// With the API server configured, the guard's relax posts one notice (the
/// `MemoryHighRelaxed` Event) for the pod it knows, and none for a pod it
/// does not know; the relax itself never depends on it.
#[test]
fn throttle_relax_tells_the_api_server_about_known_pods() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-7", QosClass::Burstable, 240 * MI, 64 * MI, "memhog");
    let u = f.pod("u-7", QosClass::Burstable, 240 * MI, 64 * MI, "memhog");
    let reg = Pods::default();
    reg.upsert(info("b-7", "default", None));
    let api = Arc::new(FakeCluster::default());
    let with = api.clone();
    let (m, _) = guard_with(&f, ThrottleConfig::default(), reg, |e| e.with_cluster(with));
    let mut m = m.with_cluster(api.clone());
    let (high, max) = ((236 * MI).to_string(), (256 * MI).to_string());
    let mut relaxed = 0;
    for i in 0..30u64 {
        for pod in [&b, &u] {
            let cur = fs::read_to_string(pod.join("app/memory.high")).unwrap_or(high.clone());
            throttle_files(&f, pod, (i * 100, 0), 20.0, cur.trim(), &max);
        }
        relaxed += m.step(ms(i * 500)).relaxed.len();
    }
    assert_eq!(relaxed, 2);
    for pod in [&b, &u] {
        let v = fs::read_to_string(pod.join("app/memory.high")).unwrap();
        assert_eq!(v.trim(), max);
    }
    let told = api.relaxed.lock().unwrap();
    assert_eq!(told.len(), 1, "{told:?}");
    let n = &told[0];
    assert_eq!(
        (n.uid.as_str(), n.namespace.as_str(), n.name.as_str()),
        ("b-7", "default", "b-7-name")
    );
    assert_eq!(
        (n.from.as_str(), n.to.as_str()),
        (high.as_str(), max.as_str())
    );
    assert!(n.high_rate > 50.0 && n.psi_some_avg10 > 10.0, "{n:?}");
    assert_eq!(n.grace, "10s");
    assert!(api.asked.lock().unwrap().is_empty());
}

/// Drives a PSI-only stall (no `high`, no `max`: stage 2 straight after
/// the grace period) of the pods in `stalled` until the guard acts or 30
/// looks pass; returns when it acted and what it did.
fn stall_until_acted(f: &Fake, m: &mut Guard, stalled: &[&Path]) -> Option<(Duration, Acted)> {
    for i in 0..30u64 {
        for pod in stalled {
            let (high, max) = ((400 * MI).to_string(), (512 * MI).to_string());
            throttle_files(f, pod, (0, 0), 40.0, &high, &max);
        }
        let r = m.step(ms(i * 500));
        if r.acted != Acted::default() {
            return Some((ms(i * 500), r.acted));
        }
    }
    None
}

/// With the API server, stage 2 creates an Eviction (the kubelet
/// terminates the pod gracefully) instead of killing the cgroup; a
/// PodDisruptionBudget's refusal passes the turn to the next throttled pod,
/// and the Event says why.
#[test]
fn throttle_evicts_through_the_api_and_a_pdb_passes_the_turn() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-8", QosClass::Burstable, 300 * MI, 64 * MI, "worker");
    let e = f.pod("e-8", QosClass::BestEffort, 400 * MI, 0, "batch");
    let reg = Pods::default();
    reg.upsert(info("b-8", "default", None));
    reg.upsert(info("e-8", "default", None));
    let api = Arc::new(FakeCluster {
        refuse: vec!["e-8"],
        ..Default::default()
    });
    let with = api.clone();
    let (mut m, ops) = guard_with(&f, ThrottleConfig::default(), reg, |e| e.with_cluster(with));
    let (at, acted) = stall_until_acted(&f, &mut m, &[&b, &e]).expect("a stalled pod is evicted");
    assert!(at >= ms(10_000), "{at:?}");
    assert_eq!(acted.evicted.as_deref(), Some("b-8"));
    assert!(acted.killed.is_none() && !killed(&b) && !killed(&e));
    assert!(ops.killed.lock().unwrap().is_empty());
    // e-8 first in the kubelet's order, refused by its budget; not hard.
    assert_eq!(
        *api.asked.lock().unwrap(),
        [("e-8".to_string(), false), ("b-8".to_string(), false)]
    );
}

/// The guard's Eviction that nobody carries out ends, after kill-timeout,
/// in that pod's kill; an API server that does not answer gets the pod's
/// cgroup killed at once, and is told afterwards.
#[test]
fn throttle_eviction_nobody_carries_out_and_an_unreachable_api_end_in_a_kill() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-9", QosClass::Burstable, 300 * MI, 64 * MI, "worker");
    let reg = Pods::default();
    reg.upsert(info("b-9", "default", None));
    let api = Arc::new(FakeCluster::default());
    let with = api.clone();
    let (mut m, _) = guard_with(&f, ThrottleConfig::default(), reg, |e| e.with_cluster(with));
    let (at, acted) = stall_until_acted(&f, &mut m, &[&b]).unwrap();
    assert_eq!(acted.evicted.as_deref(), Some("b-9"));
    assert!(!killed(&b));
    let r = m.step(at + ms(4_500));
    assert!(r.acted.killed.is_none(), "{r:?}");
    let r = m.step(at + ms(5_000));
    assert_eq!(r.acted.killed.as_deref(), Some("b-9"));
    assert!(killed(&b));

    let f = Fake::new(Driver::Cgroupfs);
    let b = f.pod("b-10", QosClass::Burstable, 300 * MI, 64 * MI, "worker");
    let reg = Pods::default();
    reg.upsert(info("b-10", "default", None));
    let api = Arc::new(FakeCluster {
        unreachable: true,
        ..Default::default()
    });
    let with = api.clone();
    let (mut m, _) = guard_with(&f, ThrottleConfig::default(), reg, |e| e.with_cluster(with));
    let (_, acted) = stall_until_acted(&f, &mut m, &[&b]).unwrap();
    assert_eq!(acted.killed.as_deref(), Some("b-10"));
    assert!(killed(&b));
    // Asked once (no answer), told once after the kill.
    assert_eq!(
        *api.asked.lock().unwrap(),
        [("b-10".to_string(), false), ("b-10".to_string(), false)]
    );
}

/// A Burstable pod whose app holds the kubelet's oom_score_adj for
/// system-node-critical pods is never a throttle victim, even without the
/// API server to say its priority.
#[test]
fn throttle_never_evicts_a_node_critical_burstable_pod() {
    let f = Fake::new(Driver::Systemd);
    let c = f.pod(
        "cni-1",
        QosClass::Burstable,
        300 * MI,
        64 * MI,
        "calico-node",
    );
    let app_pid: i32 = fs::read_to_string(c.join("app/cgroup.procs"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    w(
        &f.proc_root.join(format!("{app_pid}/oom_score_adj")),
        "-997\n",
    );
    let (mut m, ops) = throttle_monitor(&f, Pods::default());
    assert_eq!(stall_until_acted(&f, &mut m, &[&c]), None);
    assert!(!killed(&c) && ops.killed.lock().unwrap().is_empty());
}

/// A pod with only its sandbox (pause) left is neither relaxed nor evicted,
/// however long it reads as stalled.
#[test]
fn throttle_never_touches_a_pause_only_pod() {
    let f = Fake::new(Driver::Systemd);
    let p = f.pod("p-12", QosClass::Burstable, 300 * MI, 64 * MI, "pause");
    let (mut m, ops) = throttle_monitor(&f, Pods::default());
    assert_eq!(stall_until_acted(&f, &mut m, &[&p]), None);
    assert!(!killed(&p) && ops.killed.lock().unwrap().is_empty());
}

/// One eviction in flight across the guard and the node-pressure monitor:
/// while the monitor's victim has not emptied, and during the cooldown
/// after it, the guard evicts nothing; then it does.
#[test]
fn throttle_waits_for_the_other_users_eviction_and_its_cooldown() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-11", QosClass::Burstable, 300 * MI, 64 * MI, "worker");
    let other = f.pod("be-11", QosClass::BestEffort, 900 * MI, 0, "hog");
    let (mut m, _) = throttle_monitor(&f, Pods::default());
    let victim = PodScanner::new(f.tree(), Arc::new(Pods::default()))
        .candidates(crate::evict::PauseCheck::AtPick)
        .into_iter()
        .find(|c| c.uid == "be-11")
        .unwrap();
    let mut acted_at = None;
    for i in 0..40u64 {
        let now = ms(i * 500);
        if i == 18 {
            // 9 s, just before the guard's grace period ends: the
            // monitor kills another pod, which empties at 12 s.
            let acted = evict::lock(&m.evictor).kill(KillOrder {
                victim: &victim,
                now,
                cause: Cause::NodePressure { hard: true },
                origin: Origin::NodePressure,
                tell_api: None,
                started: std::time::Instant::now(),
                met_since: None,
                wake: "tick",
            });
            assert_eq!(acted.killed.as_deref(), Some("be-11"));
        }
        if i == 24 {
            f.gone(&other);
        }
        let (high, max) = ((400 * MI).to_string(), (512 * MI).to_string());
        throttle_files(&f, &b, (0, 0), 40.0, &high, &max);
        let r = m.step(now);
        if let Some(uid) = &r.acted.killed {
            assert_eq!(uid, "b-11");
            acted_at = Some(now);
            break;
        }
        if (19..24).contains(&i) {
            assert_eq!(evict::lock(&m.evictor).hold(now), Some(Hold::KillInFlight));
        }
    }
    // Emptied at 12 s, then the 1 s cooldown.
    assert_eq!(acted_at, Some(ms(13_000)));
    assert!(killed(&b));
}
