//! Time per guest call, as the checks measure it: the CPU time of the host's whole call
//! (sandbox entry, the guest's work, checking the result), per function of the WIT. CPU time is
//! what the sandbox's deadline counts, and it does not change with what else the machine runs.

use std::collections::BTreeMap;

use serde::Serialize;

use super::format_us;
use crate::placement::thread_cpu_time;

/// The times of one guest function's calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallTimes {
    /// The function, as in the WIT (`propose`, `feed`, ...).
    pub method: &'static str,
    /// Calls timed.
    pub calls: usize,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest, µs.
    pub max_us: f64,
}

impl CallTimes {
    /// The figures of `samples` (ns, any order).
    pub fn from_samples(method: &'static str, mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        let at = |quantile: f64| {
            let last = samples.len().saturating_sub(1);
            let index = ((last as f64) * quantile).round() as usize;
            samples.get(index).map_or(0.0, |&ns| ns as f64 / 1e3)
        };
        Self {
            method,
            calls: samples.len(),
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
        }
    }

    /// `propose ×612 p50 12 µs, p99 40 µs, max 1.2 ms`.
    pub fn summary(&self) -> String {
        format!(
            "{} ×{} p50 {}, p99 {}, max {}",
            self.method,
            self.calls,
            format_us(self.p50_us),
            format_us(self.p99_us),
            format_us(self.max_us)
        )
    }
}

/// Collects call times by function.
#[derive(Debug, Default)]
pub struct CallLog {
    samples: BTreeMap<&'static str, Vec<u64>>,
}

impl CallLog {
    /// Runs `call`, recording its CPU time under `method`.
    pub fn time<T>(&mut self, method: &'static str, call: impl FnOnce() -> T) -> T {
        let started = thread_cpu_time();
        let result = call();
        let spent = thread_cpu_time().saturating_sub(started);
        let ns = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.samples.entry(method).or_default().push(ns);
        result
    }

    /// The figures, one entry per function in `order` that was called.
    pub fn figures(self, order: &[&'static str]) -> Vec<CallTimes> {
        let mut samples = self.samples;
        order
            .iter()
            .filter_map(|method| {
                let times = samples.remove(method)?;
                Some(CallTimes::from_samples(method, times))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_sample() {
        let times = CallTimes::from_samples("feed", (1..=100).rev().map(|us| us * 1000).collect());
        assert_eq!(times.calls, 100);
        assert_eq!(times.p50_us, 51.0);
        assert_eq!(times.p99_us, 99.0);
        assert_eq!(times.max_us, 100.0);
        assert_eq!(CallTimes::from_samples("feed", Vec::new()).max_us, 0.0);
    }

    #[test]
    fn the_log_reports_called_functions_in_order() {
        let mut log = CallLog::default();
        assert_eq!(log.time("propose", || 7), 7);
        log.time("feed", || ());
        log.time("feed", || ());
        let figures = log.figures(&["open", "feed", "propose"]);
        let methods: Vec<_> = figures.iter().map(|f| (f.method, f.calls)).collect();
        assert_eq!(methods, [("feed", 2), ("propose", 1)]);
    }
}
