//! `cargo bench --bench metrics_starvation`: `/healthz` beside 1,000 idle
//! and 1,000 slow-loris connections (a request head one byte every 20 ms,
//! never finished), against our endpoint and, as the peer, a hyper 1.x
//! HTTP/1 server with its default header-read timeout. Each server runs in
//! its own child process so its RSS is its own: the figure is the growth of
//! the whole process (server plus the 2,000 client sockets) over the idle
//! baseline.

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

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const IDLE: usize = 1000;
const SLOW: usize = 1000;
const PROBES: usize = 200;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a stack struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

fn start_ours(rt: &tokio::runtime::Runtime) -> SocketAddr {
    let listener = rt
        .block_on(nri_qos::metrics::bind("127.0.0.1:0".parse().unwrap()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let m = Arc::new(nri_qos::metrics::Metrics::new());
    rt.spawn(async move {
        let _ = nri_qos::metrics::serve_on(listener, m).await;
    });
    addr
}

fn start_hyper(rt: &tokio::runtime::Runtime) -> SocketAddr {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"ok\n"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .keep_alive(false)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One server in this process: prints one result line.
fn run(which: &str) {
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = match which {
        "ours" => start_ours(&rt),
        _ => start_hyper(&rt),
    };
    let server = std::thread::spawn(move || rt.block_on(std::future::pending::<()>()));
    std::thread::sleep(Duration::from_millis(100));
    let before = rss_kib();
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let mut slow: Vec<TcpStream> = (0..SLOW)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let head = b"GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut lat = Vec::with_capacity(PROBES);
    let mut failed = 0;
    for i in 0..PROBES {
        for s in slow.iter_mut() {
            let _ = s.write_all(&[head[i % head.len()]]);
        }
        let t = Instant::now();
        match nri_qos::metrics::check_health(addr, Duration::from_secs(2)) {
            Ok(()) => lat.push(t.elapsed()),
            Err(_) => failed += 1,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let grown = rss_kib().saturating_sub(before);
    lat.sort();
    let (p50, p99, max) = if lat.is_empty() {
        (Duration::ZERO, Duration::ZERO, Duration::ZERO)
    } else {
        (
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[lat.len() - 1],
        )
    };
    println!(
        "{which:>5}: /healthz beside {IDLE} idle + {SLOW} slow-loris connections: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {failed}/{PROBES} failed; RSS +{:.1} MiB",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        grown as f64 / 1024.0
    );
    drop((idle, slow, server));
    std::process::exit(0);
}

fn main() {
    if let Some(which) = std::env::args().skip_while(|a| a != "--server").nth(1) {
        run(&which);
    }
    for which in ["ours", "hyper"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--server", which])
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
}
