//! What a scenario does after its pods started: start more containers, wait
//! for some to die, and check who survived, in which order the others went,
//! what memory they kept, and that the kernel OOM killer stayed out of it.
//!
//! ```json
//! "steps": [
//!   {"start": ["be1/hog", "be2/hog"]},
//!   {"wait_exited": {"containers": ["be1/hog", "be2/hog"], "timeout_s": 300}},
//!   {"exit_order": [["be1/hog", "be2/hog"], ["over/app"]]},
//!   {"running": ["guaranteed/app"]},
//!   {"memory": {"prot/app": {"min_current": 140000000, "max_low_events": 0}}},
//!   "no_kernel_oom"
//! ]
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde::Deserialize;

use crate::cri::{self, PodSandboxConfig, RuntimeClient};
use crate::{check, read_trim, PodSpec};

#[derive(Deserialize, Debug)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Create and start `deferred` containers ("pod/ctr"), in this order.
    Start(Vec<String>),
    /// Wait this many seconds.
    Sleep(f64),
    /// Wait until every listed container exited (optionally with this code).
    WaitExited {
        containers: Vec<String>,
        timeout_s: u64,
        #[serde(default)]
        exit_code: Option<i32>,
    },
    /// Wait until each container's memory.current reached its value (e.g.
    /// the page cache of a file it read).
    Filled {
        containers: BTreeMap<String, u64>,
        timeout_s: u64,
    },
    /// Every listed container is still running.
    Running(Vec<String>),
    /// Exited containers, in groups: every container of a group finished
    /// (CRI `finished_at`) before any container of a later group.
    ExitOrder(Vec<Vec<String>>),
    /// Memory of running containers (their own cgroup).
    Memory(BTreeMap<String, MemoryCheck>),
    /// /proc/vmstat `oom_kill` did not move since the scenario began.
    NoKernelOom,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct MemoryCheck {
    /// memory.current at least this many bytes (protection held)
    #[serde(default)]
    pub min_current: Option<u64>,
    /// memory.current at most this many bytes (it was reclaimed)
    #[serde(default)]
    pub max_current: Option<u64>,
    /// memory.events `low` at most this (reclaim below memory.low)
    #[serde(default)]
    pub max_low_events: Option<u64>,
    /// memory.high is exactly this ("max" or bytes): e.g. raised to
    /// memory.max by the throttle guard, or left alone
    #[serde(default)]
    pub memory_high: Option<String>,
    /// memory.swap.current at least this many bytes (it was reclaimed
    /// into swap)
    #[serde(default)]
    pub min_swap_current: Option<u64>,
    /// memory.pressure `some avg10` at most this (percent): not stalled
    #[serde(default)]
    pub max_psi_some_avg10: Option<f64>,
}

/// `some avg10` of a cgroup's memory.pressure (percent).
fn psi_some_avg10(dir: &Path) -> Option<f64> {
    read_trim(&dir.join("memory.pressure"))
        .lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// /proc/vmstat `oom_kill`: kernel OOM kills since boot.
pub fn kernel_oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn events(dir: &Path) -> BTreeMap<String, u64> {
    read_trim(&dir.join("memory.events"))
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

pub struct Context<'a> {
    pub client: &'a mut RuntimeClient,
    pub pods: &'a [PodSpec],
    pub sandboxes: &'a BTreeMap<String, (String, PodSandboxConfig)>,
    pub ids: &'a mut BTreeMap<String, String>,
    pub pids: &'a mut BTreeMap<String, u32>,
    pub oom_kills_before: u64,
    /// "pod/ctr" -> (finished_at ns, exit code)
    pub finished: BTreeMap<String, (i64, i32)>,
}

impl Context<'_> {
    pub async fn run(&mut self, step: &Step) -> Result<bool> {
        match step {
            Step::Start(keys) => self.start(keys).await,
            Step::Sleep(s) => {
                tokio::time::sleep(Duration::from_secs_f64(*s)).await;
                Ok(true)
            }
            Step::WaitExited {
                containers,
                timeout_s,
                exit_code,
            } => self.wait_exited(containers, *timeout_s, *exit_code).await,
            Step::Filled {
                containers,
                timeout_s,
            } => self.filled(containers, *timeout_s).await,
            Step::Running(keys) => self.running(keys).await,
            Step::ExitOrder(groups) => Ok(self.exit_order(groups)),
            Step::Memory(checks) => Ok(self.memory(checks)),
            Step::NoKernelOom => {
                let now = kernel_oom_kills();
                Ok(check(
                    "kernel_oom_killer",
                    now == self.oom_kills_before,
                    &format!("/proc/vmstat oom_kill {} -> {now}", self.oom_kills_before),
                ))
            }
        }
    }

    async fn start(&mut self, keys: &[String]) -> Result<bool> {
        let mut ok = true;
        for key in keys {
            let (pod_name, ctr) = key
                .split_once('/')
                .with_context(|| format!("start: {key:?} is not pod/container"))?;
            let pod = self
                .pods
                .iter()
                .find(|p| p.name == pod_name)
                .with_context(|| format!("start: no pod {pod_name}"))?;
            let c = pod
                .containers
                .iter()
                .find(|c| c.name == ctr)
                .with_context(|| format!("start: no container {key}"))?;
            let Some((pod_id, cfg)) = self.sandboxes.get(pod_name) else {
                ok &= check(&format!("{key}.started"), false, "its pod did not start");
                continue;
            };
            let t0 = Instant::now();
            match crate::create_and_start(self.client, pod, c, pod_id, cfg).await {
                Ok((id, pid)) => {
                    check(
                        &format!("{key}.started"),
                        true,
                        &format!("pid={pid} after {} ms", t0.elapsed().as_millis()),
                    );
                    self.ids.insert(key.clone(), id);
                    self.pids.insert(key.clone(), pid);
                }
                Err(e) => ok &= check(&format!("{key}.started"), false, &format!("{e:#}")),
            }
        }
        Ok(ok)
    }

    async fn status(&mut self, key: &str) -> Result<cri::ContainerStatus> {
        let id = self
            .ids
            .get(key)
            .with_context(|| format!("container {key} was never started"))?
            .clone();
        self.client
            .container_status(&id)
            .await?
            .status
            .with_context(|| format!("no status for {key}"))
    }

    async fn wait_exited(
        &mut self,
        keys: &[String],
        timeout_s: u64,
        want_code: Option<i32>,
    ) -> Result<bool> {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(timeout_s);
        let mut pending: Vec<&String> = keys.iter().collect();
        let mut ok = true;
        while !pending.is_empty() {
            let mut still = Vec::new();
            for key in pending {
                let st = match self.status(key).await {
                    Ok(st) => st,
                    Err(e) => {
                        ok &= check(&format!("{key}.exited"), false, &format!("{e:#}"));
                        continue;
                    }
                };
                if st.state != cri::CONTAINER_EXITED {
                    still.push(key);
                    continue;
                }
                self.finished
                    .insert(key.clone(), (st.finished_at, st.exit_code));
                let code_ok = want_code.is_none_or(|c| c == st.exit_code);
                ok &= check(
                    &format!("{key}.exited"),
                    code_ok,
                    &format!(
                        "exit code {} ({}) {} ms into the step",
                        st.exit_code,
                        st.reason,
                        t0.elapsed().as_millis()
                    ),
                );
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                for key in pending {
                    ok &= check(
                        &format!("{key}.exited"),
                        false,
                        &format!("still running after {timeout_s} s"),
                    );
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(ok)
    }

    fn current(&self, key: &str) -> Option<u64> {
        let dir = crate::cgroup_dir(*self.pids.get(key)?).ok()?;
        read_trim(&dir.join("memory.current")).parse().ok()
    }

    async fn filled(&mut self, want: &BTreeMap<String, u64>, timeout_s: u64) -> Result<bool> {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(timeout_s);
        while want.iter().any(|(k, v)| self.current(k).unwrap_or(0) < *v)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut ok = true;
        for (key, v) in want {
            let cur = self.current(key).unwrap_or(0);
            ok &= check(
                &format!("{key}.filled"),
                cur >= *v,
                &format!(
                    "memory.current {cur} (>= {v}) after {} ms",
                    t0.elapsed().as_millis()
                ),
            );
        }
        Ok(ok)
    }

    async fn running(&mut self, keys: &[String]) -> Result<bool> {
        let mut ok = true;
        for key in keys {
            let res = self.status(key).await;
            let (alive, detail) = match res {
                Ok(st) => (
                    st.state == cri::CONTAINER_RUNNING,
                    format!(
                        "state {} exit code {} {}",
                        st.state, st.exit_code, st.reason
                    ),
                ),
                Err(e) => (false, format!("{e:#}")),
            };
            ok &= check(&format!("{key}.survived"), alive, &detail);
        }
        Ok(ok)
    }

    fn exit_order(&self, groups: &[Vec<String>]) -> bool {
        let at = |k: &String| self.finished.get(k).map(|f| f.0);
        let mut ok = true;
        for pair in groups.windows(2) {
            let last_before = pair[0].iter().filter_map(at).max();
            let first_after = pair[1].iter().filter_map(at).min();
            let good = match (last_before, first_after) {
                (Some(a), Some(b)) => a < b,
                _ => false,
            };
            ok &= check(
                &format!("exit_order.{}", pair[1].join("+")),
                good,
                &format!(
                    "{:?} all gone {} ms before {:?}",
                    pair[0],
                    match (last_before, first_after) {
                        (Some(a), Some(b)) => ((b - a) / 1_000_000).to_string(),
                        _ => "?".into(),
                    },
                    pair[1]
                ),
            );
        }
        ok
    }

    fn memory(&self, checks: &BTreeMap<String, MemoryCheck>) -> bool {
        let mut ok = true;
        for (key, want) in checks {
            let dir = match self.pids.get(key).map(|p| crate::cgroup_dir(*p)) {
                Some(Ok(d)) => d,
                _ => {
                    ok &= check(&format!("{key}.memory"), false, "no cgroup");
                    continue;
                }
            };
            let current: u64 = read_trim(&dir.join("memory.current")).parse().unwrap_or(0);
            let ev = events(&dir);
            let low = ev.get("low").copied().unwrap_or(0);
            let detail = format!(
                "memory.current {current}, memory.low {}, memory.min {}, memory.events low {low} oom_kill {}",
                read_trim(&dir.join("memory.low")),
                read_trim(&dir.join("memory.min")),
                ev.get("oom_kill").copied().unwrap_or(0)
            );
            if let Some(min) = want.min_current {
                ok &= check(
                    &format!("{key}.kept_memory"),
                    current >= min,
                    &format!("{detail}; must keep >= {min}"),
                );
            }
            if let Some(max) = want.max_current {
                ok &= check(
                    &format!("{key}.reclaimed"),
                    current <= max,
                    &format!("{detail}; may keep <= {max}"),
                );
            }
            if let Some(high) = &want.memory_high {
                let got = read_trim(&dir.join("memory.high"));
                ok &= check(
                    &format!("{key}.memory_high"),
                    got == *high,
                    &format!(
                        "memory.high {got} (want {high}), memory.max {}, memory.events high {}",
                        read_trim(&dir.join("memory.max")),
                        ev.get("high").copied().unwrap_or(0)
                    ),
                );
            }
            let swap = format!(
                "memory.swap.current {}, memory.swap.max {}, memory.pressure some avg10 {:?}, memory.events high {} max {}, memory.high {}",
                read_trim(&dir.join("memory.swap.current")),
                read_trim(&dir.join("memory.swap.max")),
                psi_some_avg10(&dir),
                ev.get("high").copied().unwrap_or(0),
                ev.get("max").copied().unwrap_or(0),
                read_trim(&dir.join("memory.high")),
            );
            if let Some(min) = want.min_swap_current {
                let got: u64 = read_trim(&dir.join("memory.swap.current"))
                    .parse()
                    .unwrap_or(0);
                ok &= check(
                    &format!("{key}.swapped"),
                    got >= min,
                    &format!("{swap}; must have >= {min} in swap"),
                );
            }
            if let Some(max) = want.max_psi_some_avg10 {
                let got = psi_some_avg10(&dir);
                ok &= check(
                    &format!("{key}.psi_low"),
                    got.is_some_and(|p| p <= max),
                    &format!("{swap}; some avg10 <= {max}"),
                );
            }
            if let Some(max) = want.max_low_events {
                ok &= check(
                    &format!("{key}.low_events"),
                    low <= max,
                    &format!("{detail}; low events <= {max}"),
                );
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_from_json() {
        let steps: Vec<Step> = serde_json::from_str(
            r#"[{"start": ["a/b"]}, {"sleep": 1.5},
                {"wait_exited": {"containers": ["a/b"], "timeout_s": 3, "exit_code": 137}},
                {"exit_order": [["a/b"], ["c/d"]]}, {"running": ["c/d"]},
                {"memory": {"c/d": {"min_current": 1}}}, "no_kernel_oom"]"#,
        )
        .unwrap();
        assert_eq!(steps.len(), 7);
        assert!(serde_json::from_str::<Vec<Step>>(r#"[{"sart": []}]"#).is_err());
    }
}
