//! `cargo bench --bench nri_roundtrip`: the plugin binary (release build)
//! over a real unix socket, driven by the runtime-side test peer.
//!
//! Reports: Synchronize of 1,000 pods / 3,000 containers (time to answer),
//! CreateContainer round trip p50/p99/max over 10,000 calls with those
//! containers known, and the plugin's RSS after all that.

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

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sock = socket_in(&dir);
        let listener = UnixListener::bind(&sock).unwrap();
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
        println!(
            "plugin RSS: {:.1} MiB idle after connect, {:.1} MiB after sync + {n} creates",
            rss_idle as f64 / 1024.0,
            rss as f64 / 1024.0
        );
    });
}
