//! The container runtime as Configure describes it (name, version, NRI
//! version) and what nri-qos may expect of it: one [`RuntimeQuirks`],
//! decided once per session, which the plugin, `nri-qos audit` and the
//! hierarchy keeper all read instead of asking for a runtime by name.
//!
//! The NRI version is the one the runtime sends (NRI v0.12 on); older
//! runtimes do not send it, and it is inferred from the runtime's own
//! version with the releases below (each runtime's `go.mod` at its tag).

use std::fmt;

/// A containerd/nri module version, `v0.12.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NriVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NriVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        NriVersion {
            major,
            minor,
            patch,
        }
    }

    /// `v0.12.0`, `0.12.0`, `v0.9.1-0.20250219030224-e597e7849f24`; `None`
    /// for what a runtime sends when it does not know its own
    /// (`0.0.0-unknown`, `(devel)`) and for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let [major, minor, patch] = leading_triple(text)?;
        let v = NriVersion::new(major, minor, patch);
        (v != NriVersion::new(0, 0, 0)).then_some(v)
    }
}

impl fmt::Display for NriVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The NRI API version nri-qos speaks (`proto/nri/api.proto` follows it),
/// sent in RegisterPlugin.
pub const SPOKEN: NriVersion = NriVersion::new(0, 12, 2);

/// `major.minor.patch` at the start of a version (after an optional `v`),
/// ignoring what follows the patch digits (`1.7.24~ds1`, `-rc.1`, `+git`).
fn leading_triple(text: &str) -> Option<[u32; 3]> {
    let text = text.trim();
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts = text.splitn(3, '.');
    let mut next = |last: bool| -> Option<u32> {
        let part = parts.next()?;
        let digits = if last {
            let end = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            &part[..end]
        } else {
            part
        };
        digits.parse().ok()
    };
    Some([next(false)?, next(false)?, next(true)?])
}

/// The runtimes nri-qos knows apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuntimeKind {
    Containerd,
    CriO,
    #[default]
    Other,
}

impl RuntimeKind {
    /// From Configure's `runtime_name`. containerd 2.0.0-2.0.3 send the
    /// last element of their Go package path, `v2`.
    pub fn from_name(name: &str) -> Self {
        match name {
            "containerd" | "v2" => RuntimeKind::Containerd,
            "cri-o" => RuntimeKind::CriO,
            _ => RuntimeKind::Other,
        }
    }
}

/// The first runtime release of each containerd/nri version it vendors
/// (`go.mod` at the tags); later releases keep the last one at or below.
const CONTAINERD: &[([u32; 3], NriVersion)] = &[
    ([1, 7, 0], NriVersion::new(0, 3, 0)),
    ([1, 7, 7], NriVersion::new(0, 4, 0)),
    ([1, 7, 14], NriVersion::new(0, 6, 0)),
    ([1, 7, 16], NriVersion::new(0, 6, 1)),
    ([1, 7, 26], NriVersion::new(0, 8, 0)),
    ([2, 0, 0], NriVersion::new(0, 8, 0)),
    ([2, 2, 0], NriVersion::new(0, 10, 0)),
    ([2, 2, 1], NriVersion::new(0, 11, 0)),
    ([2, 3, 0], NriVersion::new(0, 12, 0)),
];

/// As [`CONTAINERD`], for CRI-O.
const CRI_O: &[([u32; 3], NriVersion)] = &[
    ([1, 26, 0], NriVersion::new(0, 2, 0)),
    ([1, 26, 2], NriVersion::new(0, 3, 0)),
    ([1, 29, 0], NriVersion::new(0, 5, 0)),
    ([1, 29, 2], NriVersion::new(0, 6, 0)),
    ([1, 31, 0], NriVersion::new(0, 6, 1)),
    ([1, 32, 0], NriVersion::new(0, 9, 0)),
    ([1, 33, 0], NriVersion::new(0, 9, 1)),
    ([1, 34, 0], NriVersion::new(0, 10, 0)),
    ([1, 35, 0], NriVersion::new(0, 11, 0)),
    ([1, 37, 0], NriVersion::new(0, 12, 0)),
];

/// The NRI version a runtime release vendors, from the tables above;
/// `None` for another runtime, a version we cannot read, or one older
/// than the table.
pub fn infer_nri(kind: RuntimeKind, runtime_version: &str) -> Option<NriVersion> {
    let table = match kind {
        RuntimeKind::Containerd => CONTAINERD,
        RuntimeKind::CriO => CRI_O,
        RuntimeKind::Other => return None,
    };
    let release = leading_triple(runtime_version)?;
    table
        .iter()
        .take_while(|(first, _)| *first <= release)
        .last()
        .map(|(_, nri)| *nri)
}

/// Where the NRI version in [`RuntimeQuirks::nri`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NriSource {
    /// Configure's `NRI_version` (NRI v0.12 on).
    Sent,
    /// The runtime's name and version, through the tables above.
    Inferred,
    /// Neither: every quirk takes its cautious side.
    #[default]
    Unknown,
}

impl NriSource {
    pub fn label(self) -> &'static str {
        match self {
            NriSource::Sent => "sent",
            NriSource::Inferred => "inferred",
            NriSource::Unknown => "unknown",
        }
    }
}

/// NRI v0.7.0: Configure carries timeouts; the oom_score_adj adjustment.
const OOM_SCORE_ADJ: NriVersion = NriVersion::new(0, 7, 0);
/// NRI v0.10.0: `unified` shown to plugins (`FromOCILinuxResources` copies
/// it), the UpdatePodSandbox RPC and event bits above 0x7FF.
const UNIFIED_AND_POD_UPDATE: NriVersion = NriVersion::new(0, 10, 0);
/// NRI v0.12.0: an RPC of its own for every pod and container event.
const DEDICATED_EVENTS: NriVersion = NriVersion::new(0, 12, 0);
/// NRI v0.12.1: containerd/nri#301, the adaptation no longer holds its lock
/// across a plugin's UpdateContainers (containerd/containerd#13733).
const UPDATE_DEADLOCK_FIX: NriVersion = NriVersion::new(0, 12, 1);

/// What nri-qos may expect of the runtime of this session. Decided once in
/// Configure ([`RuntimeQuirks::decide`]); the default is an unknown runtime,
/// where every flag takes its cautious side.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeQuirks {
    /// Configure's `runtime_name` and `runtime_version`, for logs.
    pub name: String,
    pub version: String,
    pub kind: RuntimeKind,
    /// The runtime's NRI version, sent or inferred.
    pub nri: Option<NriVersion>,
    pub nri_source: NriSource,
    /// It shows plugins each container's CRI `unified` map (NRI v0.10 on:
    /// containerd 2.2, CRI-O 1.34), in events and in Synchronize, where it
    /// also holds what plugins adjusted before: a key the CRI request did
    /// not carry was not set by the kubelet. Before, plugins see none of it.
    pub shows_unified: bool,
    /// Restarted after an in-place resize, it reports a container with the
    /// resources it was created with (CRI-O); the kernel holds the current
    /// limits. containerd keeps its report current.
    pub forgets_resizes: bool,
    /// It applies the oom_score_adj adjustment (NRI v0.7 on); NRI v0.6
    /// drops it silently and nri-qos writes `/proc/<pid>/oom_score_adj`.
    pub applies_oom_score_adj: bool,
    /// It sends UpdatePodSandbox for a pod-level resize and accepts the
    /// v0.10 event bits (NRI v0.10 on; older runtimes drop a plugin that
    /// subscribes to an event they do not know).
    pub pod_update_events: bool,
    /// It calls the per-event RPCs of NRI v0.12 before StateChange.
    pub dedicated_event_rpcs: bool,
    /// A plugin's own UpdateContainers cannot deadlock it (containerd/nri#301,
    /// NRI v0.12.1 on: containerd 2.4; no containerd 1.7-2.3 or CRI-O 1.37
    /// release carries it).
    pub update_deadlock_fixed: bool,
}

impl RuntimeQuirks {
    /// From Configure: the runtime's name and version, the NRI version it
    /// sent (empty before v0.12), and whether it sent timeouts (NRI v0.7 on,
    /// the one sign of v0.7 where the version is unknown).
    pub fn decide(name: &str, version: &str, nri_version: &str, sent_timeouts: bool) -> Self {
        let kind = RuntimeKind::from_name(name);
        let (nri, nri_source) = match NriVersion::parse(nri_version) {
            Some(v) => (Some(v), NriSource::Sent),
            None => match infer_nri(kind, version) {
                Some(v) => (Some(v), NriSource::Inferred),
                None => (None, NriSource::Unknown),
            },
        };
        let at_least = |floor: NriVersion| nri.is_some_and(|v| v >= floor);
        RuntimeQuirks {
            name: name.to_string(),
            version: version.to_string(),
            kind,
            nri,
            nri_source,
            shows_unified: at_least(UNIFIED_AND_POD_UPDATE),
            forgets_resizes: kind == RuntimeKind::CriO,
            applies_oom_score_adj: match nri {
                Some(v) => v >= OOM_SCORE_ADJ,
                None => sent_timeouts,
            },
            pod_update_events: at_least(UNIFIED_AND_POD_UPDATE),
            dedicated_event_rpcs: at_least(DEDICATED_EVENTS),
            update_deadlock_fixed: at_least(UPDATE_DEADLOCK_FIX),
        }
    }

    /// The NRI version for a log line: `v0.11.0` or `unknown`.
    pub fn nri_label(&self) -> String {
        self.nri.map_or_else(|| "unknown".into(), |v| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> Option<NriVersion> {
        Some(NriVersion::new(major, minor, patch))
    }

    #[test]
    fn versions_are_read_as_runtimes_send_them() {
        assert_eq!(NriVersion::parse("v0.12.0"), v(0, 12, 0));
        assert_eq!(NriVersion::parse("0.11.0"), v(0, 11, 0));
        assert_eq!(
            NriVersion::parse("v0.9.1-0.20250219030224-e597e7849f24"),
            v(0, 9, 1)
        );
        for unknown in ["", "0.0.0-unknown", "(devel)", "v1", "x.y.z", "v0.12"] {
            assert_eq!(NriVersion::parse(unknown), None, "{unknown:?}");
        }
        assert_eq!(NriVersion::new(0, 12, 1).to_string(), "v0.12.1");
        assert!(NriVersion::new(0, 10, 0) > NriVersion::new(0, 9, 9));
    }

    #[test]
    fn the_nri_version_is_inferred_from_the_release() {
        let c = RuntimeKind::Containerd;
        for (release, nri) in [
            ("1.7.24~ds1", v(0, 6, 1)),
            ("v1.7.26", v(0, 8, 0)),
            ("2.1.9", v(0, 8, 0)),
            ("v2.2.0", v(0, 10, 0)),
            ("v2.2.7", v(0, 11, 0)),
            ("v2.3.4", v(0, 12, 0)),
            ("1.6.36", None),
            ("garbage", None),
        ] {
            assert_eq!(infer_nri(c, release), nri, "containerd {release}");
        }
        let o = RuntimeKind::CriO;
        assert_eq!(infer_nri(o, "1.31.3"), v(0, 6, 1));
        assert_eq!(infer_nri(o, "1.34.2"), v(0, 10, 0));
        assert_eq!(infer_nri(o, "1.36.3"), v(0, 11, 0));
        assert_eq!(infer_nri(RuntimeKind::Other, "2.3.4"), None);
        assert_eq!(RuntimeKind::from_name("v2"), RuntimeKind::Containerd);
    }

    /// Every quirk of every runtime the project tests, and an unknown one.
    #[test]
    fn quirks_of_the_runtimes_we_meet() {
        // (name, version, NRI sent, timeouts) ->
        // (unified, forgets, oom, pod update, dedicated, deadlock fix)
        type Row = (&'static str, &'static str, &'static str, bool);
        let cases: [(Row, [bool; 6]); 8] = [
            (
                ("containerd", "1.7.24~ds1", "", false),
                [false, false, false, false, false, false],
            ),
            (
                ("containerd", "2.1.9", "", true),
                [false, false, true, false, false, false],
            ),
            (
                ("containerd", "v2.2.7", "", true),
                [true, false, true, true, false, false],
            ),
            (
                ("containerd", "v2.3.4", "v0.12.0", true),
                [true, false, true, true, true, false],
            ),
            (
                ("containerd", "v2.4.0", "v0.12.2", true),
                [true, false, true, true, true, true],
            ),
            (
                ("cri-o", "1.37.0", "v0.12.0", true),
                [true, true, true, true, true, false],
            ),
            (
                ("cri-o", "1.31.0", "", false),
                [false, true, false, false, false, false],
            ),
            (
                ("other", "1.0", "", true),
                [false, false, true, false, false, false],
            ),
        ];
        for ((name, version, nri, timeouts), want) in cases {
            let q = RuntimeQuirks::decide(name, version, nri, timeouts);
            let got = [
                q.shows_unified,
                q.forgets_resizes,
                q.applies_oom_score_adj,
                q.pod_update_events,
                q.dedicated_event_rpcs,
                q.update_deadlock_fixed,
            ];
            assert_eq!(got, want, "{name} {version} {nri:?}: {q:?}");
        }
        // The version sent wins over the one the release implies.
        let q = RuntimeQuirks::decide("containerd", "v2.1.9", "v0.12.1", true);
        assert_eq!((q.nri, q.nri_source), (v(0, 12, 1), NriSource::Sent));
        assert!(q.update_deadlock_fixed);
        let q = RuntimeQuirks::decide("containerd", "v2.2.7", "0.0.0-unknown", true);
        assert_eq!((q.nri, q.nri_source), (v(0, 11, 0), NriSource::Inferred));
        let q = RuntimeQuirks::default();
        assert_eq!(
            (q.nri_source, q.nri_label().as_str()),
            (NriSource::Unknown, "unknown")
        );
        assert!(!q.shows_unified && !q.pod_update_events && !q.applies_oom_score_adj);
    }
}
