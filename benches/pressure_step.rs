//! `cargo bench --bench pressure_step`: how long the pressure monitor takes
//! from a wake-up to its kill decision, on a fake node past the hard
//! threshold with 110 pods (the kubelet's default maximum) and with 500.
//!
//! Dry run, so every step does the whole decision: measure the node, read
//! every pod cgroup, rank, skip sandbox-only pods, re-measure for the
//! recheck, and stop right before the `cgroup.kill` write. The tree is a
//! temp directory (page-cached files), not cgroupfs: the kernel's own cost
//! of reading `memory.stat` is left out here and measured on a real kernel
//! by `scripts/bench-pressure.sh` (wake-up -> kill issued).

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests, benches and tools cast small, known values; the cast lints guard
// the product code.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nri_qos::evict::kill::Syscalls;
use nri_qos::evict::Evictor;
use nri_qos::node::registry::NoPods;
use nri_qos::pressure::{Monitor, MonitorConfig, Paths, Wake};

const MI: u64 = 1 << 20;
const TOTAL: u64 = 16 << 30;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("paths here have a parent")).unwrap();
    fs::write(path, text).unwrap();
}

/// A systemd-driver node whose working set leaves 50 MiB available, with
/// `pods` pods of all three classes, each a pause and an app container.
fn fake_node(root: &Path, pods: usize) -> Paths {
    let paths = Paths {
        cgroup_root: root.join("cgroup"),
        proc_root: root.join("proc"),
    };
    let ws = TOTAL - 50 * MI;
    let free_kb = (TOTAL - ws) / 1024;
    write(
        &paths.meminfo(),
        &format!(
            "MemTotal: {} kB\nMemFree: {free_kb} kB\nMemAvailable: {free_kb} kB\nInactive(file): 0 kB\n",
            TOTAL / 1024
        ),
    );
    write(
        &paths.cgroup_root.join("memory.stat"),
        &format!("anon {ws}\nfile 0\ninactive_file 0\n"),
    );
    let psi = "some avg10=40.00 avg60=5.00 avg300=1.00 total=1\nfull avg10=20.00 avg60=2.00 avg300=0.50 total=1\n";
    write(&paths.node_psi(), psi);
    let kp = paths.cgroup_root.join("kubepods.slice");
    write(&kp.join("memory.pressure"), psi);
    let mut pid = 1000;
    for i in 0..pods {
        let uid = format!("0000{i:04}_aaaa_4aaa_8aaa_aaaaaaaaaaaa");
        let pod = match i % 3 {
            0 => kp.join(format!("kubepods-pod{uid}.slice")),
            1 => kp.join(format!(
                "kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
            )),
            _ => kp.join(format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice"
            )),
        };
        let usage = (40 + i as u64 % 200) * MI;
        let cache = 16 * MI;
        let request = if i % 3 == 2 { 0 } else { 64 * MI };
        write(&pod.join("memory.current"), &format!("{}\n", usage + cache));
        write(
            &pod.join("memory.stat"),
            &format!("anon {usage}\nfile {cache}\ninactive_file {cache}\n"),
        );
        write(&pod.join("memory.max"), "max\n");
        write(&pod.join("memory.min"), "0\n");
        write(&pod.join("memory.high"), "max\n");
        write(
            &pod.join("memory.events.local"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        );
        write(&pod.join("cgroup.events"), "populated 1\nfrozen 0\n");
        write(&pod.join("cgroup.procs"), "");
        for (ctr, comm, min) in [("pause", "pause", 0), ("app", "app", request)] {
            pid += 1;
            write(&pod.join(ctr).join("cgroup.procs"), &format!("{pid}\n"));
            write(&pod.join(ctr).join("memory.min"), &format!("{min}\n"));
            write(
                &paths.proc_root.join(pid.to_string()).join("comm"),
                &format!("{comm}\n"),
            );
        }
    }
    paths
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would too: one
    // quick pass is enough there.
    let quick = std::env::args().any(|a| a == "--test");
    let steps = if quick { 5 } else { 1000 };
    for pods in [110, 500] {
        let dir = tempfile::tempdir().unwrap();
        let paths = fake_node(dir.path(), pods);
        let cfg = MonitorConfig {
            dry_run: true,
            cooldown: "0s".parse().unwrap(),
            ..MonitorConfig::default()
        };
        let evictor = Evictor::new((&cfg).into(), Arc::new(Syscalls)).shared();
        let mut monitor = Monitor::new(cfg, paths, Arc::new(NoPods), evictor);
        let wake = Wake::Psi {
            source: "node:full 100000 1000000".into(),
        };
        let mut took = Vec::with_capacity(steps);
        for i in 0..steps {
            let started = Instant::now();
            let report = monitor.step(&wake, Duration::from_millis(i as u64 * 10));
            took.push(started.elapsed());
            assert!(
                report.would_kill.is_some(),
                "step {i} with {pods} pods decided no victim"
            );
        }
        took.sort();
        println!(
            "wake-up -> kill decision, {pods} pods (dry run, fake tree): p50 {:?}  p99 {:?}  max {:?}  ({steps} steps)",
            percentile(&took, 0.5),
            percentile(&took, 0.99),
            took[took.len() - 1],
        );
    }
}
