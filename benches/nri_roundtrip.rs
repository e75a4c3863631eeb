//! `cargo bench --bench nri_roundtrip`: the plugin binary (release build)
//! over a real unix socket, driven by the runtime-side test peer.
//!
//! Reports: Synchronize of 1,000 pods / 3,000 containers (time to answer),
//! CreateContainer round trip p50/p99/max over 10,000 calls with those
//! containers known, the plugin's own time in the handler (its
//! `nri_qos_hook_duration_seconds` histogram), and its RSS after all that.
//!
//! The round trip crosses two processes and four threads, so on a machine
//! with slow wake-ups it mostly measures the scheduler; the handler time is
//! what the plugin itself adds to a container creation.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use nri_qos::nri::proto::api;
use tokio::net::UnixListener;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// `(le, cumulative count)` of the plugin's hook histogram.
fn hook_histogram(port: u16) -> Option<Vec<(String, u64)>> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let buckets: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("nri_qos_hook_duration_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            Some((le.to_string(), count.trim().parse().ok()?))
        })
        .collect();
    (!buckets.is_empty()).then_some(buckets)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sock = socket_in(&dir);
        let listener = UnixListener::bind(&sock).unwrap();
        // The metrics endpoint (env layer) for the handler-time histogram.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        std::env::set_var("NRI_QOS_METRICS_ENABLED", "true");
        std::env::set_var("NRI_QOS_METRICS_ADDRESS", format!("127.0.0.1:{port}"));
        let plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
        let mut s = accept(&listener, true).await;
        s.handshake(true).await;
        let rss_idle = plugin.rss_kib();

        let classes = [
            "/kubepods/pod",
            "/kubepods/burstable/pod",
            "/kubepods/besteffort/pod",
        ];
        let pods: Vec<_> = (0..1000)
            .map(|i| pod(&format!("p{i}"), &format!("{}p{i}", classes[i % 3])))
            .collect();
        let ctrs: Vec<_> = (0..3000)
            .map(|i| {
                container(
                    &format!("c{i}"),
                    &format!("p{}", i % 1000),
                    256 + i as u64,
                    50_000,
                    (256 + i as i64) << 20,
                    900,
                )
            })
            .collect();
        let mut sync_times = Vec::new();
        for _ in 0..5 {
            let req = api::SynchronizeRequest {
                pods: pods.clone(),
                containers: ctrs.clone(),
                ..Default::default()
            };
            let t = Instant::now();
            let resp = s.plugin.synchronize(ctx(), &req).await.unwrap();
            sync_times.push(t.elapsed());
            std::hint::black_box(resp);
        }
        sync_times.sort();

        let reqs: Vec<_> = (0..100)
            .map(|i| api::CreateContainerRequest {
                pod: protobuf::MessageField::some(pods[i % 1000].clone()),
                container: protobuf::MessageField::some(container(
                    &format!("new{i}"),
                    &format!("p{}", i % 1000),
                    512,
                    100_000,
                    1 << 30,
                    938,
                )),
                ..Default::default()
            })
            .collect();
        // Warm up, then measure.
        for r in reqs.iter().take(50) {
            s.plugin.create_container(ctx(), r).await.unwrap();
        }
        let n = 10_000;
        let mut lat = Vec::with_capacity(n);
        let total = Instant::now();
        for i in 0..n {
            let t = Instant::now();
            let resp = s
                .plugin
                .create_container(ctx(), &reqs[i % reqs.len()])
                .await
                .unwrap();
            lat.push(t.elapsed());
            std::hint::black_box(resp);
        }
        let total = total.elapsed();
        lat.sort();
        let rss = plugin.rss_kib();

        println!(
            "nri-qos NRI round trip (release binary, unix socket, runtime-side peer in-process)"
        );
        println!(
            "synchronize 1000 pods / 3000 containers: best {:.2} ms, median {:.2} ms (5 runs)",
            sync_times[0].as_secs_f64() * 1e3,
            sync_times[2].as_secs_f64() * 1e3
        );
        println!(
            "create_container x{n}: p50 {:.1} us, p99 {:.1} us, max {:.1} us, {:.0} calls/s",
            percentile(&lat, 0.50).as_secs_f64() * 1e6,
            percentile(&lat, 0.99).as_secs_f64() * 1e6,
            lat.last().unwrap().as_secs_f64() * 1e6,
            n as f64 / total.as_secs_f64()
        );
        match hook_histogram(port) {
            Some(buckets) => {
                let total = buckets.last().map_or(0, |b| b.1).max(1) as f64;
                let share = |le: &str| {
                    buckets.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1 as f64 / total)
                };
                println!(
                    "CreateContainer handler inside the plugin ({} calls): {:.1} % within 10 us, {:.1} % within 25 us, {:.2} % within 100 us",
                    total,
                    100.0 * share("0.00001"),
                    100.0 * share("0.000025"),
                    100.0 * share("0.0001"),
                );
            }
            None => println!("CreateContainer handler time: metrics endpoint not reachable"),
        }
        println!(
            "plugin RSS: {:.1} MiB idle after connect, {:.1} MiB after sync + {n} creates",
            rss_idle as f64 / 1024.0,
            rss as f64 / 1024.0
        );
    });
}
