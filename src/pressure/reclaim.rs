//! Acting in the soft band: `memory.reclaim` of the top-ranked pods (asking
//! only for what they can give) and, when configured, a lower memory.high
//! for BestEffort pods until the pressure episode ends.

use std::io;
use std::path::Path;
use std::time::Instant;

use super::measure;
use super::{Monitor, StepReport};
use crate::evict::rank::{Candidate, Ranking};
use crate::node::cgroupfs::{self as stat, write_file, WriteError};
use crate::node::time;
use crate::node::QosClass;

/// Below this a pod is not worth a memory.reclaim write.
const MIN_RECLAIM: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimOutcome {
    Done,
    /// -EAGAIN: the kernel reclaimed less than asked. Normal.
    Partial,
    /// No memory.reclaim (kernel < 5.19).
    Unsupported,
}

/// Asks the kernel to reclaim `bytes` from the cgroup at `cg`.
pub fn reclaim(cg: &Path, bytes: u64) -> Result<ReclaimOutcome, WriteError> {
    match write_file(&cg.join("memory.reclaim"), &bytes.to_string()) {
        Ok(()) => Ok(ReclaimOutcome::Done),
        Err(WriteError::Write { source, .. }) if source.raw_os_error() == Some(libc::EAGAIN) => {
            Ok(ReclaimOutcome::Partial)
        }
        Err(WriteError::Write { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(ReclaimOutcome::Unsupported)
        }
        Err(e) => Err(e),
    }
}

impl Monitor {
    pub(super) fn reclaim_top(
        &self,
        deficit: u64,
        cands: &[Candidate],
        ranking: &Ranking,
        report: &mut StepReport,
    ) {
        if !self.cfg.reclaim || ranking.order.is_empty() {
            return;
        }
        let top: Vec<&Candidate> = ranking
            .order
            .iter()
            .take(self.cfg.reclaim_top_n.max(1))
            .map(|&i| &cands[i])
            .collect();
        let each = deficit.div_ceil(top.len() as u64).max(4096);
        let swap = measure::swap_free(&self.paths);
        for c in top {
            let can = measure::reclaimable(&c.path, swap);
            let bytes = each.min(can);
            if bytes < MIN_RECLAIM {
                tracing::debug!(pod = %c.uid, reclaimable = can, swap_free = swap, "nothing to reclaim from this pod");
                continue;
            }
            report.reclaimed.push(c.uid.clone());
            if self.cfg.dry_run {
                tracing::info!(pod = %c.uid, bytes, "dry-run: would write memory.reclaim");
                continue;
            }
            let t = Instant::now();
            match reclaim(&c.path, bytes) {
                Ok(outcome) => {
                    tracing::info!(pod = %c.uid, bytes, reclaimable = can, ?outcome, took_us = time::micros(t.elapsed()), "memory.reclaim")
                }
                Err(e) => tracing::warn!(pod = %c.uid, error = %e, "memory.reclaim failed"),
            }
        }
    }

    pub(super) fn lower_besteffort_high(&mut self, cands: &[Candidate], ranking: &Ranking) {
        let factor = self.cfg.besteffort_memory_high_factor;
        if factor <= 0.0 {
            return;
        }
        for &i in ranking.order.iter().take(self.cfg.reclaim_top_n.max(1)) {
            let c = &cands[i];
            if c.class != QosClass::BestEffort || self.lowered_high.contains_key(&c.path) {
                continue;
            }
            // factor is validated to [0, 1): the product is finite, non-negative, at most working_set.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let high = ((c.working_set as f64 * factor) as u64 / 4096 * 4096).max(4096);
            let path = c.path.join("memory.high");
            let original = stat::read(&path)
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "max".into());
            if self.cfg.dry_run {
                tracing::info!(pod = %c.uid, high, "dry-run: would lower memory.high");
                continue;
            }
            match stat::write_file(&path, &high.to_string()) {
                Ok(()) => {
                    tracing::info!(pod = %c.uid, high, original = %original, "lowered memory.high until pressure ends");
                    self.lowered_high.insert(c.path.clone(), original);
                }
                Err(e) => tracing::warn!(pod = %c.uid, error = %e, "cannot lower memory.high"),
            }
        }
    }

    pub(super) fn restore_high(&mut self) {
        for (cg, original) in self.lowered_high.drain() {
            if let Err(e) = stat::write_file(&cg.join("memory.high"), &original) {
                tracing::debug!(error = %e, "cannot restore memory.high (pod gone?)");
            } else {
                tracing::info!(path = %cg.display(), high = %original, "restored memory.high");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn pressure_reclaim_outcomes() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            reclaim(d.path(), 4096).unwrap(),
            ReclaimOutcome::Unsupported
        );
        fs::write(d.path().join("memory.reclaim"), "").unwrap();
        assert_eq!(reclaim(d.path(), 4096).unwrap(), ReclaimOutcome::Done);
        assert_eq!(
            fs::read_to_string(d.path().join("memory.reclaim")).unwrap(),
            "4096"
        );
    }
}
