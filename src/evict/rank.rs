//! Victim ranking: the kubelet's memory-pressure order
//! (`rankMemoryPressure = orderedBy(exceedMemoryRequests, priority, memory)`,
//! `pkg/kubelet/eviction/helpers.go`) with two of our own rules on top:
//! critical pods are never candidates, and Guaranteed pods come only after
//! every other pod. Pure: no I/O.

use std::cmp::{Ordering, Reverse};
use std::path::PathBuf;

use crate::node::registry::RequestSource;
use crate::node::QosClass;

/// One pod as the ranking sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub uid: String,
    /// From the registry, when the plugin told us.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub class: QosClass,
    /// "registry" or "cgroup-path".
    pub class_source: &'static str,
    /// memory.current − inactive_file of the pod cgroup.
    pub working_set: u64,
    pub request: u64,
    pub request_source: RequestSource,
    /// `None` ranks as 0, like `corev1helpers.PodPriority`.
    pub priority: Option<i32>,
    /// Only the sandbox (pause) is left: killing it frees nothing.
    pub pause_only: bool,
    /// Static or mirror pod (known from the API server): critical to the
    /// kubelet (`IsCriticalPod`), never evicted.
    pub static_pod: bool,
    pub path: PathBuf,
}

impl Candidate {
    /// The kubelet's `exceedMemoryRequests`: usage > request. BestEffort
    /// (request 0) always counts as exceeding.
    pub fn exceeds_request(&self) -> bool {
        self.class == QosClass::BestEffort || self.working_set > self.request
    }

    /// Usage above request, negative when under (the kubelet's `memory` key).
    pub fn over_request(&self) -> i128 {
        i128::from(self.working_set) - i128::from(self.request)
    }

    fn priority0(&self) -> i32 {
        self.priority.unwrap_or(0)
    }

    /// Short form for log lines: `ns/name|uid class ws/req prio`.
    pub fn brief(&self) -> String {
        let who = match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            _ => self.uid.clone(),
        };
        let prio = self.priority.map_or("-".to_string(), |p| p.to_string());
        format!(
            "{who} {:?} ws={} req={}({}) prio={prio}",
            self.class, self.working_set, self.request, self.request_source
        )
    }
}

/// Who may never be killed.
#[derive(Debug, Clone, PartialEq)]
pub struct RankPolicy {
    pub critical_namespaces: Vec<String>,
    /// priority >= this is critical (the kubelet's `IsCriticalPod` uses 2e9).
    pub critical_priority: i32,
    /// Pods without registry info are skipped.
    pub require_pod_info: bool,
}

/// Why a pod is not a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusion {
    CriticalNamespace(String),
    CriticalPriority(i32),
    StaticPod,
    NoPodInfo,
    PauseOnly,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    /// Indices into the input, best victim first.
    pub order: Vec<usize>,
    pub excluded: Vec<(usize, Exclusion)>,
}

pub fn exclusion(c: &Candidate, policy: &RankPolicy) -> Option<Exclusion> {
    if let Some(ns) = &c.namespace {
        if policy.critical_namespaces.iter().any(|n| n == ns) {
            return Some(Exclusion::CriticalNamespace(ns.clone()));
        }
    }
    if let Some(p) = c.priority {
        if p >= policy.critical_priority {
            return Some(Exclusion::CriticalPriority(p));
        }
    }
    if c.static_pod {
        return Some(Exclusion::StaticPod);
    }
    if policy.require_pod_info && c.namespace.is_none() {
        return Some(Exclusion::NoPodInfo);
    }
    if c.pause_only {
        return Some(Exclusion::PauseOnly);
    }
    None
}

/// Total order used for eviction: Guaranteed last, then the kubelet's three
/// keys, then UID so equal pods rank the same way every time.
pub fn compare(a: &Candidate, b: &Candidate) -> Ordering {
    let key = |c: &Candidate| {
        (
            c.class == QosClass::Guaranteed,
            !c.exceeds_request(),
            c.priority0(),
            Reverse(c.over_request()),
        )
    };
    key(a).cmp(&key(b)).then_with(|| a.uid.cmp(&b.uid))
}

/// The top five of a ranking, for log lines.
pub fn brief(cands: &[Candidate], ranking: &Ranking) -> String {
    ranking
        .order
        .iter()
        .take(5)
        .enumerate()
        .map(|(n, &i)| format!("#{} {}", n + 1, cands[i].brief()))
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn rank(cands: &[Candidate], policy: &RankPolicy) -> Ranking {
    let mut order = Vec::with_capacity(cands.len());
    let mut excluded = Vec::new();
    for (i, c) in cands.iter().enumerate() {
        match exclusion(c, policy) {
            Some(e) => excluded.push((i, e)),
            None => order.push(i),
        }
    }
    order.sort_by(|&i, &j| compare(&cands[i], &cands[j]));
    Ranking { order, excluded }
}

#[cfg(test)]
// Tests cast small, known values; the cast lints guard the product code.
#[allow(clippy::cast_lossless)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use QosClass::*;

    const MI: u64 = 1 << 20;

    fn pod(uid: &str, class: QosClass, ws: u64, req: u64, prio: Option<i32>) -> Candidate {
        Candidate {
            uid: uid.into(),
            namespace: Some("default".into()),
            name: Some(uid.into()),
            class,
            class_source: "registry",
            working_set: ws,
            request: req,
            request_source: RequestSource::Annotation,
            priority: prio,
            pause_only: false,
            static_pod: false,
            path: PathBuf::from(format!("/pods/{uid}")),
        }
    }

    fn policy() -> RankPolicy {
        RankPolicy {
            critical_namespaces: vec!["kube-system".into()],
            critical_priority: 2_000_000_000,
            require_pod_info: false,
        }
    }

    fn uids(c: &[Candidate]) -> Vec<&str> {
        rank(c, &policy())
            .order
            .iter()
            .map(|&i| c[i].uid.as_str())
            .collect()
    }

    // Vectors from the kubelet's rules (eviction/helpers_test.go style).
    #[test]
    fn pressure_rank_exceeders_first_then_priority_then_overage() {
        let c = vec![
            pod("b-under", Burstable, 100 * MI, 200 * MI, None),
            pod("b-over-small", Burstable, 210 * MI, 200 * MI, None),
            pod("b-over-big", Burstable, 900 * MI, 200 * MI, None),
            pod("be-small", BestEffort, 5 * MI, 0, None),
            pod("be-high-prio", BestEffort, 800 * MI, 0, Some(1000)),
            pod("g", Guaranteed, 100 * MI, 100 * MI, Some(-5)),
        ];
        // Exceeders (all BE, over-request B) first; among them low priority
        // first; then larger usage−request. Under-request B next; G last even
        // though its priority is lowest.
        assert_eq!(
            uids(&c),
            [
                "b-over-big",
                "b-over-small",
                "be-small",
                "be-high-prio",
                "b-under",
                "g"
            ]
        );
    }

    #[test]
    fn pressure_rank_priority_beats_usage_among_exceeders() {
        let c = vec![
            pod("big-prio-10", Burstable, 4000 * MI, 100 * MI, Some(10)),
            pod("small-prio-0", BestEffort, 10 * MI, 0, None),
        ];
        assert_eq!(uids(&c), ["small-prio-0", "big-prio-10"]);
    }

    #[test]
    fn pressure_rank_under_request_sorted_by_smallest_shortfall() {
        // Both under request: the kubelet's memory key still applies to the
        // negative difference, so the one closest to its request goes first.
        let c = vec![
            pod("far", Burstable, 10 * MI, 500 * MI, None),
            pod("near", Burstable, 490 * MI, 500 * MI, None),
        ];
        assert_eq!(uids(&c), ["near", "far"]);
    }

    #[test]
    fn pressure_rank_never_critical_or_pause_only() {
        let mut sys = pod("sys", BestEffort, 900 * MI, 0, None);
        sys.namespace = Some("kube-system".into());
        let crit = pod("crit", BestEffort, 900 * MI, 0, Some(2_000_001_000));
        let mut pause = pod("pause", BestEffort, 900 * MI, 0, None);
        pause.pause_only = true;
        let mut anon = pod("anon", Burstable, 1, 0, None);
        anon.namespace = None;
        let c = vec![sys, crit, pause, anon, pod("ok", Guaranteed, 1, 1, None)];
        let r = rank(&c, &policy());
        assert_eq!(uids(&c), ["anon", "ok"]);
        assert_eq!(r.excluded.len(), 3);
        let strict = RankPolicy {
            require_pod_info: true,
            ..policy()
        };
        let r = rank(&c, &strict);
        assert!(r.excluded.contains(&(3, Exclusion::NoPodInfo)));
    }

    // ---- Independent transcription of the kubelet's comparator ----------
    //
    // pkg/kubelet/eviction/helpers.go, written in the kubelet's shape
    // (cmpFunc returning -1/0/1, multiSorter.Less) and kept apart from the
    // code above on purpose. Stats are always found here (the monitor skips
    // pods it cannot measure).
    mod kubelet {
        use super::super::Candidate;
        use std::cmp::Ordering;

        type CmpFunc = fn(&Candidate, &Candidate) -> i32;

        fn cmp_bool(a: bool, b: bool) -> i32 {
            if a == b {
                return 0;
            }
            if !b {
                return -1;
            }
            1
        }

        fn memory_request(p: &Candidate) -> i128 {
            // GetResourceRequestQuantity: BestEffort pods have no request.
            p.request as i128
        }

        fn exceed_memory_requests(p1: &Candidate, p2: &Candidate) -> i32 {
            let p1_memory = p1.working_set as i128;
            let p2_memory = p2.working_set as i128;
            let p1_exceeds = p1_memory.cmp(&memory_request(p1)) == Ordering::Greater;
            let p2_exceeds = p2_memory.cmp(&memory_request(p2)) == Ordering::Greater;
            cmp_bool(p1_exceeds, p2_exceeds)
        }

        fn priority(p1: &Candidate, p2: &Candidate) -> i32 {
            let priority1 = p1.priority.unwrap_or(0);
            let priority2 = p2.priority.unwrap_or(0);
            if priority1 == priority2 {
                return 0;
            }
            if priority1 > priority2 {
                return 1;
            }
            -1
        }

        fn memory(p1: &Candidate, p2: &Candidate) -> i32 {
            let p1_memory = p1.working_set as i128 - memory_request(p1);
            let p2_memory = p2.working_set as i128 - memory_request(p2);
            match p2_memory.cmp(&p1_memory) {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            }
        }

        const RANK_MEMORY_PRESSURE: [CmpFunc; 3] = [exceed_memory_requests, priority, memory];

        /// multiSorter.Less
        pub fn less(p1: &Candidate, p2: &Candidate) -> bool {
            let cmp = &RANK_MEMORY_PRESSURE;
            let mut k = 0;
            while k < cmp.len() - 1 {
                let r = cmp[k](p1, p2);
                if r < 0 {
                    return true;
                }
                if r > 0 {
                    return false;
                }
                k += 1;
            }
            cmp[k](p1, p2) < 0
        }

        /// rankMemoryPressure(pods): sort.Sort(orderedBy(...)).
        pub fn rank(pods: &mut [Candidate]) {
            pods.sort_by(|a, b| {
                if less(a, b) {
                    Ordering::Less
                } else if less(b, a) {
                    Ordering::Greater
                } else {
                    Ordering::Equal
                }
            });
        }
    }

    fn arb_pod(i: usize) -> impl Strategy<Value = Candidate> {
        // Small value ranges on purpose, so ties on every key are common.
        let ns = prop_oneof![8 => Just("default"), 1 => Just("kube-system"), 1 => Just("team-a")];
        let prio = prop_oneof![3 => Just(None), 3 => (-2i32..3).prop_map(Some), 1 => Just(Some(2_000_000_000))];
        (
            0u8..3,
            0u64..8,
            0u64..8,
            ns,
            prio,
            proptest::bool::weighted(0.9),
        )
            .prop_map(move |(cls, ws, req, ns, prio, known)| {
                let class = [Guaranteed, Burstable, BestEffort][cls as usize];
                let (ws, req) = match class {
                    // Working set cannot pass memory.max == request.
                    Guaranteed => (ws.min(req.max(1)), req.max(1)),
                    // A running BestEffort pod always uses some memory.
                    BestEffort => (ws.max(1), 0),
                    Burstable => (ws, req),
                };
                let mut p = pod(&format!("p{i:02}"), class, ws * MI, req * MI, prio);
                p.namespace = known.then(|| ns.to_string());
                p
            })
    }

    fn arb_pods() -> impl Strategy<Value = Vec<Candidate>> {
        (0usize..12).prop_flat_map(|n| (0..n).map(arb_pod).collect::<Vec<_>>())
    }

    /// The kubelet's sort keys of a pod, for comparing orders that may
    /// permute ties.
    fn keys(c: &Candidate) -> (bool, i32, i128) {
        (
            c.working_set > c.request,
            c.priority.unwrap_or(0),
            c.over_request(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

        #[test]
        fn pressure_rank_agrees_with_kubelet(pods in arb_pods()) {
            let policy = policy();
            let r = rank(&pods, &policy);
            let ours: Vec<Candidate> = r.order.iter().map(|&i| pods[i].clone()).collect();

            // Never a critical pod.
            for c in &ours {
                prop_assert!(c.namespace.as_deref() != Some("kube-system"));
                prop_assert!(c.priority.unwrap_or(0) < policy.critical_priority);
            }
            prop_assert_eq!(ours.len() + r.excluded.len(), pods.len());

            // Never Guaranteed while a BestEffort or over-request Burstable exists.
            if let Some(first_g) = ours.iter().position(|c| c.class == Guaranteed) {
                prop_assert!(ours[first_g..].iter().all(|c| c.class == Guaranteed));
            }
            if ours.first().is_some_and(|c| c.class == Guaranteed) {
                prop_assert!(!ours.iter().any(|c| c.class == BestEffort
                    || (c.class == Burstable && c.working_set > c.request)));
            }

            // 100 % agreement with the kubelet: our order is exactly
            // rankMemoryPressure over the non-Guaranteed candidates followed by
            // rankMemoryPressure over the Guaranteed ones (ties compared by
            // keys, since sort.Sort leaves their order unspecified).
            let (mut non_g, mut g): (Vec<Candidate>, Vec<Candidate>) =
                ours.iter().cloned().partition(|c| c.class != Guaranteed);
            kubelet::rank(&mut non_g);
            kubelet::rank(&mut g);
            let expect: Vec<_> = non_g.iter().chain(g.iter()).map(keys).collect();
            let got: Vec<_> = ours.iter().map(keys).collect();
            prop_assert_eq!(&got, &expect);

            // Whenever any candidate exceeds its request (every real eviction
            // under pressure), the first victim is the kubelet's first victim
            // over the whole candidate set.
            let mut all = ours.clone();
            kubelet::rank(&mut all);
            if all.first().is_some_and(|c| c.working_set > c.request) {
                prop_assert_eq!(keys(&ours[0]), keys(&all[0]));
                prop_assert!(!kubelet::less(&all[0], &ours[0]));
            }
        }
    }
}
