//! Fuzzer for everything a runtime (or anything that reaches its socket) can
//! send nri-qos. Stable Rust, no extra crates; run it optimised with overflow
//! checks and debug assertions on:
//!
//! ```sh
//! nice -n 19 cargo run --profile fuzz --example fuzz -- --execs 10000000
//! ```
//!
//! Each execution is one of:
//! - **decode**: random or mutated-valid bytes parsed as one of the NRI
//!   messages (every message of `proto/nri/api.proto`, by reflection);
//! - **handler**: a ttrpc request for one of the `Plugin` service's methods
//!   (every method), its payload a valid message with random, boundary and
//!   dictionary values, then mutated half of the time, decoded and handled by
//!   the real `QosPlugin` through the generated ttrpc dispatch;
//! - **chunks** (1 in `--chunks-every`): a Synchronize split into chunks
//!   (`more=true` on all but the last) of few pods or containers carrying
//!   thousands of annotations, the keys nri-qos reads among many it does
//!   not, sometimes mutated, handled in order by the real plugin under a
//!   1 MiB budget; every answer must keep the protocol's shape;
//! - **session** (1 in `--session-every`): a whole plugin session
//!   (`nri::session::run_session`, the public entry the binary uses) over a
//!   socketpair, fed mux frames with garbage, oversized lengths, unknown
//!   connections and mutated ttrpc requests, then closed.
//!
//! A panic anywhere is a crash (counted and printed with the input); a
//! handler using more than 100 ms of CPU (thread CPU time, so a niced run
//! on a busy machine does not count waiting) or a session that does not
//! end within 5 s is a hang. The last line gives executions, rate, peak RSS (VmHWM), crashes
//! and hangs; the exit status is 1 when there were any.
//! `/proc` is a temp directory here, so no real process is ever touched.

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

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nri_qos::nri::lean_sync;
use nri_qos::nri::proto::api;
use nri_qos::nri::{Identity, PluginSettings, QosPlugin};
use nri_qos::qos::{NodeFacts, PolicyConfig};
use protobuf::reflect::{
    FieldDescriptor, MessageDescriptor, ReflectValueBox, RuntimeFieldType, RuntimeType,
};
use protobuf::{Message, MessageDyn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

static CRASHES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// What the current execution feeds in, printed when it panics.
    static CURRENT: RefCell<(String, Vec<u8>)> = const { RefCell::new((String::new(), Vec::new())) };
}

/// SplitMix64: small, fast, reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in.max(1))
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    999,
    1000,
    1001,
    -997,
    -998,
    -999,
    -1000,
    1024,
    4096,
    100_000,
    262_144,
    262_145,
    1 << 30,
    1 << 31,
    (1 << 31) - 1,
    1 << 32,
    1 << 62,
    i64::MAX,
    i64::MIN,
    i64::MAX - 1,
    i32::MAX as i64,
    i32::MIN as i64,
];

const STRINGS: &[&str] = &[
    "",
    "/",
    "..",
    "../../etc",
    "/kubepods/burstable/poda/c1",
    "/kubepods/besteffort/podb",
    "/kubepods/podg",
    "/kubepods/burstable/pod../../../etc",
    "kubepods-burstable-pod1_2.slice",
    "kubepods-besteffort-pod3.slice",
    "kubepods-pod4.slice",
    "kubepods-burstable-pod1_2.slice:cri-containerd:abc",
    "kubepods-burstable-pod1_2.slice:cri-containerd:../../x",
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.max",
    "memory.oom.group",
    "cpu.weight",
    "max",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "0",
    "256Mi",
    "1Gi",
    "1e3",
    "1.5Gi",
    "12x",
    "99999999999999Ei",
    "nan",
    "off",
    "on",
    "memory-request.qos.nri-qos.io",
    "memory-request.qos.nri-qos.io/app",
    "memory-high.qos.nri-qos.io",
    "io.kubernetes.cri.container-type",
    "sandbox",
    "container",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
    "kube-system",
    "default",
    "app",
    "\u{0}",
    "é\u{202e}",
];

/// Config texts a runtime could send in Configure (the drop-in file).
const CONFIGS: &[&str] = &[
    "",
    "[policy]\nmemory-high = false\n",
    "[policy]\nmemory-throttling-factor = 0.5\n",
    "[policy]\nmemory-throttling-factor = nan\n",
    "[plugin]\ndry-run = true\n",
    "[hierarchy]\nbudget-share = -1.0\n",
    "[monitor]\nkubepods = \"../../etc\"\n",
    "[[[",
    "policy = 7",
];

/// Ids come from a small pool so create/remove pairs meet and the
/// plugin's registry stays bounded over millions of executions.
const IDS: &[&str] = &["c1", "c2", "c3", "pod1", "pod2", "sb", "", "x/../y"];

fn string(rng: &mut Rng, field: &str) -> String {
    if field == "id" || field.ends_with("_id") {
        return rng.pick(IDS).to_string();
    }
    if field == "config" {
        return rng.pick(CONFIGS).to_string();
    }
    match rng.below(8) {
        0 => String::from_utf8_lossy(&rng.bytes(24)).into_owned(),
        1 => rng.pick(INTS).to_string(),
        2 => "a".repeat(rng.below(5000)),
        _ => rng.pick(STRINGS).to_string(),
    }
}

fn int(rng: &mut Rng) -> i64 {
    if rng.chance(3) {
        rng.next() as i64
    } else {
        *rng.pick(INTS)
    }
}

fn value(rng: &mut Rng, t: &RuntimeType, field: &str, depth: u32) -> ReflectValueBox {
    match t {
        RuntimeType::I32 => ReflectValueBox::I32(int(rng) as i32),
        RuntimeType::I64 => ReflectValueBox::I64(int(rng)),
        RuntimeType::U32 => ReflectValueBox::U32(int(rng) as u32),
        RuntimeType::U64 => ReflectValueBox::U64(int(rng) as u64),
        RuntimeType::F32 => ReflectValueBox::F32(f32::from_bits(rng.next() as u32)),
        RuntimeType::F64 => ReflectValueBox::F64(f64::from_bits(rng.next())),
        RuntimeType::Bool => ReflectValueBox::Bool(rng.chance(2)),
        RuntimeType::String => ReflectValueBox::String(string(rng, field)),
        RuntimeType::VecU8 => ReflectValueBox::Bytes(rng.bytes(64)),
        RuntimeType::Enum(e) => {
            let n = e.values().count();
            let v = if rng.chance(8) {
                rng.next() as i32
            } else {
                e.value_by_index(rng.below(n)).value()
            };
            ReflectValueBox::Enum(e.clone(), v)
        }
        RuntimeType::Message(m) => ReflectValueBox::Message(filled(rng, m, depth + 1)),
    }
}

/// A message of type `md` with random, boundary and dictionary values.
fn filled(rng: &mut Rng, md: &MessageDescriptor, depth: u32) -> Box<dyn MessageDyn> {
    let mut msg = md.new_instance();
    if depth > 5 {
        return msg;
    }
    let fields: Vec<FieldDescriptor> = md.fields().collect();
    for f in fields {
        if !rng.chance(2) && depth > 0 {
            continue;
        }
        let name = f.name().to_string();
        match f.runtime_field_type() {
            RuntimeFieldType::Singular(t) => {
                let v = value(rng, &t, &name, depth);
                f.set_singular_field(&mut *msg, v);
            }
            RuntimeFieldType::Repeated(t) => {
                let n = if depth == 0 && rng.chance(4) {
                    rng.below(40)
                } else {
                    rng.below(4)
                };
                for _ in 0..n {
                    let v = value(rng, &t, &name, depth);
                    f.mut_repeated(&mut *msg).push(v);
                }
            }
            RuntimeFieldType::Map(k, v) => {
                for _ in 0..rng.below(5) {
                    let key = value(rng, &k, &name, depth);
                    let val = value(rng, &v, &name, depth);
                    f.mut_map(&mut *msg).insert(key, val);
                }
            }
        }
    }
    msg
}

/// Byte-level mutations of an encoded message.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, 0x01, 0x0a, 0x12]);
            }
            2 => data.truncate(rng.below(len + 1)),
            3 => {
                let i = rng.below(len + 1);
                let extra = rng.bytes(16);
                data.splice(i..i, extra);
            }
            4 if len > 1 => {
                let a = rng.below(len);
                let b = a + rng.below(len - a);
                let chunk = data[a..b].to_vec();
                let i = rng.below(len + 1);
                data.splice(i..i, chunk);
            }
            5 => {
                // A varint that claims a huge length.
                let i = rng.below(len + 1);
                data.splice(i..i, [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]);
            }
            _ => {
                if len > 0 {
                    let i = rng.below(len);
                    data.remove(i);
                }
            }
        }
    }
}

struct Target {
    method: String,
    input: MessageDescriptor,
}

fn payload(rng: &mut Rng, md: &MessageDescriptor) -> Vec<u8> {
    if rng.chance(10) {
        return rng.bytes(256);
    }
    let mut bytes = filled(rng, md, 0).write_to_bytes_dyn().unwrap_or_default();
    if rng.chance(2) {
        mutate(rng, &mut bytes);
    }
    bytes
}

fn ttrpc_request(method: &str, payload: Vec<u8>, rng: &mut Rng) -> ttrpc::proto::Request {
    let mut req = ttrpc::proto::Request::new();
    req.service = "nri.pkg.api.v1alpha1.Plugin".into();
    req.method = method.into();
    req.payload = payload;
    req.timeout_nano = if rng.chance(4) {
        int(rng)
    } else {
        2_000_000_000
    };
    req
}

/// The Synchronize budget of the plugins fuzzed: small, so that chunks
/// pass it.
const SYNC_BUDGET: usize = 1 << 20;

fn new_plugin(proc_root: &std::path::Path) -> Arc<QosPlugin> {
    let plugin = QosPlugin::new(PluginSettings {
        policy: PolicyConfig::default(),
        node: NodeFacts {
            memory_capacity: 16 << 30,
            memory_allocatable: 15 << 30,
            page_size: 4096,
            cgroup_v2: true,
        },
        dry_run: false,
        adjust_existing: true,
        proc_root: proc_root.to_path_buf(),
        // Read only (pod cgroups' protection); an empty temp dir here too.
        cgroup_root: proc_root.to_path_buf(),
    });
    Arc::new(plugin.with_sync_budget(SYNC_BUDGET))
}

/// An annotation key: one nri-qos reads, or one of the many it must not keep.
fn annotation_key(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => format!("memory-request.qos.nri-qos.io/{}", rng.pick(STRINGS)),
        1 => rng.pick(STRINGS).to_string(),
        _ => format!("example.com/key-{}", rng.next()),
    }
}

fn annotations(rng: &mut Rng) -> HashMap<String, String> {
    let n = if rng.chance(2) {
        rng.below(20_000)
    } else {
        rng.below(50)
    };
    (0..n)
        .map(|_| (annotation_key(rng), rng.pick(STRINGS).to_string()))
        .collect()
}

/// A Synchronize split into chunks, annotation-heavy (see the module
/// comment): each chunk encoded, whether it was mutated, and the `more`
/// it says.
fn sync_chunks(rng: &mut Rng) -> Vec<(Vec<u8>, bool, bool)> {
    let n = 1 + rng.below(6);
    (0..n)
        .map(|k| {
            let mut req = api::SynchronizeRequest::new();
            for _ in 0..1 + rng.below(3) {
                let id = rng.pick(IDS).to_string();
                if rng.chance(3) {
                    let mut pod = api::PodSandbox::new();
                    pod.id = id;
                    pod.annotations = annotations(rng);
                    pod.labels = annotations(rng);
                    pod.linux.mut_or_insert_default().cgroup_parent = rng.pick(STRINGS).to_string();
                    req.pods.push(pod);
                } else {
                    let mut c = api::Container::new();
                    c.id = id;
                    c.pod_sandbox_id = rng.pick(IDS).to_string();
                    c.name = rng.pick(STRINGS).to_string();
                    c.annotations = annotations(rng);
                    c.labels = annotations(rng);
                    req.containers.push(c);
                }
            }
            req.more = k + 1 < n;
            let mut bytes = req.write_to_bytes().unwrap_or_default();
            let mutated = rng.chance(8);
            if mutated {
                mutate(rng, &mut bytes);
            }
            (bytes, mutated, req.more)
        })
        .collect()
}

fn mux_frame(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = conn.to_be_bytes().to_vec();
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One ttrpc message: 10-byte header, then the payload.
fn ttrpc_frame(stream: u32, kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&stream.to_be_bytes());
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(payload);
    f
}

/// Garbage and near-valid traffic for one session, as trunk bytes.
fn session_bytes(rng: &mut Rng, targets: &[Target]) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..1 + rng.below(12) {
        match rng.below(6) {
            0 => out.extend(rng.bytes(512)),
            1 => {
                // A frame header with a length the plugin must not trust.
                let conn = *rng.pick(&[0u32, 1, 2, 3, u32::MAX]);
                let len = *rng.pick(&[0u32, 4096, 4097, 1 << 20, u32::MAX]);
                out.extend(conn.to_be_bytes());
                out.extend(len.to_be_bytes());
                out.extend(rng.bytes(64));
            }
            _ => {
                let t = rng.pick(targets);
                let body = payload(rng, &t.input);
                let req = ttrpc_request(&t.method, body, rng);
                let mut bytes = req.write_to_bytes().unwrap_or_default();
                if rng.chance(4) {
                    mutate(rng, &mut bytes);
                }
                let stream = if rng.chance(4) {
                    rng.next() as u32
                } else {
                    1 + 2 * rng.below(100) as u32
                };
                let kind = if rng.chance(6) { rng.next() as u8 } else { 1 };
                let flags = if rng.chance(6) { rng.next() as u8 } else { 0 };
                let mut msg = ttrpc_frame(stream, kind, flags, &bytes);
                if rng.chance(8) {
                    mutate(rng, &mut msg);
                }
                // Split over mux frames of at most 4096 bytes, as Go does.
                let conn = if rng.chance(10) { 2 } else { 1 };
                for chunk in msg.chunks(4096) {
                    out.extend(mux_frame(conn, chunk));
                }
            }
        }
    }
    out
}

/// Remembers the input of this execution for the panic hook (no
/// formatting unless it panics).
fn note(kind: &str, name: &str, bytes: &[u8]) {
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.0.clear();
        c.0.push_str(kind);
        c.0.push(' ');
        c.0.push_str(name);
        c.1.clear();
        c.1.extend_from_slice(bytes);
    });
}

/// CPU time of this thread: what a handler costs, whatever else the
/// (shared, niced) machine is doing meanwhile.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

struct Args {
    execs: u64,
    seed: u64,
    session_every: u64,
    chunks_every: u64,
}

fn args() -> Args {
    let mut a = Args {
        execs: 1_000_000,
        seed: 1,
        session_every: 2000,
        chunks_every: 500,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = pair
            .get(1)
            .and_then(|v| v.replace('_', "").parse::<u64>().ok());
        match (pair[0].as_str(), v) {
            ("--execs", Some(v)) => a.execs = v,
            ("--seed", Some(v)) => a.seed = v,
            ("--session-every", Some(v)) => a.session_every = v.max(1),
            ("--chunks-every", Some(v)) => a.chunks_every = v.max(1),
            _ => {
                eprintln!(
                    "usage: fuzz [--execs N] [--seed S] [--session-every K] [--chunks-every K]"
                );
                std::process::exit(2);
            }
        }
    }
    a
}

fn main() {
    let args = args();
    std::panic::set_hook(Box::new(|info| {
        CRASHES.fetch_add(1, Ordering::SeqCst);
        let (what, bytes) = CURRENT.with(|c| c.borrow().clone());
        eprintln!("CRASH: {info}\n  input: {what} {bytes:02x?}");
    }));
    let proc_root = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");

    let fd = api::file_descriptor();
    let messages: Vec<MessageDescriptor> = fd.messages().filter(|m| !m.is_map_entry()).collect();
    let targets: Vec<Target> = fd
        .services()
        .filter(|s| s.proto().name() == "Plugin")
        .flat_map(|s| s.methods().collect::<Vec<_>>())
        .map(|m| Target {
            method: m.proto().name().to_string(),
            input: m.input_type(),
        })
        .collect();
    assert!(targets.len() >= 10, "Plugin service not found");

    let mut rng = Rng(args.seed);
    let mut plugin = new_plugin(proc_root.path());
    // The Plugin service as the binary serves it (Synchronize still encoded).
    let mut services = lean_sync::create_plugin(plugin.clone());
    let identity = Identity::new("fuzz", "10").expect("identity");
    let started = Instant::now();
    let mut last_report = Instant::now();
    let (mut decodes, mut handled, mut sessions, mut hangs) = (0u64, 0u64, 0u64, 0u64);
    let mut chunked = 0u64;
    // Handler calls whose payload decoded and got an answer (not an error).
    let mut answered = 0u64;
    let mut slowest = Duration::ZERO;
    eprintln!(
        "fuzzing {} messages, {} Plugin methods, seed {}",
        messages.len(),
        targets.len(),
        args.seed
    );
    for exec in 0..args.execs {
        if exec % 200_000 == 0 && exec > 0 {
            // A fresh plugin now and then, like a runtime restart.
            plugin = new_plugin(proc_root.path());
            services = lean_sync::create_plugin(plugin.clone());
        }
        if exec % args.chunks_every == args.chunks_every / 2 {
            let handler = &services["nri.pkg.api.v1alpha1.Plugin"].methods["Synchronize"];
            for (bytes, mutated, more) in sync_chunks(&mut rng) {
                note("chunks", "Synchronize", &bytes);
                let req = ttrpc_request("Synchronize", bytes, &mut rng);
                let ctx = ttrpc::r#async::TtrpcContext {
                    mh: ttrpc::MessageHeader::default(),
                    metadata: HashMap::new(),
                    timeout_nano: req.timeout_nano,
                    connection_data: Default::default(),
                };
                let t0 = thread_cpu_time();
                let answer = rt.block_on(handler.handler(ctx, req));
                let took = thread_cpu_time().saturating_sub(t0);
                slowest = slowest.max(took);
                if took > Duration::from_millis(100) {
                    hangs += 1;
                    eprintln!("HANG: a Synchronize chunk used {took:?} of CPU");
                }
                let shape = answer
                    .ok()
                    .and_then(|a| api::SynchronizeResponse::parse_from_bytes(&a.payload).ok())
                    .map(|a| a.more == more && (!more || a.update.is_empty()));
                if !mutated && shape != Some(true) {
                    CRASHES.fetch_add(1, Ordering::SeqCst);
                    eprintln!("CRASH: a Synchronize chunk (more={more}) was answered {shape:?}");
                }
            }
            chunked += 1;
            continue;
        }
        if exec % args.session_every == 0 {
            let bytes = session_bytes(&mut rng, &targets);
            note("session", "", &bytes);
            let p = new_plugin(proc_root.path());
            let id = identity.clone();
            let ended = rt.block_on(async move {
                let (ours, theirs) = tokio::net::UnixStream::pair().expect("socketpair");
                let session =
                    tokio::spawn(
                        async move { nri_qos::nri::session::run_session(ours, p, &id).await },
                    );
                let (mut rd, mut wr) = theirs.into_split();
                let _ = wr.write_all(&bytes).await;
                let _ = wr.shutdown().await;
                // Drain what the plugin writes (registration, answers).
                let drain = tokio::spawn(async move {
                    let mut sink = vec![0u8; 65536];
                    while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
                });
                let r = tokio::time::timeout(Duration::from_secs(5), session).await;
                drain.abort();
                r.is_ok()
            });
            sessions += 1;
            if !ended {
                hangs += 1;
                eprintln!("HANG: session did not end within 5 s");
            }
            continue;
        }
        if rng.chance(3) {
            // Any message type from random or mutated-valid bytes, possibly
            // of another type (the wire does not say which message it is).
            let md = rng.pick(&messages).clone();
            let bytes = if rng.chance(4) {
                rng.bytes(512)
            } else {
                let src = rng.pick(&messages).clone();
                let src = if rng.chance(2) { md.clone() } else { src };
                let mut b = filled(&mut rng, &src, 0)
                    .write_to_bytes_dyn()
                    .unwrap_or_default();
                mutate(&mut rng, &mut b);
                b
            };
            note("decode", md.name(), &bytes);
            if let Ok(m) = md.parse_from_bytes(&bytes) {
                let _ = m.write_to_bytes_dyn();
            }
            decodes += 1;
        } else {
            let t = rng.pick(&targets);
            let body = payload(&mut rng, &t.input);
            note("handler", &t.method, &body);
            let req = ttrpc_request(&t.method, body, &mut rng);
            let handler = &services["nri.pkg.api.v1alpha1.Plugin"].methods[&t.method];
            let ctx = ttrpc::r#async::TtrpcContext {
                mh: ttrpc::MessageHeader::default(),
                metadata: HashMap::new(),
                timeout_nano: req.timeout_nano,
                connection_data: Default::default(),
            };
            let t0 = thread_cpu_time();
            if rt.block_on(handler.handler(ctx, req)).is_ok() {
                answered += 1;
            }
            let took = thread_cpu_time().saturating_sub(t0);
            slowest = slowest.max(took);
            if took > Duration::from_millis(100) {
                hangs += 1;
                eprintln!("HANG: {} used {took:?} of CPU", t.method);
            }
            handled += 1;
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            last_report = Instant::now();
            let secs = started.elapsed().as_secs_f64();
            eprintln!(
                "{exec} execs, {:.0}/s, peak RSS {} KiB, crashes {}, hangs {hangs}",
                exec as f64 / secs,
                peak_rss_kib(),
                CRASHES.load(Ordering::SeqCst)
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let crashes = CRASHES.load(Ordering::SeqCst);
    let _ = std::io::stderr().flush();
    println!(
        "fuzz: {} execs ({decodes} decodes, {handled} handler calls of which {answered} answered, {chunked} chunked Synchronizes, {sessions} sessions) in {secs:.0} s, {:.0} execs/s, peak RSS {} KiB, most CPU in one handler call {slowest:?}, crashes {crashes}, hangs {hangs}",
        args.execs,
        args.execs as f64 / secs,
        peak_rss_kib(),
    );
    if crashes > 0 || hangs > 0 {
        std::process::exit(1);
    }
}
