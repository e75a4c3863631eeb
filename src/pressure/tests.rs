//! Monitor tests on fake cgroup/proc trees with injected wake-ups and a
//! fake clock. Nothing here touches the real /sys/fs/cgroup or /proc.

// Tests cast small, known values; the cast lints guard the product code.
#![allow(clippy::cast_possible_truncation, clippy::cast_lossless)]

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::decide::{Hold, PressurePlan};
use super::*;
use crate::evict::kill::fake::FakeOps;
use crate::evict::pods::{cgroup_working_set, derive_request};
use crate::evict::rank::{self, Candidate};
use crate::evict::testing::*;
use crate::evict::Evictor;
use crate::node::layout::Driver;
use crate::node::registry::{PodInfo, RequestSource};
use crate::node::QosClass;
use std::sync::Mutex;

fn paths(f: &Fake) -> Paths {
    Paths {
        cgroup_root: f.cgroup_root.clone(),
        proc_root: f.proc_root.clone(),
    }
}

fn monitor(f: &Fake, cfg: MonitorConfig, reg: Pods) -> (Monitor, Arc<FakeOps>) {
    monitor_with(f, cfg, reg, |e| e)
}

/// A monitor on `f` whose eviction path `with` may give an API server or
/// metrics.
fn monitor_with(
    f: &Fake,
    cfg: MonitorConfig,
    reg: Pods,
    with: impl FnOnce(Evictor) -> Evictor,
) -> (Monitor, Arc<FakeOps>) {
    let ops = Arc::new(FakeOps::default());
    // Fake pods never die by themselves; do not spin on them.
    let cfg = MonitorConfig {
        kill_wait: "0s".parse().unwrap(),
        ..cfg
    };
    let evictor = with(Evictor::new((&cfg).into(), ops.clone())).shared();
    (Monitor::new(cfg, paths(f), Arc::new(reg), evictor), ops)
}

fn psi_wake() -> Wake {
    Wake::Psi {
        source: "kubepods:full 100000 1000000".into(),
    }
}

/// One pod thrashing against its own memory.max drives kubepods PSI way up
/// while the node has 12Gi free: nothing may be reclaimed or killed.
#[test]
fn pressure_single_pod_at_own_limit_evicts_nothing() {
    let f = Fake::new(Driver::Systemd);
    let hog = f.pod("hog-1", QosClass::Burstable, 512 * MI, 128 * MI, "hog");
    let other = f.pod("be-1", QosClass::BestEffort, 300 * MI, 0, "web");
    f.psi(&f.kp.join("memory.pressure"), 85.0, 70.0);
    f.psi(&f.node_psi(), 40.0, 30.0);
    let (mut m, ops) = monitor(&f, MonitorConfig::default(), Pods::default());

    let r = m.step(&psi_wake(), ms(0));
    assert_eq!(r.verdict.unwrap().plan, PressurePlan::Calm);
    w(
        &hog.join("app/memory.events.local"),
        "low 0\nhigh 0\nmax 57\noom 0\noom_kill 0\n",
    );
    let r = m.step(&psi_wake(), ms(100));
    assert_eq!(r.limit_bound, vec!["hog-1(+57)".to_string()]);
    // Keep waking it for 20 s worth of trigger windows.
    for i in 2..200 {
        let r = m.step(&psi_wake(), ms(i * 100));
        assert_eq!(r.verdict.unwrap().plan, PressurePlan::Calm);
        assert!(r.killed.is_none() && r.would_kill.is_none() && r.reclaimed.is_empty());
    }
    assert!(!killed(&hog) && !killed(&other));
    assert_eq!(fs::read_to_string(hog.join("memory.reclaim")).unwrap(), "");
    assert!(ops.killed.lock().unwrap().is_empty());
    // Fast checks for one trigger window after a PSI wake, then the slow tick.
    assert_eq!(m.step(&psi_wake(), ms(20_000)).next_check, ms(100));
    // 12Gi free minus the 300Mi soft threshold, at 6000Mi/s: just under 2 s.
    let next = r_next(&mut m, ms(30_000));
    assert!(next > ms(1900) && next < ms(2100), "{next:?}");
}

/// While calm the next check comes sooner the closer memory.available is
/// to the soft threshold (earlyoom's rule): anonymous memory can fill a
/// node without swap before PSI says anything.
/// Between full steps a calm monitor reads only MemAvailable; it measures
/// in full at check-interval or as soon as MemAvailable comes near a
/// threshold.
#[test]
fn pressure_quick_checks_between_full_steps() {
    let f = Fake::new(Driver::Cgroupfs);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), Pods::default());
    f.node_ws(TOTAL - 1200 * MI);
    let r = m.step(&Wake::Tick, ms(0));
    assert!(r.node.is_some(), "the first step measures in full");
    assert_eq!(r.next_check, ms(150));
    // 150 ms later: only meminfo was read.
    let r = m.step(&Wake::Tick, ms(150));
    assert!(r.node.is_none() && r.verdict.is_none(), "{r:?}");
    assert_eq!(r.next_check, ms(150));
    // MemAvailable within one threshold of the 300Mi soft one: full step now.
    f.node_ws(TOTAL - 500 * MI);
    let r = m.step(&Wake::Tick, ms(300));
    assert!(r.node.is_some(), "{r:?}");
    // Far from it again, but check-interval since the last full step passed.
    f.node_ws(TOTAL - 1200 * MI);
    assert!(m.step(&Wake::Tick, ms(400)).node.is_none());
    assert!(m.step(&Wake::Tick, ms(5300)).node.is_some());
}

#[test]
fn pressure_calm_checks_come_sooner_near_the_threshold() {
    let f = Fake::new(Driver::Cgroupfs);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), Pods::default());
    let cfg = MonitorConfig::default();
    // 12Gi free: clamped to the slow check.
    f.node_ws(4 * GI);
    let slow = MonitorConfig {
        max_fill_rate: "1Gi".parse().unwrap(),
        ..MonitorConfig::default()
    };
    let (mut m_slow_rate, _) = monitor(&f, slow, Pods::default());
    assert_eq!(r_next(&mut m_slow_rate, ms(0)), cfg.check_interval.0);
    // 900Mi above the 300Mi soft threshold at 6000Mi/s: 150 ms.
    f.node_ws(TOTAL - 1200 * MI);
    assert_eq!(r_next(&mut m, ms(0)), ms(150));
    // Right at the threshold's edge: never faster than pressure-interval.
    f.node_ws(TOTAL - 310 * MI);
    assert_eq!(r_next(&mut m, ms(0)), cfg.pressure_interval.0);
}

fn r_next(m: &mut Monitor, now: Duration) -> Duration {
    m.step(&Wake::Tick, now).next_check
}

fn pressure_tree(driver: Driver) -> (Fake, Pods, [PathBuf; 6]) {
    let f = Fake::new(driver);
    let g = f.pod("g-1", QosClass::Guaranteed, GI, GI, "db");
    let b_under = f.pod("b-under", QosClass::Burstable, 100 * MI, 200 * MI, "api");
    let b_over = f.pod("b-over", QosClass::Burstable, 900 * MI, 200 * MI, "batch");
    let be = f.pod("be-1", QosClass::BestEffort, 300 * MI, 0, "web");
    let sys = f.pod("sys-1", QosClass::BestEffort, 2 * GI, 0, "coredns");
    let crit = f.pod("crit-1", QosClass::BestEffort, 3 * GI, 0, "agent");
    let reg = Pods::default();
    reg.upsert(info("sys-1", "kube-system", None));
    reg.upsert(info("crit-1", "monitoring", Some(2_000_001_000)));
    reg.upsert(info("b-over", "default", Some(0)));
    // 50Mi left: below the 100Mi hard threshold.
    f.node_ws(TOTAL - 50 * MI);
    f.psi(&f.node_psi(), 30.0, 12.0);
    (f, reg, [g, b_under, b_over, be, sys, crit])
}

#[test]
fn pressure_hard_kills_one_pod_in_kubelet_order_then_waits() {
    let (f, reg, [g, b_under, b_over, be, sys, crit]) = pressure_tree(Driver::Cgroupfs);
    let (mut m, ops) = monitor(&f, MonitorConfig::default(), reg);

    let r = m.step(&psi_wake(), ms(0));
    assert_eq!(r.killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
    // mrelease on both pinned pids (pause + app) of the victim.
    assert_eq!(*ops.mreleased.lock().unwrap(), 2);
    // Past the hard threshold the kill is not delayed by a reclaim.
    assert!(r.reclaimed.is_empty());
    assert_eq!(fs::read_to_string(be.join("memory.reclaim")).unwrap(), "");

    // At most one kill in flight: still populated, so hold.
    for t in [100, 200, 300] {
        let r = m.step(&Wake::Tick, ms(t));
        assert_eq!(
            r.verdict.unwrap().plan,
            PressurePlan::Hold(Hold::KillInFlight)
        );
        assert!(r.killed.is_none());
        assert_eq!(r.next_check, ms(100));
    }
    // The victim's cgroup empties; cooldown starts.
    f.gone(&b_over);
    let r = m.step(&Wake::Tick, ms(400));
    assert_eq!(
        r.verdict.unwrap().plan,
        PressurePlan::Hold(Hold::Cooldown {
            remaining: ms(1000)
        })
    );
    // Still short of memory after the cooldown: next victim in order.
    let r = m.step(&Wake::Tick, ms(1400));
    assert_eq!(r.killed.as_deref(), Some("be-1"));
    f.gone(&be);
    m.step(&Wake::Tick, ms(1500));
    let r = m.step(&Wake::Tick, ms(2500));
    assert_eq!(r.killed.as_deref(), Some("b-under"));
    f.gone(&b_under);
    m.step(&Wake::Tick, ms(2600));
    // Guaranteed only once nothing else is left; never the critical pods.
    let r = m.step(&Wake::Tick, ms(3600));
    assert_eq!(r.killed.as_deref(), Some("g-1"));
    f.gone(&g);
    m.step(&Wake::Tick, ms(3700));
    let r = m.step(&Wake::Tick, ms(4700));
    assert!(r.killed.is_none());
    assert!(!killed(&sys) && !killed(&crit));
}

#[test]
fn pressure_stops_once_threshold_plus_min_reclaim_is_clear() {
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Systemd);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    assert_eq!(m.step(&Wake::Tick, ms(0)).killed.as_deref(), Some("b-over"));
    f.gone(&b_over);
    // 150Mi available: above 100Mi, below 100Mi + 64Mi min-reclaim.
    f.node_ws(TOTAL - 150 * MI);
    m.step(&Wake::Tick, ms(100));
    assert_eq!(
        m.step(&Wake::Tick, ms(1100)).killed.as_deref(),
        Some("be-1")
    );
    f.gone(&be);
    // 400Mi available: clear of hard + min-reclaim (164Mi) and of soft +
    // min-reclaim (364Mi): evictions stop, the pressure condition stays for
    // the transition period.
    f.node_ws(TOTAL - 400 * MI);
    m.step(&Wake::Tick, ms(1200));
    let r = m.step(&Wake::Tick, ms(2200));
    assert!(r.killed.is_none());
    let v = r.verdict.unwrap();
    assert_eq!(v.plan, PressurePlan::Calm);
    assert!(v.pressure);
    assert_eq!(r.next_check, ms(100));
}

#[test]
fn pressure_dry_run_writes_nothing() {
    let (f, reg, paths) = pressure_tree(Driver::Systemd);
    let cfg = MonitorConfig {
        dry_run: true,
        besteffort_memory_high_factor: 0.5,
        ..MonitorConfig::default()
    };
    let (mut m, ops) = monitor(&f, cfg, reg);
    let r = m.step(&psi_wake(), ms(0));
    assert_eq!(r.would_kill.as_deref(), Some("b-over"));
    assert!(r.killed.is_none());
    // Logs once per cooldown, not on every tick.
    assert!(m.step(&Wake::Tick, ms(100)).would_kill.is_none());
    assert_eq!(
        m.step(&Wake::Tick, ms(1000)).would_kill.as_deref(),
        Some("b-over")
    );
    // Soft band on a fresh monitor: would reclaim and lower memory.high.
    let cfg = MonitorConfig {
        dry_run: true,
        besteffort_memory_high_factor: 0.5,
        ..MonitorConfig::default()
    };
    let (mut m, _) = monitor(&f, cfg, Pods::default());
    f.node_ws(TOTAL - 250 * MI);
    let r = m.step(&Wake::Tick, ms(0));
    assert!(matches!(
        r.verdict.unwrap().plan,
        PressurePlan::Reclaim { .. }
    ));
    assert!(!r.reclaimed.is_empty());
    for p in &paths {
        assert!(!killed(p));
        assert_eq!(fs::read_to_string(p.join("memory.reclaim")).unwrap(), "");
        assert_eq!(fs::read_to_string(p.join("memory.high")).unwrap(), "max\n");
    }
    assert!(ops.opened.lock().unwrap().is_empty());
}

#[test]
fn pressure_soft_reclaims_lowers_besteffort_high_then_restores() {
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Cgroupfs);
    let cfg = MonitorConfig {
        besteffort_memory_high_factor: 0.5,
        ..MonitorConfig::default()
    };
    let (mut m, _) = monitor(&f, cfg, reg);
    f.node_ws(TOTAL - 250 * MI);
    let r = m.step(&Wake::Tick, ms(0));
    assert_eq!(
        r.verdict.unwrap().plan,
        PressurePlan::Reclaim { deficit: 114 * MI }
    );
    assert_eq!(r.reclaimed, vec!["b-over", "be-1", "b-under"]);
    assert_eq!(
        fs::read_to_string(b_over.join("memory.reclaim")).unwrap(),
        (38 * MI).to_string()
    );
    assert_eq!(
        fs::read_to_string(be.join("memory.high")).unwrap(),
        (150 * MI).to_string()
    );
    // Pressure clears; after the transition period memory.high comes back.
    f.node_ws(4 * GI);
    m.step(&Wake::Tick, ms(500));
    assert_eq!(
        fs::read_to_string(be.join("memory.high")).unwrap(),
        (150 * MI).to_string()
    );
    m.step(&Wake::Tick, ms(10_500));
    assert_eq!(fs::read_to_string(be.join("memory.high")).unwrap(), "max");
    assert_eq!(
        fs::read_to_string(be.join("memory.reclaim")).unwrap(),
        (38 * MI).to_string()
    );
}

/// Without swap only page cache can be reclaimed: a pod of anonymous memory
/// gets no memory.reclaim (the write would block the monitor in vain).
#[test]
fn pressure_reclaim_asks_only_for_what_can_be_reclaimed() {
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Cgroupfs);
    w(
        &be.join("memory.stat"),
        "anon 314572800
file 0
inactive_file 0
",
    );
    w(
        &b_over.join("memory.stat"),
        "anon 943718400
file 20971520
shmem 16777216
inactive_file 4194304
",
    );
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    f.node_ws(TOTAL - 250 * MI);
    let r = m.step(&Wake::Tick, ms(0));
    assert!(!r.reclaimed.contains(&"be-1".to_string()), "{r:?}");
    assert_eq!(fs::read_to_string(be.join("memory.reclaim")).unwrap(), "");
    // 20Mi of page cache of which 16Mi is shmem: 4Mi.
    assert_eq!(
        fs::read_to_string(b_over.join("memory.reclaim")).unwrap(),
        (4 * MI).to_string()
    );
    // With swap, anon counts too.
    let text = fs::read_to_string(f.meminfo()).unwrap();
    w(
        &f.meminfo(),
        &format!(
            "{text}SwapFree: 1048576 kB
"
        ),
    );
    m.step(&Wake::Tick, ms(2000));
    assert_eq!(
        fs::read_to_string(be.join("memory.reclaim")).unwrap(),
        (38 * MI).to_string()
    );
}

#[test]
fn pressure_hard_kill_reclaims_first_when_configured() {
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Cgroupfs);
    let cfg = MonitorConfig {
        reclaim_before_hard_kill: true,
        ..MonitorConfig::default()
    };
    let (mut m, _) = monitor(&f, cfg, reg);
    let r = m.step(&Wake::Tick, ms(0));
    // Reclaim went first, to the top three, then the recheck still failed.
    assert_eq!(r.reclaimed, vec!["b-over", "be-1", "b-under"]);
    assert_eq!(
        fs::read_to_string(be.join("memory.reclaim")).unwrap(),
        (38 * MI).to_string()
    );
    assert_eq!(r.killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
}

#[test]
fn pressure_kill_wait_sees_the_cgroup_empty() {
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Systemd);
    let ops = Arc::new(FakeOps::default());
    let cfg = MonitorConfig::default();
    let evictor = Evictor::new((&cfg).into(), ops).shared();
    let mut m = Monitor::new(cfg, paths(&f), Arc::new(reg), evictor);
    // The "kernel" empties the cgroup 30 ms after cgroup.kill is written.
    let events = b_over.join("cgroup.events");
    let watcher = std::thread::spawn(move || {
        let kill = events.with_file_name("cgroup.kill");
        while fs::read_to_string(&kill).unwrap_or_default() != "1" {
            std::thread::sleep(ms(1));
        }
        std::thread::sleep(ms(30));
        fs::write(&events, "populated 0\nfrozen 0\n").unwrap();
    });
    let r = m.step(&Wake::Tick, ms(0));
    watcher.join().unwrap();
    assert_eq!(r.killed.as_deref(), Some("b-over"));
    let took = r.emptied_after.expect("emptied within kill-wait");
    assert!(took >= ms(30) && took < ms(500), "{took:?}");
    // Not in flight any more: only the cooldown holds the next decision.
    assert!(matches!(
        m.step(&Wake::Tick, ms(100)).verdict.unwrap().plan,
        PressurePlan::Hold(Hold::Cooldown { .. })
    ));
}

#[test]
fn pressure_soft_evicts_after_grace() {
    let (f, reg, _) = pressure_tree(Driver::Systemd);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    f.node_ws(TOTAL - 250 * MI);
    for t in (0..2000).step_by(100) {
        assert!(m.step(&Wake::Tick, ms(t)).killed.is_none());
    }
    assert_eq!(
        m.step(&Wake::Tick, ms(2000)).killed.as_deref(),
        Some("b-over")
    );
}

#[test]
fn pressure_pause_only_pod_is_never_a_victim() {
    let f = Fake::new(Driver::Cgroupfs);
    let p = f.pod("empty", QosClass::BestEffort, 50 * MI, 0, "pause");
    f.node_ws(TOTAL - 50 * MI);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), Pods::default());
    let r = m.step(&Wake::Tick, ms(0));
    assert!(r.killed.is_none());
    assert!(!killed(&p));
}

#[test]
fn pressure_node_and_pod_numbers_and_sources() {
    let f = Fake::new(Driver::Systemd);
    let b = f.pod("b-1", QosClass::Burstable, 100 * MI, 64 * MI, "x");
    let g = f.pod("g-1", QosClass::Guaranteed, 100 * MI, 256 * MI, "y");
    let n = measure_node(&paths(&f)).unwrap();
    assert_eq!((n.available, n.source), (12 * GI, WS_ROOT_STAT));
    // Without the root memory.stat: MemTotal − MemFree − Inactive(file).
    fs::remove_file(f.cgroup_root.join("memory.stat")).unwrap();
    let n = measure_node(&paths(&f)).unwrap();
    assert_eq!((n.available, n.source), (12 * GI, WS_MEMINFO));
    assert_eq!(cgroup_working_set(&b).unwrap(), 100 * MI);
    assert_eq!(
        derive_request(&b, QosClass::Burstable),
        (64 * MI, RequestSource::CgroupChildrenMinLow)
    );
    w(&g.join("app/memory.min"), "0\n");
    assert_eq!(
        derive_request(&g, QosClass::Guaranteed),
        (256 * MI, RequestSource::CgroupPodMax)
    );
    w(&b.join("app/memory.min"), "0\n");
    assert_eq!(
        derive_request(&b, QosClass::Burstable),
        (0, RequestSource::Unknown)
    );
    w(&b.join("memory.low"), "4096\n");
    assert_eq!(
        derive_request(&b, QosClass::Burstable),
        (4096, RequestSource::CgroupPodMinLow)
    );
    // Junk in meminfo is an error naming the file, not a panic.
    w(&f.meminfo(), "MemTotal: lots kB\n");
    let e = measure_node(&paths(&f)).unwrap_err().to_string();
    assert!(e.contains("meminfo") && e.contains("line 1"), "{e}");
}

#[test]
fn pressure_registry_overrides_path_class_and_request() {
    let f = Fake::new(Driver::Systemd);
    f.pod("b-1", QosClass::Burstable, 100 * MI, 64 * MI, "x");
    let reg = Pods::default();
    reg.upsert(PodInfo {
        memory_request: Some(GI),
        request_source: RequestSource::Annotation,
        priority: Some(7),
        ..info("b-1", "team", None)
    });
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    let (_, cands, ranking) = m.snapshot().unwrap();
    assert_eq!(ranking.order.len(), 1);
    let c = &cands[0];
    assert_eq!(
        (c.request, c.request_source, c.priority),
        (GI, RequestSource::Annotation, Some(7))
    );
    assert_eq!(
        (c.class, c.class_source),
        (QosClass::Burstable, "cgroup-path")
    );
}

#[test]
fn pressure_drive_reacts_to_injected_wake() {
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Systemd);
    let (m, _) = monitor(&f, MonitorConfig::default(), reg);
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    tx.send(psi_wake()).unwrap();
    drop(tx);
    drive_with(m, rx, Arc::new(SystemClock::default())).unwrap();
    assert!(killed(&b_over));
}

#[test]
fn pressure_emptied_pod_is_not_killed_again() {
    // After cgroup.kill the pod cgroup stays (the kubelet removes it later)
    // and may still be charged for page cache: it must not be picked again.
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Systemd);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    assert_eq!(m.step(&Wake::Tick, ms(0)).killed.as_deref(), Some("b-over"));
    for c in ["pause", "app"] {
        w(&b_over.join(c).join("cgroup.procs"), "");
    }
    w(&b_over.join("cgroup.events"), "populated 0\nfrozen 0\n");
    m.step(&Wake::Tick, ms(100));
    assert_eq!(
        m.step(&Wake::Tick, ms(1100)).killed.as_deref(),
        Some("be-1")
    );
}

#[test]
fn pressure_allocatable_signal_from_kubepods_limit() {
    // Node has 12Gi free, but kubepods (memory.max = allocatable) is 50Mi
    // from its limit: the kubelet's allocatableMemory.available is met.
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Systemd);
    f.node_ws(4 * GI);
    w(&f.kp.join("memory.max"), &(8 * GI).to_string());
    w(
        &f.kp.join("memory.current"),
        &(8 * GI - 50 * MI + 20 * MI).to_string(),
    );
    w(
        &f.kp.join("memory.stat"),
        &format!("anon 1\ninactive_file {}\n", 20 * MI),
    );
    let n = measure(&paths(&f), Some(&f.kp), true).unwrap();
    assert_eq!(
        (n.available, n.allocatable_available),
        (12 * GI, Some(50 * MI))
    );
    assert_eq!(n.signal(), "allocatableMemory.available");
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    assert_eq!(m.step(&Wake::Tick, ms(0)).killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
    // Switched off, the same tree is calm.
    let cfg = MonitorConfig {
        allocatable_signal: false,
        ..MonitorConfig::default()
    };
    let (mut m, _) = monitor(&f, cfg, Pods::default());
    assert_eq!(
        m.step(&Wake::Tick, ms(0)).verdict.unwrap().plan,
        PressurePlan::Calm
    );
}

/// The kubelet's memory.available leaves kernel memory out; the kernel's
/// MemAvailable does not. When it is lower, it is the signal.
#[test]
fn pressure_mem_available_signal_counts_kernel_memory() {
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Cgroupfs);
    // 400Mi free by the kubelet's formula, but 200Mi of slab and page
    // tables leave the kernel 80Mi: below the hard threshold.
    f.node_ws(TOTAL - 400 * MI);
    let text = fs::read_to_string(f.meminfo()).unwrap();
    let text = text.replace(
        &format!("MemAvailable: {} kB", 400 * MI / 1024),
        &format!("MemAvailable: {} kB", 80 * MI / 1024),
    );
    w(&f.meminfo(), &text);
    let n = measure(&paths(&f), None, true).unwrap();
    assert_eq!((n.available, n.effective_available()), (400 * MI, 80 * MI));
    assert_eq!(n.signal(), "MemAvailable");
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    assert_eq!(m.step(&Wake::Tick, ms(0)).killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
    let cfg = MonitorConfig {
        mem_available_signal: false,
        ..MonitorConfig::default()
    };
    let (mut m, _) = monitor(&f, cfg, Pods::default());
    assert_ne!(
        m.step(&Wake::Tick, ms(0)).verdict.unwrap().plan,
        PressurePlan::Evict {
            reason: decide::Reason::Hard,
            deficit: 24 * MI
        }
    );
}

#[test]
fn pressure_pod_that_does_not_die_is_skipped_after_kill_timeout() {
    // A victim stuck in D state stays populated: after kill-timeout the
    // next pod in order gets its turn instead of re-killing the same one.
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Systemd);
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    assert_eq!(m.step(&Wake::Tick, ms(0)).killed.as_deref(), Some("b-over"));
    let r = m.step(&Wake::Tick, ms(5000));
    assert!(r.verdict.unwrap().kill_timed_out);
    let r = m.step(&Wake::Tick, ms(6000));
    assert_eq!(r.killed.as_deref(), Some("be-1"));
    assert!(killed(&b_over) && killed(&be));
}

#[test]
fn pressure_evictions_and_psi_reach_the_metrics() {
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Cgroupfs);
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let with = metrics.clone();
    let (m, _ops) = monitor_with(&f, MonitorConfig::default(), reg, |e| e.with_metrics(with));
    let mut m = m.with_metrics(metrics.clone());
    let r = m.step(&psi_wake(), ms(0));
    assert_eq!(r.killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
    let text = metrics.render();
    assert!(
        text.contains("nri_qos_evictions_total{class=\"Burstable\",reason=\"hard\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("nri_qos_pressure{resource=\"memory\",kind=\"some_avg10\"} 30"),
        "{text}"
    );
}

fn soft_with(api: Arc<FakeCluster>) -> (Fake, [PathBuf; 6], StepReport) {
    let (f, reg, pods) = pressure_tree(Driver::Systemd);
    reg.upsert(info("be-1", "default", None));
    let (mut m, _) = monitor_with(&f, MonitorConfig::default(), reg, |e| e.with_cluster(api));
    f.node_ws(TOTAL - 250 * MI);
    for t in (0..2000).step_by(100) {
        m.step(&Wake::Tick, ms(t));
    }
    let r = m.step(&Wake::Tick, ms(2000));
    (f, pods, r)
}

#[test]
fn pressure_soft_evicts_through_the_api_and_a_pdb_passes_the_turn() {
    let api = Arc::new(FakeCluster {
        refuse: vec!["b-over"],
        ..Default::default()
    });
    let (_f, [_, _, b_over, be, ..], r) = soft_with(api.clone());
    // b-over's budget refused; the next in kubelet order was evicted through
    // the API, and no cgroup was killed (the kubelet terminates it gracefully).
    assert_eq!(r.evicted.as_deref(), Some("be-1"));
    assert!(r.killed.is_none() && !killed(&b_over) && !killed(&be));
    assert_eq!(
        *api.asked.lock().unwrap(),
        [("b-over".to_string(), false), ("be-1".to_string(), false)]
    );
}

/// Nobody carries the Eviction out (no kubelet, or a slow one): after
/// kill-timeout the evicted pod's own cgroup is killed; the next pods in
/// line (a Guaranteed one among them) never pay for it.
#[test]
fn pressure_an_eviction_nobody_carries_out_ends_in_that_pods_kill() {
    let api = Arc::new(FakeCluster::default());
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Systemd);
    reg.upsert(info("be-1", "default", None));
    let with = api.clone();
    let (mut m, _) = monitor_with(&f, MonitorConfig::default(), reg, |e| e.with_cluster(with));
    f.node_ws(TOTAL - 250 * MI);
    let mut evicted = None;
    for t in (0..=2000).step_by(100) {
        evicted = evicted.or(m.step(&Wake::Tick, ms(t)).evicted);
    }
    assert_eq!(evicted.as_deref(), Some("b-over"));
    assert!(
        !killed(&b_over),
        "the Eviction is the kubelet's to carry out first"
    );
    let mut kills = Vec::new();
    for t in (2100..=8000).step_by(100) {
        kills.extend(m.step(&Wake::Tick, ms(t)).killed);
        if !kills.is_empty() {
            break;
        }
    }
    assert_eq!(kills, ["b-over"], "the evicted pod, not the next in line");
    assert!(killed(&b_over) && !killed(&be));
    assert_eq!(
        *api.asked.lock().unwrap(),
        [("b-over".to_string(), false)],
        "the Eviction exists already: not asked again"
    );
}

#[test]
fn pressure_soft_kills_when_the_api_does_not_answer() {
    let api = Arc::new(FakeCluster {
        unreachable: true,
        ..Default::default()
    });
    let (_f, [_, _, b_over, ..], r) = soft_with(api);
    assert_eq!(r.killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
}

#[test]
fn pressure_hard_kills_first_and_tells_the_api_after() {
    let (f, reg, [_, _, b_over, ..]) = pressure_tree(Driver::Cgroupfs);
    let api = Arc::new(FakeCluster {
        refuse: vec!["b-over"],
        ..Default::default()
    });
    let with = api.clone();
    let (mut m, _) = monitor_with(&f, MonitorConfig::default(), reg, |e| e.with_cluster(with));
    let r = m.step(&psi_wake(), ms(0));
    // A budget does not hold back the hard kill.
    assert_eq!(r.killed.as_deref(), Some("b-over"));
    assert!(killed(&b_over));
    assert_eq!(*api.asked.lock().unwrap(), [("b-over".to_string(), true)]);
}

#[test]
fn pressure_static_pods_are_never_victims() {
    let (f, reg, [_, _, b_over, be, ..]) = pressure_tree(Driver::Cgroupfs);
    reg.upsert(PodInfo {
        static_pod: true,
        ..info("b-over", "default", Some(0))
    });
    let (mut m, _) = monitor(&f, MonitorConfig::default(), reg);
    let r = m.step(&psi_wake(), ms(0));
    assert_eq!(r.killed.as_deref(), Some("be-1"));
    assert!(!killed(&b_over) && killed(&be));
}

mod registry_requests {
    use super::*;
    use crate::evict::rank::RankPolicy;
    use crate::node::registry::tests::registry;
    use proptest::prelude::*;

    proptest! {
        /// Pods alike in all but their containers' requests (any u64, huge
        /// ones included) rank by their true request: a larger one is never
        /// ahead of a smaller one because its sum overflowed.
        #[test]
        fn ranking_never_favours_a_wrapped_request(
            pods in prop::collection::vec(
                prop::collection::vec(prop_oneof![any::<u64>(), (u64::MAX - 8)..=u64::MAX, 0u64..(1 << 40)], 1..4),
                2..8,
            ),
            working_set in any::<u64>(),
        ) {
            let shared = Mutex::new(registry(&pods));
            let infos: Vec<PodInfo> = (0..pods.len())
                .map(|p| PodRegistry::get(&shared, &format!("uid-{p:04}")).unwrap())
                .collect();
            let true_sum = |uid: &str| -> u128 {
                let p: usize = uid.trim_start_matches("uid-").parse().unwrap();
                pods[p].iter().map(|r| *r as u128).sum()
            };
            for i in &infos {
                let want = true_sum(&i.uid).min(u64::MAX as u128) as u64;
                prop_assert_eq!(i.memory_request, Some(want));
            }
            let cands: Vec<Candidate> = infos
                .iter()
                .map(|i| Candidate {
                    uid: i.uid.clone(),
                    namespace: Some(i.namespace.clone()),
                    name: Some(i.name.clone()),
                    class: QosClass::Burstable,
                    class_source: "registry",
                    working_set,
                    request: i.memory_request.unwrap(),
                    request_source: i.request_source,
                    priority: i.priority,
                    pause_only: false,
                    static_pod: false,
                    path: Default::default(),
                })
                .collect();
            let policy = RankPolicy {
                critical_namespaces: vec![],
                critical_priority: i32::MAX,
                require_pod_info: false,
            };
            let order = rank::rank(&cands, &policy).order;
            for w in order.windows(2) {
                let (ahead, behind) = (&cands[w[0]], &cands[w[1]]);
                prop_assert!(
                    true_sum(&ahead.uid) <= true_sum(&behind.uid)
                        || ahead.request == behind.request,
                    "{} ranked ahead of {}", ahead.brief(), behind.brief()
                );
            }
        }
    }
}
