//! The kubelet's and the OCI runtimes' formulas, transcribed as plain
//! integer arithmetic (Go semantics: `/` truncates). Sources are named on
//! each function; worked vectors are in the tests.

/// cgroup v1 `cpu.shares` bounds (kubelet `MinShares` / `MaxShares`).
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;
/// Default CFS period and the smallest quota the kubelet sets (µs).
pub const QUOTA_PERIOD: u64 = 100_000;
pub const MIN_QUOTA: i64 = 1_000;
/// oom_score_adj values the kubelet and containerd use.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
pub const SANDBOX_OOM_SCORE_ADJ: i64 = -998;

/// kubelet `MilliCPUToShares`: 0 → 2, else `m*1024/1000` clamped.
pub fn milli_cpu_to_shares(milli: u64) -> u64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The CPU request the runtime's shares stand for, in millicores
/// (`shares*1000/1024`, truncating; shares ≤ 2 mean "no request").
pub fn shares_to_milli_cpu(shares: u64) -> u64 {
    if shares <= MIN_SHARES {
        return 0;
    }
    shares.saturating_mul(1000) / 1024
}

/// kubelet `MilliCPUToQuota`: 0 → no quota, else `m*period/1000`, at least 1000 µs.
pub fn milli_cpu_to_quota(milli: u64, period: u64) -> i64 {
    if milli == 0 {
        return 0;
    }
    let q = milli.saturating_mul(period) / 1000;
    i64::try_from(q).unwrap_or(i64::MAX).max(MIN_QUOTA)
}

/// Classic linear shares → cpu.weight (KEP-2254; the kubelet's own
/// `getCPUWeight` for pod and QoS cgroups, runc < 1.3.2).
pub fn cpu_weight_linear(shares: u64) -> u64 {
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((s - 2) * 9999) / 262_142
}

/// Quadratic-in-log2 shares → cpu.weight that runc ≥ 1.3.2 and crun ≥ 1.23
/// use (`ConvertCPUSharesToCgroupV2Value`): passes through (2,1), (1024,100)
/// and (262144,10000), so one CPU weighs the same as a systemd service.
pub fn cpu_weight_quadratic(shares: u64) -> u64 {
    if shares <= MIN_SHARES {
        return 1;
    }
    if shares >= MAX_SHARES {
        return 10_000;
    }
    // The `libm` crate, not std's `log2`/`powf`: those are the only calls
    // the plugin makes into libm.so, and linking it costs 0.3-0.6 MiB of
    // RSS (docs/dependencies.md). Same value for every input (tested below).
    let l = libm::log2(shares as f64);
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    // 2 < shares < 262144, so the power is finite, positive and below 10^4.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let weight = libm::ceil(libm::pow(10.0, exponent)) as u64;
    weight.clamp(1, 10_000)
}

/// kubelet `GetContainerOOMScoreAdjust` for a Burstable container:
/// `1000 - (1000*request)/capacity`, then the floor 3 and 1000 → 999.
pub fn burstable_oom_score_adj(memory_request: u64, memory_capacity: u64) -> i64 {
    if memory_capacity == 0 {
        return 999;
    }
    let frac =
        (1000u128 * u128::from(memory_request) / u128::from(memory_capacity)).min(2000) as i64;
    let adj = 1000 - frac;
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        return 3;
    }
    if adj == 1000 {
        return 999;
    }
    adj
}

/// Inverts [`burstable_oom_score_adj`]: every request the kubelet maps to
/// `adj` on a node of `capacity` bytes. The formula truncates, so that is
/// `[⌈(1000−adj)·C/1000⌉, ⌈(1001−adj)·C/1000⌉)`, C/1000 wide (about 17 MB on
/// 16 GiB); for the floor 3 it is everything from its start up. `None` when
/// adj carries no request (999, 1000, or outside the Burstable range) or no
/// request yields it (a node under 1000 bytes).
pub fn memory_request_range_from_oom_score_adj(
    adj: i64,
    capacity: u64,
) -> Option<std::ops::Range<u64>> {
    if !(3..=998).contains(&adj) {
        return None;
    }
    let adj = adj.unsigned_abs(); // 3..=998, checked above
    let bound = |permille: u64| {
        let v = (u128::from(permille) * u128::from(capacity)).div_ceil(1000);
        u64::try_from(v).unwrap_or(u64::MAX)
    };
    let start = bound(1000 - adj);
    let end = if adj == 3 {
        u64::MAX
    } else {
        bound(1001 - adj)
    };
    (start < end).then_some(start..end)
}

/// The smallest request that yields `adj` (see
/// [`memory_request_range_from_oom_score_adj`]): we take the lower end so we
/// never protect more than was asked.
pub fn memory_request_from_oom_score_adj(adj: i64, capacity: u64) -> Option<u64> {
    memory_request_range_from_oom_score_adj(adj, capacity).map(|r| r.start)
}

/// KEP-2570 memory.high: `floor((req + factor*(base-req)) / page) * page`,
/// where base is the limit, or node allocatable without one. `None` when it
/// would not exceed the request (the kubelet then sets nothing).
pub fn memory_high(
    request: u64,
    limit: Option<u64>,
    allocatable: u64,
    factor: f64,
    page: u64,
) -> Option<u64> {
    let base = limit.unwrap_or(allocatable);
    if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) || page == 0 || base <= request {
        return None;
    }
    let raw = request as f64 + (base as f64 - request as f64) * factor;
    // raw lies between request and base (factor is in (0, 1]) and page > 0,
    // so the page count is finite, non-negative and at most base.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let pages = (raw / page as f64).floor() as u64;
    let high = pages.saturating_mul(page);
    (high > request && high <= base).then_some(high)
}

/// Rounds down to a whole number of pages.
pub fn page_align_down(v: u64, page: u64) -> u64 {
    v.checked_div(page).map_or(v, |pages| pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u64 = 17_179_869_184; // 16 GiB
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn shares_vectors_kubelet_milli_cpu_to_shares() {
        // kubelet-qos.md §3 / §8 rows 1-13.
        assert_eq!(milli_cpu_to_shares(0), 2); // row 1
        assert_eq!(milli_cpu_to_shares(1000), 1024); // row 2
        assert_eq!(milli_cpu_to_shares(250), 256); // row 3
        assert_eq!(milli_cpu_to_shares(100), 102); // row 4
        assert_eq!(milli_cpu_to_shares(500), 512); // row 5
        assert_eq!(milli_cpu_to_shares(4000), 4096); // row 7
        assert_eq!(milli_cpu_to_shares(5), 5); // row 9
        assert_eq!(milli_cpu_to_shares(1), 2); // clamp low
        assert_eq!(milli_cpu_to_shares(300_000), 262_144); // row 13 cap
        assert_eq!(milli_cpu_to_shares(3500), 3584); // row 15
        assert_eq!(milli_cpu_to_shares(15_500), 15_872); // row 16
    }

    #[test]
    fn quota_vectors_kubelet_milli_cpu_to_quota() {
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD), 0);
        assert_eq!(milli_cpu_to_quota(1000, QUOTA_PERIOD), 100_000); // row 2
        assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD), 25_000); // row 3
        assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD), 50_000); // row 4
        assert_eq!(milli_cpu_to_quota(8000, QUOTA_PERIOD), 800_000); // row 7
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD), 1_000); // row 9 min quota
        assert_eq!(milli_cpu_to_quota(200, QUOTA_PERIOD), 20_000); // row 8
    }

    #[test]
    fn weight_vectors_linear_kep_2254() {
        assert_eq!(cpu_weight_linear(2), 1); // row 1
        assert_eq!(cpu_weight_linear(1024), 39); // row 2
        assert_eq!(cpu_weight_linear(256), 10); // row 3
        assert_eq!(cpu_weight_linear(102), 4); // row 4
        assert_eq!(cpu_weight_linear(512), 20); // row 5
        assert_eq!(cpu_weight_linear(4096), 157); // row 7
        assert_eq!(cpu_weight_linear(262_144), 10_000); // row 13
        assert_eq!(cpu_weight_linear(3584), 137); // row 15
        assert_eq!(cpu_weight_linear(15_872), 606); // row 16
        assert_eq!(cpu_weight_linear(8192), 313); // kubernetes/kubernetes#139807
        assert_eq!(cpu_weight_linear(2048), 79); // row 11
    }

    /// The pure-Rust `libm` gives the weight glibc's libm gives, for every
    /// share value in between the clamps.
    #[test]
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn quadratic_weight_is_glibcs_for_every_share_value() {
        for shares in MIN_SHARES + 1..MAX_SHARES {
            let l = (shares as f64).log2();
            let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
            let glibc = (10f64.powf(exponent).ceil() as u64).clamp(1, 10_000);
            assert_eq!(cpu_weight_quadratic(shares), glibc, "shares {shares}");
        }
    }

    #[test]
    fn weight_vectors_quadratic_runc_crun() {
        assert_eq!(cpu_weight_quadratic(2), 1); // row 1
        assert_eq!(cpu_weight_quadratic(1024), 100); // row 2: exactly 100
        assert_eq!(cpu_weight_quadratic(256), 35); // row 3
        assert_eq!(cpu_weight_quadratic(102), 17); // row 4
        assert_eq!(cpu_weight_quadratic(512), 59); // row 5
        assert_eq!(cpu_weight_quadratic(4096), 303); // row 7
        assert_eq!(cpu_weight_quadratic(5), 2); // row 9
        assert_eq!(cpu_weight_quadratic(262_144), 10_000); // row 13
        assert_eq!(cpu_weight_quadratic(2048), 174); // row 11
        assert_eq!(cpu_weight_quadratic(15_872), 918); // row 16 (new formula)
    }

    #[test]
    fn oom_vectors_kubelet_policy_go() {
        assert_eq!(burstable_oom_score_adj(128 * MI, C), 993); // §2
        assert_eq!(burstable_oom_score_adj(GI, C), 938); // §2, row 5
        assert_eq!(burstable_oom_score_adj(16 * GI, C), 3); // §2, row 7 (0 → floor 3)
        assert_eq!(burstable_oom_score_adj(MI, C), 999); // §2, row 8 (1000 → 999)
        assert_eq!(burstable_oom_score_adj(0, C), 999); // no request
        assert_eq!(burstable_oom_score_adj(256 * MI, C), 985); // row 9
        assert_eq!(burstable_oom_score_adj(512 * MI, C), 969); // row 10 app
        assert_eq!(burstable_oom_score_adj(64 * MI, C), 997); // row 10 sidecar own
        assert_eq!(burstable_oom_score_adj(32 * GI, C), 3); // beyond capacity
        assert_eq!(burstable_oom_score_adj(u64::MAX, 1), 3);
    }

    #[test]
    fn request_recovery_brackets_the_true_request() {
        // §5 route 2: adj 993 on 16 GiB → [120.3 MB, 137.4 MB), true 128Mi.
        let r = memory_request_range_from_oom_score_adj(993, C).unwrap();
        assert_eq!(r, 120_259_085..137_438_954);
        assert!(r.contains(&(128 * MI)));
        assert_eq!(burstable_oom_score_adj(r.start, C), 993);
        assert_eq!(burstable_oom_score_adj(r.start - 1, C), 994);
        assert_eq!(burstable_oom_score_adj(r.end - 1, C), 993);
        assert_eq!(burstable_oom_score_adj(r.end, C), 992);
        assert_eq!(memory_request_from_oom_score_adj(993, C), Some(r.start));
        assert_eq!(
            memory_request_range_from_oom_score_adj(3, C).unwrap().end,
            u64::MAX
        );
        assert_eq!(memory_request_range_from_oom_score_adj(993, 500), None);
        assert_eq!(memory_request_from_oom_score_adj(999, C), None);
        assert_eq!(memory_request_from_oom_score_adj(1000, C), None);
        assert_eq!(memory_request_from_oom_score_adj(-997, C), None);
        assert!(memory_request_from_oom_score_adj(3, C).is_some());
    }

    #[test]
    fn memory_high_vectors_kep_2570() {
        let page = 4096;
        let alloc = 15 * GI;
        // row 4: 128Mi → 512Mi.
        assert_eq!(
            memory_high(128 * MI, Some(512 * MI), alloc, 0.9, page),
            Some(496_603_136)
        );
        // row 5: 1Gi, no limit: base = allocatable 15 GiB.
        assert_eq!(
            memory_high(GI, None, alloc, 0.9, page),
            Some(14_602_887_168)
        );
        // row 6: request == limit → none.
        assert_eq!(memory_high(GI, Some(GI), alloc, 0.9, page), None);
        // row 7: 16Gi → 32Gi.
        assert_eq!(
            memory_high(16 * GI, Some(32 * GI), alloc, 0.9, page),
            Some(32_641_748_992)
        );
        // row 8: 1Mi → 64Mi.
        assert_eq!(
            memory_high(MI, Some(64 * MI), alloc, 0.9, page),
            Some(60_502_016)
        );
        // row 9: 256Mi → 512Mi.
        assert_eq!(
            memory_high(256 * MI, Some(512 * MI), alloc, 0.9, page),
            Some(510_025_728)
        );
        // row 1 after the BestEffort fix: floor(0.9 * 15Gi / page) * page.
        assert_eq!(memory_high(0, None, alloc, 0.9, page), Some(14_495_514_624));
        // nonsense factors are refused, not obeyed
        assert_eq!(memory_high(0, None, alloc, f64::NAN, page), None);
        assert_eq!(memory_high(0, None, alloc, 0.0, page), None);
        assert_eq!(memory_high(0, None, alloc, 1.5, page), None);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn shares_are_bounded_and_monotonic(m in 0u64..2_000_000, d in 0u64..10_000) {
                let (a, b) = (milli_cpu_to_shares(m), milli_cpu_to_shares(m + d));
                prop_assert!((MIN_SHARES..=MAX_SHARES).contains(&a));
                prop_assert!(a <= b);
            }

            #[test]
            fn cpu_request_survives_the_trip_through_shares(m in 3u64..=256_000) {
                // What the plugin reads back is within 1m of what was asked.
                let back = shares_to_milli_cpu(milli_cpu_to_shares(m));
                prop_assert!(back <= m && m - back <= 1, "{m} -> {back}");
            }

            #[test]
            fn quota_is_at_least_the_minimum_and_monotonic(m in 1u64..1_000_000, d in 0u64..10_000) {
                let (a, b) = (milli_cpu_to_quota(m, QUOTA_PERIOD), milli_cpu_to_quota(m + d, QUOTA_PERIOD));
                prop_assert!(a >= MIN_QUOTA);
                prop_assert!(a <= b);
            }

            #[test]
            fn weights_are_bounded_and_monotonic(s in 0u64..400_000, d in 0u64..5_000) {
                for f in [cpu_weight_linear, cpu_weight_quadratic] {
                    let (a, b) = (f(s), f(s + d));
                    prop_assert!((1..=10_000).contains(&a));
                    prop_assert!(a <= b, "{s}: {a} > {b}");
                }
                // The new curve never weighs a request less than the old one.
                prop_assert!(cpu_weight_quadratic(s) >= cpu_weight_linear(s));
            }

            #[test]
            fn burstable_adj_is_bounded_and_falls_with_the_request(
                r in 0u64..(1 << 42), d in 0u64..(1 << 32), c in (1u64 << 28)..(1 << 42),
            ) {
                let (a, b) = (burstable_oom_score_adj(r, c), burstable_oom_score_adj(r + d, c));
                prop_assert!((3..=999).contains(&a));
                prop_assert!(b <= a);
            }

            #[test]
            fn inverted_request_range_is_exact(adj in 4i64..=998, c in (1u64 << 20)..(1 << 44)) {
                let r = memory_request_range_from_oom_score_adj(adj, c).unwrap();
                prop_assert_eq!(burstable_oom_score_adj(r.start, c), adj);
                prop_assert_eq!(burstable_oom_score_adj(r.end - 1, c), adj);
                // just outside: the neighbours' values
                prop_assert_eq!(burstable_oom_score_adj(r.start - 1, c), adj + 1);
                prop_assert_eq!(burstable_oom_score_adj(r.end, c), adj - 1);
                prop_assert!(r.end - r.start <= c / 1000 + 1);
            }

            #[test]
            fn memory_high_lies_between_request_and_base(
                req in 0u64..(1 << 40), extra in 0u64..(1 << 40), alloc in 0u64..(1 << 41),
                factor in 0.01f64..=1.0, limited: bool, page_shift in 12u32..=16,
            ) {
                let page = 1u64 << page_shift;
                let limit = limited.then_some(req + extra);
                if let Some(h) = memory_high(req, limit, alloc, factor, page) {
                    prop_assert!(h > req && h <= limit.unwrap_or(alloc));
                    prop_assert_eq!(h % page, 0);
                }
            }
        }
    }
}
