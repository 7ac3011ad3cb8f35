//! The single-stream comparison: the one-client level's requests decoded through the engine as
//! `spechost bench` decodes them ([`measure_workloads`](super::super::runner::measure_workloads)),
//! half of the passes before the server's one-client level and the rest right after it (the
//! server is started again for more clients), so that `run` and one-client `serve` are measured
//! side by side on the same requests in one process, and a shared machine's drift during those
//! minutes weighs on both.

use std::collections::{BTreeMap, HashMap};

use super::super::runner::Measurements;
use super::super::workload::Workload;
use super::plan::client_share;

/// The requests a one-client level sends: how many times each, by its index in the workloads'
/// requests (in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneClientShare {
    sends: BTreeMap<usize, usize>,
}

impl OneClientShare {
    /// The share of one client sending `requests_per_client` of `total` requests, cycling.
    pub fn new(total: usize, requests_per_client: usize) -> Self {
        let mut sends = BTreeMap::new();
        if total > 0 {
            for index in client_share(0, 1, requests_per_client) {
                *sends.entry(index % total).or_insert(0) += 1;
            }
        }
        Self { sends }
    }

    /// `workloads` with only the requests of this share, in file order; workloads left empty
    /// are dropped.
    pub fn workloads(&self, workloads: &[Workload]) -> Vec<Workload> {
        let mut index = 0;
        let mut kept = Vec::new();
        for workload in workloads {
            let mut requests = Vec::new();
            for request in &workload.requests {
                if self.sends.contains_key(&index) {
                    requests.push(request.clone());
                }
                index += 1;
            }
            if !requests.is_empty() {
                kept.push(Workload {
                    requests,
                    ..workload.clone()
                });
            }
        }
        kept
    }

    /// Generation tok/s of each configuration in `measurements`, in order: tokens after each
    /// request's first over the time after it, over every measured pass, each request weighted
    /// by how many times the one-client level sends it.
    pub fn run_rates(
        &self,
        workloads: &[Workload],
        measurements: &Measurements,
    ) -> Vec<(String, f64)> {
        let indices: HashMap<(&str, &str), usize> = workloads
            .iter()
            .flat_map(|w| {
                w.requests
                    .iter()
                    .map(move |r| (w.name.as_str(), r.id.as_str()))
            })
            .enumerate()
            .map(|(index, key)| (key, index))
            .collect();
        measurements
            .configurations
            .iter()
            .map(|configuration| {
                let label = configuration.label();
                let (mut tokens, mut seconds) = (0.0, 0.0);
                for row in measurements
                    .requests
                    .iter()
                    .filter(|r| r.configuration == label)
                {
                    let sends = indices
                        .get(&(row.workload.as_str(), row.request.as_str()))
                        .and_then(|index| self.sends.get(index))
                        .copied()
                        .unwrap_or(0) as f64;
                    tokens += sends * row.generated_tokens.saturating_sub(1) as f64;
                    seconds += sends * row.generation_time.as_secs_f64();
                }
                let rate = if seconds > 0.0 { tokens / seconds } else { 0.0 };
                (label, rate)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench::runner::{Configuration, RequestRow};
    use crate::config::PromptStyle;

    fn workloads() -> Vec<Workload> {
        let first = Workload::parse(
            "w/a.jsonl".as_ref(),
            "{\"id\": \"a1\", \"prompt\": \"x\"}\n{\"id\": \"a2\", \"prompt\": \"y\"}\n",
        )
        .expect("valid");
        let second = Workload::parse(
            "w/b.jsonl".as_ref(),
            "{\"id\": \"b1\", \"prompt\": \"z\"}\n",
        )
        .expect("valid");
        vec![first, second]
    }

    #[test]
    fn one_client_cycles_through_the_requests_and_keeps_file_order() {
        let share = OneClientShare::new(3, 4);
        let kept = share.workloads(&workloads());
        let ids: Vec<Vec<&str>> = kept
            .iter()
            .map(|w| w.requests.iter().map(|r| r.id.as_str()).collect())
            .collect();
        assert_eq!(ids, [vec!["a1", "a2"], vec!["b1"]]);
        let short = OneClientShare::new(3, 1).workloads(&workloads());
        assert_eq!(short.len(), 1, "b is dropped: {short:?}");
        assert_eq!(short[0].requests.len(), 1);
    }

    #[test]
    fn run_rates_weigh_each_request_by_how_often_one_client_sends_it() {
        let row = |request: &str, tokens: usize, millis: u64| RequestRow {
            workload: if request == "b1" { "b" } else { "a" }.into(),
            configuration: "plain".into(),
            pass: 1,
            request: request.into(),
            degeneracy: None,
            generated_tokens: tokens,
            generation_time: Duration::from_millis(millis),
            rounds: 0,
            drafted: 0,
            accepted: 0,
        };
        let measurements = Measurements {
            configurations: vec![Configuration::plain()],
            workloads: Vec::new(),
            mismatches: Vec::new(),
            drawn_requests: 0,
            // a1 is sent twice in four requests, a2 and b1 once.
            requests: vec![row("a1", 11, 100), row("a2", 21, 400), row("b1", 1, 0)],
            prompt_style: PromptStyle::Raw,
            threads: 1,
            ctx_size: 1024,
        };
        let rates = OneClientShare::new(3, 4).run_rates(&workloads(), &measurements);
        assert_eq!(rates.len(), 1);
        let (label, rate) = &rates[0];
        assert_eq!(label, "plain");
        assert!(
            (rate - 40.0 / 0.6).abs() < 1e-9,
            "2×10 + 20 tokens over 2×0.1 + 0.4 s: seen {rate}"
        );
    }
}
