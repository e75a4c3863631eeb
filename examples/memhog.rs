//! memhog: allocate and touch N MiB at a given rate, then sleep. Used by
//! tests/e2e/pressure/ to create memory pressure inside a VM.
//!
//! Usage: memhog <MiB> [rate MiB/s, 0 = as fast as possible] [hold seconds]
//! Prints one line per 16 MiB: `memhog <epoch_ms> <MiB touched>`, so a
//! harness can line the ramp up with the monitor's log.
//! Build static-ish: `cargo build --release --example memhog`
//! (`RUSTFLAGS='-C target-feature=+crt-static' --target x86_64-unknown-linux-gnu`
//! for a fully static binary).

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

fn arg(n: usize, default: u64) -> u64 {
    match std::env::args().nth(n) {
        Some(s) => s.parse().unwrap_or_else(|_| {
            eprintln!("usage: memhog <MiB> [rate MiB/s] [hold s]; bad argument {s:?}");
            std::process::exit(2)
        }),
        None => default,
    }
}

fn main() {
    let total = arg(1, 256) as usize;
    let rate = arg(2, 0);
    let hold = arg(3, 3600);
    let start = Instant::now();
    let out = std::io::stdout();
    let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(total);
    println!(
        "memhog {} start target={total}MiB rate={rate}MiB/s pid={}",
        epoch_ms(),
        std::process::id()
    );
    for i in 0..total {
        let mut chunk = vec![0u8; MIB];
        // Touch every page so the memory is really charged (not just mapped).
        for p in (0..MIB).step_by(PAGE) {
            chunk[p] = (i as u8) | 1;
        }
        chunks.push(chunk);
        let done = i + 1;
        if done % 16 == 0 || done == total {
            let _ = writeln!(out.lock(), "memhog {} {done}", epoch_ms());
        }
        if rate > 0 {
            let due = Duration::from_secs_f64(done as f64 / rate as f64);
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
