//! The levels: every row at every client count, driven over HTTP, with the identity check.
//!
//! In order, for each client count `C` (ascending), `passes` times over, each row (plain
//! decoding first), so that the rows compared at one count are measured within a minute or two
//! of each other and a slow phase of a shared machine (it drifts by more than the differences
//! measured, over the half hour a whole run takes) lands on every row alike: one warm-up
//! request, unmeasured; then `C` closed-loop clients, each sending its share of the level's
//! requests ([`client_share`]) one after the other; and every answer's text compared with the
//! reference. A level's figures are over its passes ([`figures`]: tok/s the median pass). The
//! reference is the request's answer in the first pass of the plain row at the fewest clients
//! that sent it (plain decoding at one client, for every request a one-client level sends).
//! Greedy decoding must give the same text at any concurrency, in any pass and with any
//! cascade.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::client::{Streamed, send};
use super::figures::{LevelFigures, Pass, figures};
use super::plan::{PlannedRequest, Row, client_share};

/// The longest a request may take before the benchmark gives up on the server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// How the levels are made up.
#[derive(Debug, Clone, Copy)]
pub struct Levels<'a> {
    /// The workloads' requests, in order (cycled through by each level).
    pub requests: &'a [PlannedRequest],
    /// The rows, plain decoding first.
    pub rows: &'a [Row],
    /// Client counts, ascending.
    pub client_counts: &'a [usize],
    /// Requests each client sends per level.
    pub requests_per_client: usize,
    /// Measured passes of each row at each client count, the rows alternating pass by pass.
    pub passes: usize,
}

/// One level measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Level {
    /// The row's label.
    pub configuration: String,
    /// Concurrent clients.
    pub clients: usize,
    /// What it measured.
    pub figures: LevelFigures,
    /// Whether every answer equalled its reference.
    pub identical: bool,
}

/// An answer whose text differs from the request's reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// The row's label.
    pub configuration: String,
    /// Concurrent clients of the level.
    pub clients: usize,
    /// The level's pass, from 1.
    pub pass: usize,
    /// The workload's name.
    pub workload: String,
    /// The request's id.
    pub request: String,
    /// Index of the first differing character.
    pub first_difference: usize,
    /// Characters of the reference.
    pub expected_chars: usize,
    /// Characters of this answer.
    pub generated_chars: usize,
}

/// The reference text of one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reference {
    /// The workload's name.
    pub workload: String,
    /// The request's id.
    pub request: String,
    /// Its text under the plain row at the fewest clients that sent it.
    pub text: String,
}

/// Every level, every answer that differed from its reference, and the references.
#[derive(Debug, Clone, Default)]
pub struct Driven {
    /// Row by row, client count by client count.
    pub levels: Vec<Level>,
    /// The differing answers, in the order found.
    pub differences: Vec<Difference>,
    /// Every request's reference, in the workloads' order: what runs of other servers (or of
    /// the same one restarted with more slots) are compared with.
    pub references: Vec<Reference>,
}

/// Drives the server at `authority` (`HOST:PORT`) through every level, on a tokio runtime of
/// this thread. Answers are checked against `earlier` references too (an earlier [`Driven`]'s,
/// of the same requests), besides those its own plain rows give.
pub fn drive(authority: &str, levels: Levels<'_>, earlier: &[Reference]) -> anyhow::Result<Driven> {
    anyhow::ensure!(
        !levels.requests.is_empty(),
        "the workloads have no requests"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the clients' async runtime")?;
    runtime.block_on(drive_levels(authority, levels, earlier))
}

async fn drive_levels(
    authority: &str,
    levels: Levels<'_>,
    earlier: &[Reference],
) -> anyhow::Result<Driven> {
    let mut driven = Driven::default();
    let mut references = References::new(levels.requests, earlier);
    for &clients in levels.client_counts {
        let mut passes: Vec<Vec<Pass>> = vec![Vec::new(); levels.rows.len()];
        let mut identical = vec![true; levels.rows.len()];
        for pass_index in 0..levels.passes {
            for (row_index, row) in levels.rows.iter().enumerate() {
                let (pass, differences) = measure_pass(
                    authority,
                    levels,
                    row,
                    clients,
                    pass_index + 1,
                    &mut references,
                )
                .await
                .with_context(|| {
                    format!(
                        "{} at {clients} clients, pass {} of {}",
                        row.label,
                        pass_index + 1,
                        levels.passes
                    )
                })?;
                eprintln!(
                    "serve · {} · {clients} client(s) · pass {}/{}: {:.1} tok/s over {} requests{}",
                    row.label,
                    pass_index + 1,
                    levels.passes,
                    pass.tokens_per_second(),
                    pass.answers.len(),
                    if differences.is_empty() {
                        ""
                    } else {
                        ", OUTPUT DIFFERS"
                    }
                );
                identical[row_index] &= differences.is_empty();
                driven.differences.extend(differences);
                passes[row_index].push(pass);
            }
        }
        for ((row, passes), identical) in levels.rows.iter().zip(&passes).zip(identical) {
            driven.levels.push(Level {
                configuration: row.label.clone(),
                clients,
                figures: figures(passes),
                identical,
            });
        }
    }
    driven.sort_levels(levels.rows);
    driven.references = references.into_list();
    Ok(driven)
}

impl Driven {
    /// Adds the levels and differences of `later`, driven after these (checked against these
    /// references), and takes its references, which hold these.
    pub fn extend(&mut self, later: Driven, rows: &[Row]) {
        self.levels.extend(later.levels);
        self.differences.extend(later.differences);
        self.references = later.references;
        self.sort_levels(rows);
    }

    /// Row by row, as `rows` lists them; each row's levels by client count.
    fn sort_levels(&mut self, rows: &[Row]) {
        self.levels.sort_by_key(|level| {
            let row = rows.iter().position(|row| row.label == level.configuration);
            (row, level.clients)
        });
    }
}

/// Pass `pass` (from 1) of `row` at `clients` clients: a warm-up request, unmeasured, then
/// every client's share of the level's requests; its answers checked against their references.
async fn measure_pass(
    authority: &str,
    levels: Levels<'_>,
    row: &Row,
    clients: usize,
    pass: usize,
    references: &mut References<'_>,
) -> anyhow::Result<(Pass, Vec<Difference>)> {
    timed_send(authority, &levels.requests[0], row)
        .await
        .context("warming up")?;
    let started = Instant::now();
    let shares = (0..clients).map(|client| {
        let share: Vec<usize> = client_share(client, clients, levels.requests_per_client).collect();
        client_loop(authority, levels.requests, row, share)
    });
    let mut answers: Vec<(usize, Streamed)> = futures_util::future::try_join_all(shares)
        .await?
        .into_iter()
        .flatten()
        .collect();
    let wall_time = started.elapsed();
    answers.sort_by_key(|(index, _)| *index);
    let differences = references.check(row, clients, pass, &answers);
    let answers = answers.into_iter().map(|(_, answer)| answer).collect();
    Ok((Pass { answers, wall_time }, differences))
}

/// Every request's reference text, by its index in the workloads' requests.
struct References<'a> {
    requests: &'a [PlannedRequest],
    texts: BTreeMap<usize, String>,
}

impl<'a> References<'a> {
    /// The references of `requests` found in `earlier` (by workload and request id).
    fn new(requests: &'a [PlannedRequest], earlier: &[Reference]) -> Self {
        let texts = requests
            .iter()
            .enumerate()
            .filter_map(|(index, request)| {
                earlier
                    .iter()
                    .find(|r| r.workload == request.workload && r.request == request.id)
                    .map(|r| (index, r.text.clone()))
            })
            .collect();
        Self { requests, texts }
    }

    /// Compares the `answers` of a pass (by their index in the level, in order) at `clients`
    /// clients with their references; a plain row's answer becomes the reference of a request
    /// that has none yet.
    fn check(
        &mut self,
        row: &Row,
        clients: usize,
        pass: usize,
        answers: &[(usize, Streamed)],
    ) -> Vec<Difference> {
        let mut differences = Vec::new();
        for (index, answer) in answers {
            let request_index = index % self.requests.len();
            let request = &self.requests[request_index];
            match self.texts.get(&request_index) {
                Some(expected) => {
                    if let Some(first_difference) = first_difference(expected, &answer.text) {
                        differences.push(Difference {
                            configuration: row.label.clone(),
                            clients,
                            pass,
                            workload: request.workload.clone(),
                            request: request.id.clone(),
                            first_difference,
                            expected_chars: expected.chars().count(),
                            generated_chars: answer.text.chars().count(),
                        });
                    }
                }
                None if row.plain => {
                    self.texts.insert(request_index, answer.text.clone());
                }
                None => {}
            }
        }
        differences
    }

    /// The references, in the workloads' order.
    fn into_list(self) -> Vec<Reference> {
        self.texts
            .into_iter()
            .map(|(index, text)| Reference {
                workload: self.requests[index].workload.clone(),
                request: self.requests[index].id.clone(),
                text,
            })
            .collect()
    }
}

/// One client: sends the level's requests `share` (indices into the cycled requests) in
/// order, each once the previous answer ended.
async fn client_loop(
    authority: &str,
    requests: &[PlannedRequest],
    row: &Row,
    share: Vec<usize>,
) -> anyhow::Result<Vec<(usize, Streamed)>> {
    let mut answers = Vec::with_capacity(share.len());
    for index in share {
        let request = &requests[index % requests.len()];
        answers.push((index, timed_send(authority, request, row).await?));
    }
    Ok(answers)
}

/// Sends `request` as `row` says, within [`REQUEST_TIMEOUT`].
async fn timed_send(
    authority: &str,
    request: &PlannedRequest,
    row: &Row,
) -> anyhow::Result<Streamed> {
    let body = request.body_for(row);
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        send(authority, request.endpoint.path(), &body),
    )
    .await
    .with_context(|| {
        format!(
            "request `{}` of workload `{}` got no complete answer within {} s",
            request.id,
            request.workload,
            REQUEST_TIMEOUT.as_secs()
        )
    })?
    .with_context(|| {
        format!(
            "request `{}` of workload `{}`",
            request.id, request.workload
        )
    })
}

/// Index of the first differing character, or `None` when the texts are equal.
fn first_difference(expected: &str, got: &str) -> Option<usize> {
    let mut expected_chars = expected.chars();
    let mut got_chars = got.chars();
    let mut index = 0;
    loop {
        match (expected_chars.next(), got_chars.next()) {
            (None, None) => return None,
            (Some(a), Some(b)) if a == b => index += 1,
            _ => return Some(index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Streamed {
        Streamed {
            text: text.into(),
            completion_tokens: 1,
            time_to_first_token: None,
            generation_time: Duration::ZERO,
        }
    }

    /// Requests `a` and `b` of workload `w`.
    fn requests_a_and_b() -> Vec<PlannedRequest> {
        ["a", "b"]
            .iter()
            .map(|id| PlannedRequest {
                workload: "w".into(),
                id: (*id).into(),
                endpoint: super::super::plan::Endpoint::Chat,
                body: serde_json::json!({}),
            })
            .collect()
    }

    #[test]
    fn plain_answers_become_references_and_later_answers_are_checked_against_them() {
        let requests = requests_a_and_b();
        let plain = Row::running("plain");
        let lookup = Row {
            label: "lookup".into(),
            speculative: None,
            plain: false,
        };
        let mut references = References::new(&requests, &[]);
        let first = references.check(&plain, 1, 1, &[(0, answer("one")), (2, answer("one"))]);
        assert!(
            first.is_empty(),
            "a repeat of `a` in the level matches: {first:?}"
        );
        let later = references.check(&lookup, 2, 1, &[(1, answer("two")), (2, answer("onf"))]);
        assert_eq!(
            later.len(),
            1,
            "`a` differs, `b` has no reference: {later:?}"
        );
        assert_eq!(
            (later[0].request.as_str(), later[0].first_difference),
            ("a", 2)
        );
        let list = references.into_list();
        assert_eq!(list.len(), 1, "only plain rows make references: {list:?}");
        assert_eq!(
            (list[0].request.as_str(), list[0].text.as_str()),
            ("a", "one")
        );
    }

    #[test]
    fn a_second_drive_checks_answers_against_the_first_drives_references() {
        let requests = requests_a_and_b();
        let earlier = [Reference {
            workload: "w".into(),
            request: "b".into(),
            text: "two".into(),
        }];
        let mut references = References::new(&requests, &earlier);
        let plain = Row::running("plain");
        let differences = references.check(&plain, 2, 1, &[(0, answer("one")), (1, answer("tw"))]);
        assert_eq!(
            differences.len(),
            1,
            "plain at more clients is checked against the earlier reference of `b`: {differences:?}"
        );
        assert_eq!(differences[0].request, "b");
        let list = references.into_list();
        let texts: Vec<(&str, &str)> = list
            .iter()
            .map(|r| (r.request.as_str(), r.text.as_str()))
            .collect();
        assert_eq!(
            texts,
            [("a", "one"), ("b", "two")],
            "the earlier reference is kept"
        );
    }

    #[test]
    fn extended_levels_are_listed_row_by_row_by_client_count() {
        let level = |configuration: &str, clients| Level {
            configuration: configuration.into(),
            clients,
            figures: figures(&[]),
            identical: true,
        };
        let rows = [Row::running("plain"), Row::running("lookup")];
        let mut first = Driven {
            levels: vec![level("plain", 1), level("lookup", 1)],
            ..Driven::default()
        };
        let later = Driven {
            levels: vec![
                level("plain", 2),
                level("plain", 4),
                level("lookup", 2),
                level("lookup", 4),
            ],
            ..Driven::default()
        };
        first.extend(later, &rows);
        let order: Vec<(&str, usize)> = first
            .levels
            .iter()
            .map(|l| (l.configuration.as_str(), l.clients))
            .collect();
        assert_eq!(
            order,
            [
                ("plain", 1),
                ("plain", 2),
                ("plain", 4),
                ("lookup", 1),
                ("lookup", 2),
                ("lookup", 4)
            ]
        );
    }

    #[test]
    fn first_difference_counts_characters_and_sees_truncation() {
        assert_eq!(first_difference("héllo", "héllo"), None);
        assert_eq!(first_difference("héllo", "hélp"), Some(3));
        assert_eq!(first_difference("héllo", "hé"), Some(2));
        assert_eq!(first_difference("", "x"), Some(0));
    }
}
