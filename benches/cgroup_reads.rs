//! What one cgroup-file read of a Synchronize costs, and whether reading
//! relative to a directory fd or on two threads makes it cheaper: the
//! Synchronize's ~5,000 reads (open, read, close of a single value) on a
//! tree shaped like a node's, 1,000 Burstable pods of 3 containers each.
//! `NRI_READS_REAL=<file>` also times one real (kernfs) cgroup file, read
//! only. `cargo bench --bench cgroup_reads`.

// Bench code: a failed unwrap is the bench's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

const PODS: usize = 1000;
const PER_POD: usize = 3;
const FILES: [&str; 2] = ["memory.min", "memory.high"];

/// Open, read into a stack buffer, close: as `cgroupfs::with_value`.
fn read_path(p: &Path) -> usize {
    let mut buf = [0u8; 64];
    File::open(p)
        .and_then(|mut f| f.read(&mut buf))
        .unwrap_or(0)
}

fn read_at(dir: &File, name: &str) -> usize {
    let mut buf = [0u8; 64];
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    match openat(Some(dir.as_raw_fd()), name, flags, Mode::empty()) {
        Ok(fd) => {
            let n = nix::unistd::read(fd, &mut buf).unwrap_or(0);
            let _ = nix::unistd::close(fd);
            n
        }
        Err(_) => 0,
    }
}

fn tree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::with_capacity(PODS * PER_POD);
    for p in 0..PODS {
        let pod = root.join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{p:08x}_1111_2222_3333_444444444444.slice"
        ));
        for c in 0..PER_POD {
            let dir = pod.join(format!("cri-containerd-{:064x}.scope", p * PER_POD + c));
            std::fs::create_dir_all(&dir).unwrap();
            for f in FILES {
                std::fs::write(dir.join(f), "268435456\n").unwrap();
            }
            dirs.push(dir);
        }
    }
    dirs
}

/// Microseconds per file read by `f` over `reads` files.
fn per_read(reads: usize, f: impl FnOnce() -> usize) -> f64 {
    let t = Instant::now();
    let got = f();
    assert!(got > 0);
    t.elapsed().as_secs_f64() * 1e6 / reads as f64
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = tree(tmp.path());
    let paths: Vec<PathBuf> = dirs.iter().flat_map(|d| FILES.map(|f| d.join(f))).collect();
    let n = paths.len();
    let full = || paths.iter().map(|p| read_path(p)).sum();
    let dir_fd = || {
        let one = |d: &PathBuf| match File::open(d) {
            Ok(dir) => FILES.iter().map(|f| read_at(&dir, f)).sum(),
            Err(_) => 0,
        };
        dirs.iter().map(one).sum()
    };
    let threads = |t: usize| {
        let chunk = n.div_ceil(t);
        std::thread::scope(|s| {
            let hs: Vec<_> = paths
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().map(|p| read_path(p)).sum::<usize>()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        })
    };
    println!(
        "{n} reads (open+read+close), us per read, regular-fs tree in {}",
        tmp.path().display()
    );
    println!("round  full path  dir fd + openat  2 threads  4 threads");
    for round in 1..=5 {
        let a = per_read(n, full);
        let b = per_read(n, dir_fd);
        let c = per_read(n, || threads(2));
        let d = per_read(n, || threads(4));
        println!("{round:>5}  {a:>9.2}  {b:>15.2}  {c:>9.2}  {d:>9.2}");
    }
    if let Some(real) = std::env::var_os("NRI_READS_REAL") {
        let real = PathBuf::from(real);
        for round in 1..=5 {
            let a = per_read(n, || (0..n).map(|_| read_path(&real)).sum());
            println!("{round:>5}  {a:>9.2}  (read only: {})", real.display());
        }
    }
}
