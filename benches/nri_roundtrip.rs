//! `cargo bench --bench nri_roundtrip`: nri-qos (the release binary) side by
//! side with a Go plugin on containerd/nri's own stub (`benches/go-stub`,
//! built by `benches/go-stub/build.sh`) and a bare two-process unix-socket
//! ping-pong as the floor, in interleaved rounds, all driven by the same
//! runtime-side peer over real unix sockets.
//!
//! Each round starts both plugins afresh, synchronizes 1,000 pods / 3,000
//! containers into each the way containerd does (one message if it fits in
//! ttrpc's 4 MiB, else chunks marked `more`; every mux frame the peer sends
//! carries at most 4 KiB, so Go's multiplexer accepts it), then makes 10,000
//! CreateContainer calls to each in blocks of 1,000, alternating plugin and
//! floor block by block so a noisy neighbour hits all three alike.
//!
//! The runtime-side peer (`tests/common/lean_peer.rs`) is as lean as the
//! floor's: one thread, blocking reads and writes on a std `UnixStream`, no
//! async runtime and no ttrpc client. It frames by hand what containerd
//! sends (mux frames of at most 4 KiB payload, ttrpc messages on them),
//! answers the plugin's RegisterPlugin (and UpdateContainers, or an
//! unimplemented status for anything else) on conn 2 whenever it comes,
//! and calls Configure, the Synchronize messages and the CreateContainer
//! blocks on conn 1. A CreateContainer is timed from the write of its
//! encoded frames to the read of the answer, as the floor times its
//! message, so the ratio to the floor is what the plugin's path costs over
//! the socket: a peer with an async runtime and a ttrpc client would add
//! its own wake-ups and task hops to every plugin's round trip but not to
//! the floor's.
//! Everything is read from outside the plugin: latency at the peer, CPU from
//! `/proc/<pid>/stat` (utime + stime, all threads; for the floor, its echo
//! process's, the least a receiving end costs), memory from
//! `/proc/<pid>/status` (VmRSS split into RssAnon and RssFile, VmHWM),
//! threads, stripped binary size.
//!
//! Environment: `NRI_BENCH_ROUNDS` (default 6), `NRI_GO_STUB` (the Go
//! binary; default `target/go-stub/go-stub`), `NRI_QOS_BIN` (another build
//! of nri-qos), `NRI_BENCH_SYNC_MSG_MAX` (bytes per Synchronize message
//! before chunking; containerd's is 4 MiB), `NRI_BENCH_HOOK_TIME=1` (also
//! print nri-qos's own handler-time histogram from its metrics endpoint,
//! which serves on the plugin's one thread: nri-qos only),
//! `NRI_BENCH_SMAPS_DIR` (save each plugin's `/proc/<pid>/smaps` there at
//! idle, after the Synchronize and after the creates),
//! `NRI_BENCH_CGROUP_TREE=empty` (no pod or container cgroups under the
//! plugin's cgroup root: every read of the Synchronize fails), `NRI_BENCH_PLACEMENT` (see [`Placement`]),
//! `NRI_BENCH_UNIFIED=shown` (the containers reported with the CRI's
//! unified map, as from containerd 2.2).
//!
//! The plugin's cgroup root is a temp dir that says v2 and holds what a node
//! shows: a cgroup per pod and per container (kubelet cgroupfs layout, from
//! the objects' `cgroup_parent` / `cgroups_path`) with the values nri-qos
//! answers a first Synchronize with, so the Synchronize pays the reads of
//! the owner rules as on a node.

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

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::lean_peer::LeanPeer;
use common::*;
use nri_qos::nri::proto::api;
use protobuf::Message;

const PODS: usize = 1000;
const CONTAINERS: usize = 3000;
const CREATES: usize = 10_000;
const BLOCK: usize = 1000;
const WARMUP: usize = 200;
/// ttrpc's largest message (`messageLengthMax`), which makes containerd
/// split a Synchronize.
const TTRPC_MESSAGE_MAX: usize = 4 << 20;
/// Set in the floor's echo child.
const FLOOR_ECHO_ENV: &str = "NRI_BENCH_FLOOR_ECHO";

fn main() {
    if std::env::var_os(FLOOR_ECHO_ENV).is_some() {
        floor_echo();
        return;
    }
    let rounds: usize = env_or("NRI_BENCH_ROUNDS", 6);
    let sync_msg_max: usize = env_or("NRI_BENCH_SYNC_MSG_MAX", TTRPC_MESSAGE_MAX);
    let hook_time = std::env::var("NRI_BENCH_HOOK_TIME").is_ok_and(|v| v == "1");
    let go_stub = go_stub_binary();
    let nri_qos_bin: PathBuf = std::env::var_os("NRI_QOS_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_nri-qos").into())
        .into();

    // nri-qos decides as on a cgroup v2 node (unified keys included): its
    // cgroup root is a temp dir that says v2. The hierarchy keeper is off, so
    // the plugin does what the Go stub does: answer the runtime, nothing else.
    let fake_cgroup = tempfile::tempdir().unwrap();
    std::fs::write(
        fake_cgroup.path().join("cgroup.controllers"),
        "cpu memory\n",
    )
    .unwrap();
    std::env::set_var("NRI_QOS_NODE_CGROUP_ROOT", fake_cgroup.path());
    std::env::set_var("NRI_QOS_HIERARCHY_ENABLED", "false");

    let placement = Placement::from_env();
    let workload = Workload::new();
    let sync_msgs = containerd_sync_messages(&workload.pods, &workload.containers, sync_msg_max);
    let empty_tree = std::env::var("NRI_BENCH_CGROUP_TREE").is_ok_and(|v| v == "empty");
    if !empty_tree {
        write_node_tree(fake_cgroup.path(), &workload, &sync_msgs, &nri_qos_bin);
    }
    assert_eq!(
        sync_msgs.iter().map(|m| m.pods.len()).sum::<usize>(),
        PODS,
        "every pod sent once"
    );
    assert_eq!(
        sync_msgs.iter().map(|m| m.containers.len()).sum::<usize>(),
        CONTAINERS,
        "every container sent once"
    );
    assert!(
        sync_msgs.iter().rev().skip(1).all(|m| m.more) && !sync_msgs.last().unwrap().more,
        "more on every chunk but the last"
    );
    println!(
        "NRI round trip: nri-qos vs {} vs a bare ping-pong, {rounds} interleaved rounds",
        if go_stub.is_ok() {
            "the Go stub"
        } else {
            "(no Go stub)"
        }
    );
    println!(
        "workload: Synchronize {PODS} pods / {CONTAINERS} containers ({} bytes, {} message(s)), then {CREATES} CreateContainer per plugin per round in blocks of {BLOCK}",
        workload.sync_bytes,
        sync_msgs.len()
    );
    if let Err(why) = &go_stub {
        println!("Go stub column missing: {why}");
    }

    println!(
        "cgroup tree: {}",
        if empty_tree {
            "empty (every read the Synchronize makes fails)"
        } else {
            "a pod and a container cgroup per object, holding what nri-qos wrote (NRI_BENCH_CGROUP_TREE=empty: none)"
        }
    );
    println!("placement: {}", placement.describe());
    let mut floor = placement.spawn(Floor::spawn);
    let mut results: Vec<SubjectRounds> = Vec::new();
    let mut floor_rounds = Vec::new();
    let mut floor_cpu = Vec::new();
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let mut plugins = Vec::new();
        if hook_time {
            enable_metrics_env();
        }
        plugins.push(placement.spawn(|| Plugin::start_nri_qos(&dir, &nri_qos_bin)));
        if let Ok(bin) = &go_stub {
            plugins.push(placement.spawn(|| Plugin::start_go_stub(&dir, bin)));
        }
        // Synchronize in alternating order across rounds.
        for i in 0..plugins.len() {
            let idx = (i + round) % plugins.len();
            plugins[idx].synchronize(&sync_msgs);
        }
        for p in &mut plugins {
            for i in 0..WARMUP {
                p.create(&workload.creates_encoded, i);
            }
            if round == 0 {
                // Show that both answer with an adjustment of the same shape.
                for i in 0..3 {
                    let resp: api::CreateContainerResponse =
                        p.peer.call_message("CreateContainer", &workload.creates[i]);
                    println!(
                        "{} adjusts: {}",
                        p.name,
                        protobuf::text_format::print_to_string(resp.adjust.get_or_default())
                    );
                }
            }
        }
        floor.warm_up(workload.floor_msg.len());

        let mut floor_lat = Vec::with_capacity(CREATES);
        let mut floor_ticks = 0;
        for block in 0..CREATES / BLOCK {
            // Subjects 0..plugins.len() are plugins, the last is the floor.
            let n = plugins.len() + 1;
            for k in 0..n {
                let subject = (k + block + round) % n;
                if subject == plugins.len() {
                    floor_ticks += floor.block(&workload.floor_msg, BLOCK, &mut floor_lat);
                } else {
                    let p = &mut plugins[subject];
                    p.block(&workload.creates_encoded, block * BLOCK, BLOCK);
                }
            }
        }
        floor_cpu.push(cpu_ms_per_1000(floor_ticks, floor_lat.len()));
        floor_lat.sort();
        floor_rounds.push(Latency::of(&floor_lat));

        print!("round {}:", round + 1);
        for p in &mut plugins {
            let r = p.finish();
            print!(" {} {}", p.name, r.brief());
            match results.iter_mut().find(|s| s.name == p.name) {
                Some(s) => s.rounds.push(r),
                None => results.push(SubjectRounds {
                    name: p.name,
                    binary: p.binary.clone(),
                    rounds: vec![r],
                }),
            }
        }
        let f = floor_rounds.last().unwrap();
        println!(
            " | floor p50 {:.1} us p99 {:.1} us echo cpu {:.1} ms/1k",
            us(f.p50),
            us(f.p99),
            floor_cpu.last().unwrap()
        );
        if hook_time && round + 1 == rounds {
            print_hook_time();
        }
    }
    print_table(&results, &floor_rounds, &floor_cpu, go_stub.as_ref().err());
}

/// Where the plugins and the floor's echo run relative to the peer
/// (`NRI_BENCH_PLACEMENT`). A blocking round trip between two processes
/// costs ~7 µs on one vCPU of this host and ~43 µs across two (the wake-up
/// of an idle vCPU), and the scheduler keeps a process where it first
/// landed: left free, a subject's p50 is one or the other by chance, round
/// by round, so the ratio to the floor compares placements as often as
/// paths. Pinned, every subject runs where the others do.
#[derive(Clone, Copy)]
enum Placement {
    /// `free` (the default): where the scheduler puts them.
    Free,
    /// `beside`: the peer and every subject on the peer's CPU.
    Beside { peer: usize },
    /// `across`: the peer on one CPU, every subject on another.
    Across { peer: usize, subject: usize },
}

impl Placement {
    /// From `NRI_BENCH_PLACEMENT`; pins the calling thread, the peer, when
    /// not free. The CPUs are the first two this process may use.
    fn from_env() -> Self {
        let wanted = std::env::var("NRI_BENCH_PLACEMENT").unwrap_or_default();
        let cpus = allowed_cpus();
        let placement = match (wanted.as_str(), cpus.as_slice()) {
            ("" | "free", _) => Placement::Free,
            ("beside", [peer, ..]) => Placement::Beside { peer: *peer },
            ("across", [peer, subject, ..]) => Placement::Across {
                peer: *peer,
                subject: *subject,
            },
            (other, _) => panic!(
                "NRI_BENCH_PLACEMENT={other}: want free, beside or across (across needs two CPUs; this process may use {cpus:?})"
            ),
        };
        if let Some(peer) = placement.peer() {
            pin_this_thread(peer);
        }
        placement
    }

    fn peer(self) -> Option<usize> {
        match self {
            Placement::Free => None,
            Placement::Beside { peer } | Placement::Across { peer, .. } => Some(peer),
        }
    }

    fn describe(self) -> String {
        match self {
            Placement::Free => "free (NRI_BENCH_PLACEMENT=beside|across pins)".into(),
            Placement::Beside { peer } => format!("beside: peer and subjects on CPU {peer}"),
            Placement::Across { peer, subject } => {
                format!("across: peer on CPU {peer}, subjects on CPU {subject}")
            }
        }
    }

    /// Runs `spawn` with the calling thread on the subjects' CPU, so that
    /// the process it starts (and every thread that process makes)
    /// inherits it, then puts the thread back on the peer's.
    fn spawn<T>(self, spawn: impl FnOnce() -> T) -> T {
        let Placement::Across { peer, subject } = self else {
            return spawn();
        };
        pin_this_thread(subject);
        let spawned = spawn();
        pin_this_thread(peer);
        spawned
    }
}

/// The CPUs the calling thread may run on, lowest first.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid cpu_set_t of `size` bytes.
    let rc = unsafe { libc::sched_getaffinity(0, size, &mut set) };
    assert_eq!(
        rc,
        0,
        "sched_getaffinity: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: CPU_ISSET reads the set within its size.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread (only it: pid 0) to `cpu`.
fn pin_this_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET checks `cpu` against the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid cpu_set_t of `size` bytes.
    let rc = unsafe { libc::sched_setaffinity(0, size, &set) };
    assert_eq!(
        rc,
        0,
        "pin to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The Go stub binary, or why it is not there.
fn go_stub_binary() -> Result<PathBuf, String> {
    let path: PathBuf = std::env::var_os("NRI_GO_STUB")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/go-stub/go-stub"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found; build it with benches/go-stub/build.sh (Debian's Go and containerd/nri 0.8.0, offline)",
            path.display()
        ))
    }
}

/// The node the plugin reads while it synchronizes: every pod's cgroup
/// and every container's below it (kubelet cgroupfs layout, as the pods'
/// `cgroup_parent` and the containers' `cgroups_path` say), holding what a
/// node shows once nri-qos adjusted the running containers: the unified
/// values it answers a first Synchronize with (on an empty tree), the
/// kernel's defaults elsewhere, memory.max the container's limit, and no
/// protection on the pod cgroups (the hierarchy keeper is off).
fn write_node_tree(
    root: &Path,
    workload: &Workload,
    sync_msgs: &[api::SynchronizeRequest],
    bin: &Path,
) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri-qos.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let process = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let mut plugin = Plugin::connect("nri-qos", bin, process, listener);
    let mut written: std::collections::HashMap<String, std::collections::HashMap<String, String>> =
        Default::default();
    for m in sync_msgs {
        let resp: api::SynchronizeResponse = plugin.peer.call_message("Synchronize", m);
        for u in resp.update {
            let unified = u
                .linux
                .into_option()
                .and_then(|l| l.resources.into_option());
            written.insert(
                u.container_id,
                unified.map(|r| r.unified).unwrap_or_default(),
            );
        }
    }
    drop(plugin);
    let write = |dir: &Path, files: &[(&str, String)]| {
        std::fs::create_dir_all(dir).unwrap();
        for (name, value) in files {
            std::fs::write(dir.join(name), format!("{value}\n")).unwrap();
        }
    };
    for p in &workload.pods {
        let parent = p.linux.cgroup_parent.trim_start_matches('/');
        write(
            &root.join(parent),
            &[("memory.min", "0".into()), ("memory.low", "0".into())],
        );
    }
    for c in &workload.containers {
        let linux = c.linux.get_or_default();
        let set = written.get(&c.id);
        let key = |k: &str, default: &str| {
            let v = set.and_then(|u| u.get(k)).map_or(default, String::as_str);
            v.to_string()
        };
        let limit = linux.resources.memory.limit.value;
        write(
            &root.join(linux.cgroups_path.trim_start_matches('/')),
            &[
                ("memory.min", key("memory.min", "0")),
                ("memory.low", key("memory.low", "0")),
                ("memory.high", key("memory.high", "max")),
                ("memory.max", limit.to_string()),
            ],
        );
    }
}

/// What the peer sends: the synchronized pods and containers, and the
/// CreateContainer requests cycled through (encoded once, as the floor's
/// message is built once).
struct Workload {
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    sync_bytes: usize,
    creates: Vec<api::CreateContainerRequest>,
    creates_encoded: Vec<Vec<u8>>,
    /// A CreateContainer request as it goes over the trunk (mux + ttrpc
    /// headers), the floor's message.
    floor_msg: Vec<u8>,
}

impl Workload {
    fn new() -> Self {
        let classes = [
            "/kubepods/pod",
            "/kubepods/burstable/pod",
            "/kubepods/besteffort/pod",
        ];
        // NRI_BENCH_SYNC_CONTENT=node: the synchronized containers carry
        // what a node's do (args, env, mounts, devices, namespaces, rlimits),
        // which nri-qos never reads; both plugins get the same request.
        let node_content = std::env::var("NRI_BENCH_SYNC_CONTENT").is_ok_and(|v| v == "node");
        // NRI_BENCH_UNIFIED=shown: each container reported as containerd 2.2
        // (NRI v0.10 on) reports it, with the CRI's unified map (the
        // kubelet's memory.oom.group); by default as 1.7 and 2.1, without.
        let shows_unified = std::env::var("NRI_BENCH_UNIFIED").is_ok_and(|v| v == "shown");
        let pods: Vec<_> = (0..PODS)
            .map(|i| pod(&format!("p{i}"), &format!("{}p{i}", classes[i % 3])))
            .collect();
        let containers: Vec<_> = (0..CONTAINERS)
            .map(|i| {
                let mut c = container(
                    &format!("c{i}"),
                    &format!("p{}", i % PODS),
                    256 + i as u64,
                    50_000,
                    (256 + i as i64) << 20,
                    900,
                );
                // Below its pod's cgroup, as the runtime puts it.
                let parent = &pods[i % PODS].linux.cgroup_parent;
                c.linux.mut_or_insert_default().cgroups_path = format!("{parent}/c{i}");
                if node_content {
                    add_node_content(&mut c, i);
                }
                if shows_unified {
                    let r = c
                        .linux
                        .mut_or_insert_default()
                        .resources
                        .mut_or_insert_default();
                    r.unified.insert("memory.oom.group".into(), "1".into());
                }
                c
            })
            .collect();
        let whole = api::SynchronizeRequest {
            pods: pods.clone(),
            containers: containers.clone(),
            ..Default::default()
        };
        let creates: Vec<_> = (0..100)
            .map(|i| api::CreateContainerRequest {
                pod: protobuf::MessageField::some(pods[i % PODS].clone()),
                container: protobuf::MessageField::some(container(
                    &format!("new{i}"),
                    &format!("p{}", i % PODS),
                    512,
                    100_000,
                    1 << 30,
                    938,
                )),
                ..Default::default()
            })
            .collect();
        let floor_msg = vec![0x5a; 8 + 10 + creates[0].compute_size() as usize];
        let creates_encoded = creates
            .iter()
            .map(|r| r.write_to_bytes().unwrap())
            .collect();
        Workload {
            creates_encoded,
            sync_bytes: whole.compute_size() as usize,
            pods,
            containers,
            creates,
            floor_msg,
        }
    }
}

/// What a container on a Kubernetes node carries beside the fields
/// nri-qos reads, in the sizes containerd 1.7 reports for a typical pod:
/// ~30 environment variables (the service links), 8 mounts, the default
/// device rules, 5 namespaces and an rlimit.
fn add_node_content(c: &mut api::Container, i: usize) {
    c.args = [
        "/usr/local/bin/app",
        "--config=/etc/app/config.yaml",
        "--port=8080",
    ]
    .map(String::from)
    .to_vec();
    c.env = (0..30)
        .map(|k| format!("SERVICE_{k}_PORT_8080_TCP_ADDR=10.96.{}.{}", k, i % 250))
        .collect();
    c.env
        .push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    let mounts = [
        ("/etc/hosts", "/var/lib/kubelet/pods/uid/etc-hosts"),
        (
            "/dev/termination-log",
            "/var/lib/kubelet/pods/uid/containers/app/0",
        ),
        ("/etc/hostname", "/var/lib/containerd/sandboxes/id/hostname"),
        (
            "/etc/resolv.conf",
            "/var/lib/containerd/sandboxes/id/resolv.conf",
        ),
        ("/dev/shm", "/run/containerd/sandboxes/id/shm"),
        (
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "/var/lib/kubelet/pods/uid/volumes/kube-api-access",
        ),
        ("/proc", "proc"),
        ("/sys", "sysfs"),
    ];
    c.mounts = mounts
        .iter()
        .map(|(dst, src)| api::Mount {
            destination: (*dst).into(),
            type_: "bind".into(),
            source: (*src).into(),
            options: ["rbind", "rprivate", "rw"].map(String::from).to_vec(),
            ..Default::default()
        })
        .collect();
    c.rlimits.push(api::POSIXRlimit {
        type_: "RLIMIT_NOFILE".into(),
        hard: 1_048_576,
        soft: 1_048_576,
        ..Default::default()
    });
    let linux = c.linux.mut_or_insert_default();
    for ns in ["pid", "ipc", "uts", "mount", "network"] {
        linux.namespaces.push(api::LinuxNamespace {
            type_: ns.into(),
            path: format!("/proc/{}/ns/{ns}", 1000 + i),
            ..Default::default()
        });
    }
    let resources = linux.resources.mut_or_insert_default();
    resources.devices.push(api::LinuxDeviceCgroup {
        allow: false,
        access: "rwm".into(),
        ..Default::default()
    });
    for (major, minor) in [
        (1, 3),
        (1, 5),
        (1, 7),
        (1, 8),
        (1, 9),
        (5, 0),
        (5, 2),
        (136, -1),
    ] {
        resources.devices.push(api::LinuxDeviceCgroup {
            allow: true,
            type_: "c".into(),
            major: protobuf::MessageField::some(api::OptionalInt64 {
                value: major,
                ..Default::default()
            }),
            minor: protobuf::MessageField::some(api::OptionalInt64 {
                value: minor,
                ..Default::default()
            }),
            access: "rwm".into(),
            ..Default::default()
        });
    }
}

/// The Synchronize messages containerd (NRI v0.7+) sends: everything in one
/// message with `more = false` if it fits; otherwise the objects per message
/// shrink by max/len (at most 0.9) until a message fits, and each message but
/// the last carries `more = true` (`pkg/adaptation/plugin.go: synchronize,
/// recalcObjsPerSyncMsg`). containerd learns the size from ttrpc's oversized
/// error; the peer computes it up front, which sends the same messages.
fn containerd_sync_messages(
    pods: &[api::PodSandbox],
    ctrs: &[api::Container],
    max_len: usize,
) -> Vec<api::SynchronizeRequest> {
    const MIN_OBJS_PER_MSG: usize = 8;
    let (mut pods_left, mut ctrs_left) = (pods, ctrs);
    let (mut pods_per, mut ctrs_per) = (pods.len(), ctrs.len());
    let mut msgs = Vec::new();
    loop {
        let req = api::SynchronizeRequest {
            pods: pods_left[..pods_per].to_vec(),
            containers: ctrs_left[..ctrs_per].to_vec(),
            more: pods_left.len() > pods_per || ctrs_left.len() > ctrs_per,
            ..Default::default()
        };
        let len = req.compute_size() as usize;
        if len > max_len {
            assert!(
                pods_per + ctrs_per > MIN_OBJS_PER_MSG,
                "cannot split the sync below {max_len} bytes"
            );
            let factor = (max_len as f64 / len as f64).min(0.9);
            pods_per = (pods_per as f64 * factor) as usize;
            ctrs_per = (ctrs_per as f64 * factor) as usize;
            continue;
        }
        let more = req.more;
        msgs.push(req);
        if !more {
            return msgs;
        }
        pods_left = &pods_left[pods_per..];
        ctrs_left = &ctrs_left[ctrs_per..];
        pods_per = pods_per.min(pods_left.len());
        ctrs_per = ctrs_per.min(ctrs_left.len());
    }
}

/// A plugin process with the peer's session to it, and what a round measured.
struct Plugin {
    name: &'static str,
    binary: PathBuf,
    process: PluginProcess,
    peer: LeanPeer,
    _listener: UnixListener,
    rss_idle_kib: u64,
    sync_time: Duration,
    hwm_after_sync_kib: u64,
    cpu_ticks: u64,
    latencies: Vec<Duration>,
}

/// `/proc/<pid>/smaps` copied to `$NRI_BENCH_SMAPS_DIR/<plugin>-<when>.smaps`
/// when that variable is set: which mappings the RSS is made of.
fn save_smaps(name: &str, pid: u32, when: &str) {
    let Some(dir) = std::env::var_os("NRI_BENCH_SMAPS_DIR") else {
        return;
    };
    let file = format!("{}-{when}.smaps", name.replace(' ', "-"));
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) {
        let _ = std::fs::write(Path::new(&dir).join(file), text);
    }
}

impl Plugin {
    fn start_nri_qos(dir: &tempfile::TempDir, bin: &Path) -> Self {
        let sock = dir.path().join("nri-qos.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let process = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
        Self::connect("nri-qos", bin, process, listener)
    }

    fn start_go_stub(dir: &tempfile::TempDir, bin: &Path) -> Self {
        let sock = dir.path().join("go-stub.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let process = PluginProcess::spawn(
            bin,
            &["-socket".as_ref(), sock.as_os_str()],
            &dir.path().join("go-stub.log"),
        );
        Self::connect("Go stub", bin, process, listener)
    }

    fn connect(
        name: &'static str,
        binary: &Path,
        process: PluginProcess,
        listener: UnixListener,
    ) -> Self {
        let mut peer = LeanPeer::accept(&listener);
        peer.handshake();
        let rss_idle_kib = process.rss_kib();
        save_smaps(name, process.child.id(), "idle");
        Plugin {
            name,
            binary: binary.to_path_buf(),
            process,
            peer,
            _listener: listener,
            rss_idle_kib,
            sync_time: Duration::ZERO,
            hwm_after_sync_kib: 0,
            cpu_ticks: 0,
            latencies: Vec::with_capacity(CREATES),
        }
    }

    fn synchronize(&mut self, msgs: &[api::SynchronizeRequest]) {
        let t = Instant::now();
        for m in msgs {
            let resp: api::SynchronizeResponse = self.peer.call_message("Synchronize", m);
            assert_eq!(resp.more, m.more, "{}: split sync not handled", self.name);
            std::hint::black_box(resp);
        }
        self.sync_time = t.elapsed();
        self.hwm_after_sync_kib = self.process.status_value("VmHWM");
        save_smaps(self.name, self.process.child.id(), "synced");
    }

    /// One CreateContainer of the encoded requests (the `i`th, cycled);
    /// returns the round trip: from writing the request's frames, built
    /// before, to the answer read, as the floor times its message.
    fn create(&mut self, encoded: &[Vec<u8>], i: usize) -> Duration {
        let frames = self
            .peer
            .request("CreateContainer", &encoded[i % encoded.len()]);
        let t = Instant::now();
        let answer = self.peer.round_trip(&frames);
        let took = t.elapsed();
        std::hint::black_box(answer);
        took
    }

    fn block(&mut self, encoded: &[Vec<u8>], first: usize, n: usize) {
        let pid = self.process.child.id();
        let cpu = cpu_ticks(pid);
        for i in first..first + n {
            let took = self.create(encoded, i);
            self.latencies.push(took);
        }
        self.cpu_ticks += cpu_ticks(pid) - cpu;
    }

    fn finish(&mut self) -> RoundResult {
        assert!(self.process.is_running(), "{} exited", self.name);
        save_smaps(self.name, self.process.child.id(), "after");
        self.latencies.sort();
        RoundResult {
            latency: Latency::of(&self.latencies),
            cpu_ms_per_1000: cpu_ms_per_1000(self.cpu_ticks, self.latencies.len()),
            rss_idle_kib: self.rss_idle_kib,
            rss_after_kib: self.process.rss_kib(),
            anon_after_kib: self.process.status_value("RssAnon"),
            file_after_kib: self.process.status_value("RssFile"),
            hwm_after_sync_kib: self.hwm_after_sync_kib,
            sync_time: self.sync_time,
            threads: self.process.status_value("Threads"),
        }
    }
}

#[derive(Clone, Copy)]
struct Latency {
    p50: Duration,
    p99: Duration,
}

impl Latency {
    fn of(sorted: &[Duration]) -> Self {
        let at = |p: f64| sorted[((sorted.len() as f64 - 1.0) * p).round() as usize];
        Latency {
            p50: at(0.50),
            p99: at(0.99),
        }
    }
}

struct RoundResult {
    latency: Latency,
    cpu_ms_per_1000: f64,
    rss_idle_kib: u64,
    rss_after_kib: u64,
    /// The two parts of `rss_after_kib`: heap and stacks (RssAnon), and
    /// mapped files, mostly the binary and libc (RssFile, clean page cache
    /// the kernel can reclaim; shared memory is none here).
    anon_after_kib: u64,
    file_after_kib: u64,
    hwm_after_sync_kib: u64,
    sync_time: Duration,
    threads: u64,
}

impl RoundResult {
    fn brief(&self) -> String {
        format!(
            "p50 {:.1} us p99 {:.1} us cpu {:.1} ms/1k sync {:.1} ms rss {:.1}/{:.1} MiB (anon {:.1} file {:.1}) hwm {:.1} MiB |",
            us(self.latency.p50),
            us(self.latency.p99),
            self.cpu_ms_per_1000,
            ms(self.sync_time),
            mib(self.rss_idle_kib),
            mib(self.rss_after_kib),
            mib(self.anon_after_kib),
            mib(self.file_after_kib),
            mib(self.hwm_after_sync_kib)
        )
    }
}

struct SubjectRounds {
    name: &'static str,
    binary: PathBuf,
    rounds: Vec<RoundResult>,
}

impl SubjectRounds {
    fn stat(&self, f: impl Fn(&RoundResult) -> f64) -> Stat {
        Stat::of(self.rounds.iter().map(f).collect())
    }
}

/// Median and range over rounds.
struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let median = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        Stat {
            median,
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    fn show(&self, unit: &str) -> String {
        format!(
            "{:.1} {unit} ({:.1}-{:.1})",
            self.median, self.min, self.max
        )
    }
}

fn print_table(
    results: &[SubjectRounds],
    floor: &[Latency],
    floor_cpu: &[f64],
    go_missing: Option<&String>,
) {
    let floor_p50 = Stat::of(floor.iter().map(|l| us(l.p50)).collect());
    let floor_p99 = Stat::of(floor.iter().map(|l| us(l.p99)).collect());
    let qos = results.iter().find(|s| s.name == "nri-qos").unwrap();
    let go = results.iter().find(|s| s.name == "Go stub");
    let rounds = qos.rounds.len();
    let cell = |s: Option<&SubjectRounds>, f: &dyn Fn(&SubjectRounds) -> String| {
        s.map_or_else(|| "—".to_string(), f)
    };
    println!();
    println!("median over {rounds} rounds (range); ratios of medians");
    println!(
        "| | nri-qos | Go stub | bare unix-socket ping-pong, 2 processes | Go stub ÷ nri-qos | nri-qos ÷ floor |"
    );
    println!("|---|---|---|---|---|---|");

    let p50 = |s: &SubjectRounds| s.stat(|r| us(r.latency.p50));
    let p99 = |s: &SubjectRounds| s.stat(|r| us(r.latency.p99));
    for (what, stat, floor_stat) in [
        (
            "CreateContainer round trip p50",
            &p50 as &dyn Fn(&SubjectRounds) -> Stat,
            &floor_p50,
        ),
        ("p99", &p99, &floor_p99),
    ] {
        println!(
            "| {what} | {} | {} | {} | {} | {} |",
            stat(qos).show("µs"),
            cell(go, &|g| stat(g).show("µs")),
            floor_stat.show("µs"),
            cell(go, &|g| ratio(stat(g).median, stat(qos).median)),
            ratio(stat(qos).median, floor_stat.median),
        );
    }
    // On a shared host most rounds' p99 is a neighbour's preemption; the
    // quietest round shows what the path itself does.
    let best = |st: &Stat| format!("{:.1} µs", st.min);
    println!(
        "| p99, quietest round | {} | {} | {} | {} | {} |",
        best(&p99(qos)),
        cell(go, &|g| best(&p99(g))),
        best(&floor_p99),
        cell(go, &|g| ratio(p99(g).min, p99(qos).min)),
        ratio(p99(qos).min, floor_p99.min),
    );
    // The floor's column: the echo process's CPU per 1,000 messages, what
    // the receiving end of a bare ping-pong costs (10 ms clock ticks).
    let cpu = |s: &SubjectRounds| s.stat(|r| r.cpu_ms_per_1000);
    let floor_cpu = Stat::of(floor_cpu.to_vec());
    println!(
        "| CPU per 1,000 creates (floor: its echo process) | {} | {} | {} | {} | {} |",
        cpu(qos).show("ms"),
        cell(go, &|g| cpu(g).show("ms")),
        floor_cpu.show("ms"),
        cell(go, &|g| ratio(cpu(g).median, cpu(qos).median)),
        ratio(cpu(qos).median, floor_cpu.median),
    );
    mib_pair_row(
        &format!("RSS idle / after sync + {}k creates", CREATES / 1000),
        qos,
        go,
        |r| r.rss_idle_kib,
        |r| r.rss_after_kib,
    );
    mib_pair_row(
        "of which anonymous / file-backed (RssAnon / RssFile)",
        qos,
        go,
        |r| r.anon_after_kib,
        |r| r.file_after_kib,
    );
    let hwm = |s: &SubjectRounds| s.stat(|r| mib(r.hwm_after_sync_kib));
    println!(
        "| peak RSS (VmHWM after the sync) | {} | {} | — | {} | — |",
        hwm(qos).show("MiB"),
        cell(go, &|g| hwm(g).show("MiB")),
        cell(go, &|g| ratio(hwm(g).median, hwm(qos).median)),
    );
    let sync = |s: &SubjectRounds| s.stat(|r| ms(r.sync_time));
    println!(
        "| Synchronize {}k pods / {}k containers | {} | {} (its handler only records ids) | — | {} | — |",
        PODS / 1000,
        CONTAINERS / 1000,
        sync(qos).show("ms"),
        cell(go, &|g| sync(g).show("ms")),
        cell(go, &|g| ratio(sync(g).median, sync(qos).median)),
    );
    let threads = |s: &SubjectRounds| s.rounds.iter().map(|r| r.threads).max().unwrap_or(0);
    println!(
        "| threads / stripped binary | {} / {} | {} | — | — | — |",
        threads(qos),
        stripped_size(&qos.binary),
        cell(go, &|g| format!(
            "{} / {}",
            threads(g),
            stripped_size(&g.binary)
        )),
    );
    if let Some(why) = go_missing {
        println!("Go stub column missing: {why}");
    }
}

/// A table row of two memory figures ("a / b", MiB) per plugin and the Go
/// stub's ratios to nri-qos; the Go cells are empty without the Go stub.
fn mib_pair_row(
    label: &str,
    qos: &SubjectRounds,
    go: Option<&SubjectRounds>,
    a: impl Fn(&RoundResult) -> u64,
    b: impl Fn(&RoundResult) -> u64,
) {
    let a = |s: &SubjectRounds| s.stat(|r| mib(a(r)));
    let b = |s: &SubjectRounds| s.stat(|r| mib(b(r)));
    let both = |s: &SubjectRounds| format!("{} / {}", a(s).show("MiB"), b(s).show("MiB"));
    let (go_cell, ratios) = match go {
        Some(g) => (
            both(g),
            format!(
                "{} / {}",
                ratio(a(g).median, a(qos).median),
                ratio(b(g).median, b(qos).median)
            ),
        ),
        None => ("—".to_string(), "—".to_string()),
    };
    println!("| {label} | {} | {go_cell} | — | {ratios} | — |", both(qos));
}

fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}×", a / b)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn cpu_ms_per_1000(ticks: u64, calls: usize) -> f64 {
    ticks as f64 * 1000.0 / clock_ticks_per_second() / (calls as f64 / 1000.0)
}

/// utime + stime of the whole process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name's closing parenthesis start at field 3;
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

fn clock_ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

/// Size after `strip`, as a deployed binary would be.
fn stripped_size(bin: &Path) -> String {
    let out = std::env::temp_dir().join(format!("nri-bench-strip-{}", std::process::id()));
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(bin)
        .status()
        .is_ok_and(|s| s.success());
    let (path, note) = if stripped {
        (out.as_path(), "")
    } else {
        (bin, " (not stripped: no strip)")
    };
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let _ = std::fs::remove_file(&out);
    format!("{:.1} MiB{note}", size as f64 / (1024.0 * 1024.0))
}

/// The floor: the bench and a child process bounce a message the size of a
/// CreateContainer request over a unix socket pair, blocking I/O both sides.
struct Floor {
    child: std::process::Child,
    sock: StdUnixStream,
    buf: Vec<u8>,
}

impl Floor {
    fn spawn() -> Self {
        let (ours, theirs) = StdUnixStream::pair().unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .env(FLOOR_ECHO_ENV, "1")
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the floor's echo process");
        Floor {
            child,
            sock: ours,
            buf: vec![0; 64 * 1024],
        }
    }

    fn ping(&mut self, msg: &[u8]) {
        self.sock.write_all(msg).unwrap();
        let mut got = 0;
        while got < msg.len() {
            match self.sock.read(&mut self.buf[got..]).unwrap() {
                0 => panic!("floor echo process exited"),
                n => got += n,
            }
        }
    }

    fn warm_up(&mut self, len: usize) {
        let msg = vec![0; len];
        for _ in 0..WARMUP {
            self.ping(&msg);
        }
    }

    /// Returns the echo process's CPU clock ticks over the block.
    fn block(&mut self, msg: &[u8], n: usize, lat: &mut Vec<Duration>) -> u64 {
        let cpu = cpu_ticks(self.child.id());
        for _ in 0..n {
            let t = Instant::now();
            self.ping(msg);
            lat.push(t.elapsed());
        }
        cpu_ticks(self.child.id()) - cpu
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor's child: echo whatever arrives on the socket in stdin.
fn floor_echo() {
    let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let mut sock = StdUnixStream::from(fd);
    let mut buf = vec![0; 64 * 1024];
    loop {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if sock.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

fn enable_metrics_env() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    std::env::set_var("NRI_QOS_METRICS_ENABLED", "true");
    std::env::set_var("NRI_QOS_METRICS_ADDRESS", format!("127.0.0.1:{port}"));
    std::env::set_var("NRI_BENCH_METRICS_PORT", port.to_string());
}

/// nri-qos only: its own CreateContainer handler time, from its metrics.
fn print_hook_time() {
    let port: u16 = env_or("NRI_BENCH_METRICS_PORT", 0);
    let text = (|| {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        conn.read_to_string(&mut text).ok()?;
        Some(text)
    })()
    .unwrap_or_default();
    let buckets: Vec<(String, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("nri_qos_hook_duration_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            Some((le.to_string(), count.trim().parse().ok()?))
        })
        .collect();
    let Some(total) = buckets.last().map(|b| b.1.max(1.0)) else {
        println!("nri-qos handler time: metrics endpoint not reachable");
        return;
    };
    let share = |le: &str| 100.0 * buckets.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1) / total;
    println!(
        "nri-qos handler time, inside the plugin ({total} calls, last round): {:.1} % within 10 us, {:.1} % within 25 us, {:.2} % within 100 us",
        share("0.00001"),
        share("0.000025"),
        share("0.0001")
    );
}
