//! `cargo bench --bench nri_hops`: where a CreateContainer round trip
//! spends its time.
//!
//! 1. Each step of the plugin's path in-process (decode the ttrpc request,
//!    decode the NRI request, the handler, encode the answer).
//! 2. Round trips over a real unix socket from a plain blocking peer (no
//!    ttrpc client, no async runtime: the peer adds as little as possible;
//!    `tests/common/lean_peer.rs`, the peer of `nri_roundtrip` too)
//!    to the plugin binary (release), interleaved with the same peer against
//!    a bare echo process, the two-process ping-pong floor. Ratios are
//!    plugin / floor of the same run.
//! 3. The plugin's CPU time (utime + stime) per 1,000 creates.
//!
//! `NRI_QOS_BIN=<path>` measures another build of the plugin (before/after).
//!
//! `NRI_HOPS_SOAK=<calls>` runs the soak instead: that many CreateContainer
//! calls, a Synchronize of 1,000 pods / 3,000 containers in four chunks
//! every 10,000 calls and a reconnect every 100,000, printing the plugin's
//! RSS at start, end and its maximum (sampled every 1,000 calls).

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
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use common::lean_peer::{read_frame, LeanPeer};
use common::{container, frame, pod, PluginProcess};
use nri_qos::nri::proto::api;
use nri_qos::nri::proto::api_ttrpc::Plugin;
use protobuf::Message;

const ROUNDS: usize = 6;
const CALLS_PER_ROUND: usize = 2_000;

fn create_request() -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: protobuf::MessageField::some(pod("p1", "/kubepods/burstable/podp1")),
        container: protobuf::MessageField::some(container(
            "new1",
            "p1",
            512,
            100_000,
            1 << 30,
            938,
        )),
        ..Default::default()
    }
}

/// The floor's far end: answers every frame with a frame of `reply` bytes.
fn echo_child(path: &str, reply: usize) {
    let mut s = UnixStream::connect(path).expect("echo connects");
    let out = frame(1, &vec![0u8; reply]);
    let mut buf = Vec::new();
    loop {
        let mut h = [0u8; 8];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        buf.resize(len, 0);
        if s.read_exact(&mut buf).is_err() || s.write_all(&out).is_err() {
            return;
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// utime + stime of a process, in clock ticks (100 Hz).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |p| p.1);
    let f: Vec<&str> = after.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// The bench's node: 1,000 pods, 3,000 containers, a third of each class.
fn node_sync() -> api::SynchronizeRequest {
    let classes = [
        "/kubepods/pod",
        "/kubepods/burstable/pod",
        "/kubepods/besteffort/pod",
    ];
    api::SynchronizeRequest {
        pods: (0..1000)
            .map(|i| pod(&format!("p{i}"), &format!("{}p{i}", classes[i % 3])))
            .collect(),
        containers: (0..3000)
            .map(|i| {
                let (shares, limit) = (256 + i as u64, (256 + i as i64) << 20);
                container(
                    &format!("c{i}"),
                    &format!("p{}", i % 1000),
                    shares,
                    50_000,
                    limit,
                    900,
                )
            })
            .collect(),
        ..Default::default()
    }
}

fn stage<T>(name: &str, n: u32, mut f: impl FnMut() -> T) {
    for _ in 0..n / 10 {
        std::hint::black_box(f());
    }
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(f());
    }
    println!(
        "  {name:<44} {:>7.2} us",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}

/// A temp cgroup root that says v2, the node `nri_roundtrip` gives the
/// plugin: the host's own tree may be v1 or hybrid, where the policy takes a
/// shorter path (no unified keys) and the split would undercount.
fn v2_cgroup_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
    root
}

fn in_process_stages() {
    let req = create_request();
    let payload = req.write_to_bytes().unwrap();
    let body = ttrpc::Request {
        service: "nri.pkg.api.v1alpha1.Plugin".into(),
        method: "CreateContainer".into(),
        payload: payload.clone(),
        timeout_nano: 2_000_000_000,
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let cgroup_root = v2_cgroup_root();
    let plugin = nri_qos::nri::QosPlugin::new(nri_qos::nri::PluginSettings {
        policy: Default::default(),
        node: nri_qos::node::read_node_facts(std::path::Path::new("/proc"), cgroup_root.path(), 0)
            .expect("node facts"),
        dry_run: false,
        adjust_existing: false,
        proc_root: "/proc".into(),
        // Only read (kubelet Memory QoS detection); an empty tree here.
        cgroup_root: cgroup_root.path().into(),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ctx = ttrpc::r#async::TtrpcContext::default();
    let resp = rt
        .block_on(plugin.create_container(&ctx, req.clone()))
        .unwrap();
    let answer = ttrpc::Response {
        payload: resp.write_to_bytes().unwrap(),
        ..Default::default()
    };
    println!(
        "in-process steps of one CreateContainer (request {} B, answer {} B):",
        body.len(),
        answer.compute_size()
    );
    let n = 50_000;
    stage("decode the ttrpc Request", n, || {
        ttrpc::Request::parse_from_bytes(&body).unwrap()
    });
    stage("decode the CreateContainerRequest", n, || {
        api::CreateContainerRequest::parse_from_bytes(&payload).unwrap()
    });
    stage("handler (policy + registry + adjustment)", n, || {
        rt.block_on(plugin.create_container(&ctx, req.clone()))
            .unwrap()
    });
    stage("encode the answer (response + ttrpc)", n, || {
        let p = resp.write_to_bytes().unwrap();
        ttrpc::Response {
            payload: p,
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap()
    });
    let sync = node_sync();
    let sync_bytes = sync.write_to_bytes().unwrap();
    println!(
        "in-process steps of a Synchronize of 1,000 pods / 3,000 containers ({} KiB):",
        sync_bytes.len() / 1024
    );
    stage("decode the SynchronizeRequest", 20, || {
        api::SynchronizeRequest::parse_from_bytes(&sync_bytes).unwrap()
    });
    stage(
        "clone the request (bench overhead of the next line)",
        20,
        || sync.clone(),
    );
    stage("handler (reassembly, policy, registry)", 20, || {
        rt.block_on(plugin.synchronize(&ctx, sync.clone())).unwrap()
    });
}

fn soak(calls: usize) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let connect = || {
        let mut peer = LeanPeer::accept(&listener);
        peer.handshake();
        peer
    };
    let mut ps = connect();
    let create = create_request().write_to_bytes().unwrap();
    let sync = node_sync();
    let chunks: Vec<Vec<u8>> = (0..4)
        .map(|k| {
            api::SynchronizeRequest {
                pods: if k == 0 {
                    sync.pods.clone()
                } else {
                    Vec::new()
                },
                containers: sync.containers[k * 750..(k + 1) * 750].to_vec(),
                more: k < 3,
                ..Default::default()
            }
            .write_to_bytes()
            .unwrap()
        })
        .collect();
    let rpc = |peer: &mut LeanPeer, method: &str, payload: &[u8]| {
        let frames = peer.request(method, payload);
        peer.round_trip(&frames);
    };
    for chunk in &chunks {
        rpc(&mut ps, "Synchronize", chunk);
    }
    let start = plugin.rss_kib();
    let mut max = start;
    let t = Instant::now();
    for i in 1..=calls {
        rpc(&mut ps, "CreateContainer", &create);
        if i % 10_000 == 0 {
            for chunk in &chunks {
                rpc(&mut ps, "Synchronize", chunk);
            }
        }
        if i % 100_000 == 0 {
            // Hang up first: the plugin dials again only once it sees EOF.
            drop(ps);
            ps = connect();
        }
        if i % 1_000 == 0 {
            max = max.max(plugin.rss_kib());
        }
    }
    let end = plugin.rss_kib();
    let hwm = plugin.status_value("VmHWM") as f64;
    println!(
        "soak: {calls} CreateContainer, {} chunked Synchronizes (1k pods / 3k containers, 4 chunks), {} reconnects in {:.1} s",
        calls / 10_000 + 1,
        calls / 100_000,
        t.elapsed().as_secs_f64()
    );
    println!(
        "  plugin RSS: start {:.1} MiB, end {:.1} MiB, max {:.1} MiB (sampled every 1,000 calls), peak {:.1} MiB (VmHWM)",
        start as f64 / 1024.0,
        end as f64 / 1024.0,
        max as f64 / 1024.0,
        hwm / 1024.0
    );
}

fn main() {
    if let Ok(path) = std::env::var("NRI_HOPS_ECHO") {
        let reply = std::env::var("NRI_HOPS_REPLY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256);
        return echo_child(&path, reply);
    }
    // The plugin processes (the soak's too) decide on the same v2 node,
    // keeper off (they only answer the runtime), as in `nri_roundtrip`.
    let fake_cgroup = v2_cgroup_root();
    std::env::set_var("NRI_QOS_NODE_CGROUP_ROOT", fake_cgroup.path());
    std::env::set_var("NRI_QOS_HIERARCHY_ENABLED", "false");
    if let Some(calls) = std::env::var("NRI_HOPS_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return soak(calls);
    }
    in_process_stages();

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let mut ps = LeanPeer::accept(&listener);
    ps.handshake();
    let payload = create_request().write_to_bytes().unwrap();
    let call = |peer: &mut LeanPeer| {
        let f = peer.request("CreateContainer", &payload);
        let t = Instant::now();
        let answer = peer.round_trip(&f).len();
        let took = t.elapsed();
        // The answer's frame: mux and ttrpc headers around the Response.
        let reply = ttrpc::Response {
            payload: vec![0; answer],
            ..Default::default()
        };
        (took, f.len(), 10 + reply.compute_size() as usize)
    };
    let mut reply_len = 0;
    for _ in 0..500 {
        reply_len = call(&mut ps).2;
    }

    let echo_sock = dir.path().join("echo.sock");
    let echo_listener = UnixListener::bind(&echo_sock).unwrap();
    let mut echo = std::process::Command::new(std::env::current_exe().unwrap())
        .env("NRI_HOPS_ECHO", &echo_sock)
        .env("NRI_HOPS_REPLY", reply_len.to_string())
        .spawn()
        .expect("echo child");
    let (mut es, _) = echo_listener.accept().unwrap();
    let req_frame = ps.request("CreateContainer", &payload);
    let mut buf = Vec::new();
    let mut ping = |s: &mut UnixStream| {
        let t = Instant::now();
        s.write_all(&req_frame).unwrap();
        read_frame(s, &mut buf);
        t.elapsed()
    };
    for _ in 0..500 {
        ping(&mut es);
    }

    let (mut floor, mut ours) = (Vec::new(), Vec::new());
    let pid = plugin.child.id();
    let mut ticks = 0;
    for _ in 0..ROUNDS {
        for _ in 0..CALLS_PER_ROUND {
            floor.push(ping(&mut es));
        }
        let t0 = cpu_ticks(pid);
        for _ in 0..CALLS_PER_ROUND {
            ours.push(call(&mut ps).0);
        }
        ticks += cpu_ticks(pid) - t0;
    }
    drop(es);
    let _ = echo.wait();
    floor.sort();
    ours.sort();
    let n = ROUNDS * CALLS_PER_ROUND;
    println!(
        "round trips, blocking peer, {ROUNDS} interleaved rounds of {CALLS_PER_ROUND} (request frame {} B, answer {reply_len} B):",
        req_frame.len()
    );
    for (name, v) in [
        ("two-process ping-pong floor", &floor),
        ("nri-qos CreateContainer", &ours),
    ] {
        println!(
            "  {name:<30} p50 {:>6.1} us  p99 {:>6.1} us  max {:>8.1} us",
            us(percentile(v, 0.5)),
            us(percentile(v, 0.99)),
            us(*v.last().unwrap())
        );
    }
    println!(
        "  ratio to the floor: p50 {:.2}x, p99 {:.2}x",
        us(percentile(&ours, 0.5)) / us(percentile(&floor, 0.5)),
        us(percentile(&ours, 0.99)) / us(percentile(&floor, 0.99))
    );
    println!(
        "  plugin CPU per 1,000 creates: {:.1} ms (utime+stime, 10 ms ticks over {n} calls)",
        ticks as f64 * 10.0 * 1000.0 / n as f64
    );
    println!(
        "  plugin RSS after: {:.1} MiB",
        plugin.rss_kib() as f64 / 1024.0
    );
}
