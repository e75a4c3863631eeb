//! memhog: allocate and touch N MiB at a given rate, then sleep. Used by
//! tests/e2e/pressure/ to create memory pressure inside a VM.
//!
//! Usage: memhog <MiB> [rate MiB/s, may be fractional; 0 = as fast as possible] [hold seconds]
//! Prints one line per 16 MiB: `memhog <epoch_ms> <MiB touched>`, so a
//! harness can line the ramp up with the monitor's log.
//!
//! `memhog --watch <kB> [<kB> ...]`: an independent observer instead. Polls
//! MemAvailable every 10 ms and prints `watch <epoch_ms> below <kB>` the
//! first time it drops under each level, so a harness knows when the node
//! really crossed a threshold, whatever the monitor saw; exits when all are
//! crossed.
//! `memhog --churn <MiB> [seconds]`: like a garbage-collected runtime, keep
//! <MiB> of anonymous memory and keep replacing it 1 MiB at a time (free the
//! oldest chunk, allocate and touch a new one), printing
//! `churn <epoch_ms> <MiB/s>` once a second: a container throttled at its
//! memory.high shows it as a drop in MiB/s. Runs for [seconds] (0 = forever).
//! Build static-ish: `cargo build --release --example memhog`
//! (`RUSTFLAGS='-C target-feature=+crt-static' --target x86_64-unknown-linux-gnu`
//! for a fully static binary).
// Tests, benches and tools cast small, known values; the cast lints guard
// the product code.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn arg<T: std::str::FromStr>(n: usize, default: T) -> T {
    match std::env::args().nth(n) {
        Some(s) => s.parse().unwrap_or_else(|_| {
            eprintln!("usage: memhog <MiB> [rate MiB/s] [hold s]; bad argument {s:?}");
            std::process::exit(2)
        }),
        None => default,
    }
}

/// `--watch`: see the module docs.
fn watch(levels_kb: &[u64]) -> ! {
    use std::os::unix::fs::FileExt;
    let meminfo = std::fs::File::open("/proc/meminfo").unwrap_or_else(|e| {
        eprintln!("memhog --watch: /proc/meminfo: {e}");
        std::process::exit(1)
    });
    let mut pending: Vec<u64> = levels_kb.to_vec();
    let mut buf = vec![0u8; 8192];
    while !pending.is_empty() {
        let n = meminfo.read_at(&mut buf, 0).unwrap_or(0);
        let available = std::str::from_utf8(&buf[..n]).ok().and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("MemAvailable:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        });
        if let Some(kb) = available {
            let now = epoch_ms();
            pending.retain(|&level| {
                let crossed = kb < level;
                if crossed {
                    println!("watch {now} below {level} available {kb}");
                }
                !crossed
            });
            let _ = std::io::stdout().flush();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::process::exit(0)
}

/// Allocates 1 MiB and touches every page, so the memory is really charged.
fn touched_chunk(tag: usize) -> Vec<u8> {
    let mut chunk = vec![0u8; MIB];
    for p in (0..MIB).step_by(PAGE) {
        chunk[p] = (tag as u8) | 1;
    }
    std::hint::black_box(&mut chunk);
    chunk
}

/// `--churn`: see the module docs.
fn churn(total: usize, seconds: u64) -> ! {
    let mut chunks: std::collections::VecDeque<Vec<u8>> = (0..total).map(touched_chunk).collect();
    println!(
        "churn {} holding {total}MiB pid={}",
        epoch_ms(),
        std::process::id()
    );
    let start = Instant::now();
    let (mut mark, mut replaced) = (Instant::now(), 0u64);
    let mut i = total;
    loop {
        chunks.pop_front();
        chunks.push_back(touched_chunk(i));
        i += 1;
        replaced += 1;
        let elapsed = mark.elapsed();
        if elapsed >= Duration::from_secs(1) {
            println!(
                "churn {} {:.1}",
                epoch_ms(),
                replaced as f64 / elapsed.as_secs_f64()
            );
            let _ = std::io::stdout().flush();
            (mark, replaced) = (Instant::now(), 0);
            if seconds > 0 && start.elapsed() >= Duration::from_secs(seconds) {
                std::hint::black_box(&chunks);
                std::process::exit(0);
            }
        }
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--churn") {
        let mib = |n: usize, default: u64| {
            std::env::args()
                .nth(n)
                .map_or(Some(default), |s| s.parse().ok())
                .unwrap_or_else(|| {
                    eprintln!("usage: memhog --churn <MiB> [seconds]");
                    std::process::exit(2)
                })
        };
        churn(mib(2, 240) as usize, mib(3, 0));
    }
    if std::env::args().nth(1).as_deref() == Some("--watch") {
        let levels: Vec<u64> = std::env::args()
            .skip(2)
            .map(|a| {
                a.parse().unwrap_or_else(|_| {
                    eprintln!("usage: memhog --watch <kB> [<kB> ...]; bad level {a:?}");
                    std::process::exit(2)
                })
            })
            .collect();
        watch(&levels);
    }
    let total: usize = arg(1, 256);
    let rate: f64 = arg(2, 0.0);
    let hold: u64 = arg(3, 3600);
    let start = Instant::now();
    let out = std::io::stdout();
    let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(total);
    println!(
        "memhog {} start target={total}MiB rate={rate}MiB/s pid={}",
        epoch_ms(),
        std::process::id()
    );
    for i in 0..total {
        chunks.push(touched_chunk(i));
        let done = i + 1;
        if done % 16 == 0 || done == total {
            let _ = writeln!(out.lock(), "memhog {} {done}", epoch_ms());
        }
        if rate > 0.0 {
            let due = Duration::from_secs_f64(done as f64 / rate);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    println!("memhog {} holding {total}MiB for {hold}s", epoch_ms());
    let _ = out.lock().flush();
    std::thread::sleep(Duration::from_secs(hold));
    // Keep the allocation alive until here.
    std::hint::black_box(&chunks);
}
