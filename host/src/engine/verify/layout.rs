//! How the rows of a verify batch of several sequences go to llama.cpp: as they are, or padded
//! to one pass over the weights.
//!
//! llama.cpp decodes a batch over several KV streams in micro-batches that hold the same number
//! of rows of each of a run of consecutive sequences (`llama_batch_allocr::split_equal`): rows
//! `[1, 1, 9, 1]` of sequences 0-3 take two passes over the weights (4 rows, then 8), and
//! sequences 0 and 2 without 1 take two as well. Each pass reads every weight once: on a
//! memory-bound machine, where a pass costs about the same whatever its rows, two passes cost
//! twice one. Padding every sequence from the first to the last to the longest one's rows (the
//! extra rows get no logits and are rolled back) makes one pass, at the price of the padding's
//! arithmetic: on a compute-bound machine that loses. [`plan`] compares the two with the
//! measured cost of a batch of each size.

use serde::{Deserialize, Serialize};

/// Which layout verify batches use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum BatchLayout {
    /// The cheaper of the two by the measured verify costs, per batch.
    #[default]
    Auto,
    /// The rows as they are: as many passes as llama.cpp needs.
    Split,
    /// Every sequence from the first to the last verified padded to the longest one's rows:
    /// one pass.
    Padded,
}

/// One pass over the weights: `rows` rows of each of `sequences` consecutive sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Pass {
    /// Sequences in the pass.
    pub sequences: usize,
    /// Rows of each.
    pub rows: usize,
}

impl Pass {
    /// Rows of the pass, every sequence's.
    pub fn total(self) -> usize {
        self.sequences * self.rows
    }
}

/// The passes of llama.cpp's equal split of a batch whose sequence `s` has `rows[s]` rows (0:
/// not in the batch), in sequence order, with micro-batches of at most `max_pass_rows` rows:
/// as `llama_batch_allocr::split_equal(n_ubatch, sequential = true)` splits it.
pub(super) fn passes(rows: &[usize], max_pass_rows: usize) -> Vec<Pass> {
    let mut left = rows.to_vec();
    let mut passes = Vec::new();
    while let Some(first) = left.iter().position(|&n| n > 0) {
        let run = left[first..].iter().take_while(|&&n| n > 0).count();
        let per_sequence = left[first..first + run]
            .iter()
            .copied()
            .min()
            .unwrap_or(0)
            .min((max_pass_rows / run).max(1));
        for rows in &mut left[first..first + run] {
            *rows -= per_sequence;
        }
        passes.push(Pass {
            sequences: run,
            rows: per_sequence,
        });
    }
    passes
}

/// The sequences a padded batch covers and the rows each gets: from the first to the last
/// sequence with rows, all at the longest one's; `None` for an empty batch.
pub(super) fn padded(rows: &[usize]) -> Option<(std::ops::RangeInclusive<usize>, usize)> {
    let first = rows.iter().position(|&n| n > 0)?;
    let last = rows.iter().rposition(|&n| n > 0)?;
    let longest = rows.iter().copied().max()?;
    Some((first..=last, longest))
}

/// How a batch goes to llama.cpp, and what it costs.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan {
    /// Whether every sequence from the first to the last is padded to the longest one's rows.
    pub padded: bool,
    /// The passes over the weights it takes.
    pub passes: Vec<Pass>,
    /// The batch's cost by the `cost` of one pass it was planned with (NaN when unknown).
    pub cost: f64,
}

/// How to lay out a batch with `rows` per sequence, by `cost(pass)`, the time of one pass:
/// under [`BatchLayout::Auto`] padded when one padded pass costs less than the passes of the
/// split; never padded when the padded batch exceeds `max_pass_rows`.
pub(super) fn plan(
    layout: BatchLayout,
    rows: &[usize],
    max_pass_rows: usize,
    cost: impl Fn(Pass) -> f64,
) -> Plan {
    let split_passes = passes(rows, max_pass_rows);
    let split = Plan {
        padded: false,
        cost: split_passes.iter().map(|&pass| cost(pass)).sum(),
        passes: split_passes,
    };
    let Some(padded_pass) = padded(rows)
        .map(|(span, longest)| Pass {
            sequences: span.count(),
            rows: longest,
        })
        .filter(|pass| pass.total() <= max_pass_rows)
    else {
        return split;
    };
    let padded = Plan {
        padded: true,
        cost: cost(padded_pass),
        passes: vec![padded_pass],
    };
    match layout {
        BatchLayout::Split => split,
        BatchLayout::Padded => padded,
        BatchLayout::Auto if split.passes.len() > 1 && padded.cost < split.cost => padded,
        BatchLayout::Auto => split,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_follow_llama_cpps_equal_split() {
        let passes = |rows: &[usize], max| -> Vec<usize> {
            passes(rows, max).into_iter().map(Pass::total).collect()
        };
        assert_eq!(passes(&[1, 1, 1, 1], 512), [4], "equal rows: one pass");
        assert_eq!(
            passes(&[1, 1, 9, 1], 512),
            [4, 8],
            "a longer draft: a second pass"
        );
        assert_eq!(passes(&[3, 5], 512), [6, 2]);
        assert_eq!(passes(&[9, 0, 1], 512), [9, 1], "a gap in the sequences");
        assert_eq!(passes(&[0, 2, 2], 512), [4]);
        assert_eq!(passes(&[], 512), Vec::<usize>::new());
        assert_eq!(
            passes(&[10, 10], 8),
            [8, 8, 4],
            "micro-batches of at most 8 rows"
        );
        assert_eq!(
            super::passes(&[1, 1, 9, 1], 512),
            [
                Pass {
                    sequences: 4,
                    rows: 1
                },
                Pass {
                    sequences: 1,
                    rows: 8
                }
            ]
        );
    }

    #[test]
    fn padding_covers_the_first_to_the_last_sequence_at_the_longest_rows() {
        assert_eq!(padded(&[0, 1, 0, 9, 0]), Some((1..=3, 9)));
        assert_eq!(padded(&[0, 0]), None);
    }

    #[test]
    fn auto_pads_where_a_pass_costs_about_the_same_whatever_its_rows() {
        let rows = [1, 1, 9, 1];
        // Memory-bound: a pass costs 1 plus 0.02 per row.
        let memory_bound = |pass: Pass| 1.0 + 0.02 * pass.total() as f64;
        let padded = |layout, rows: &[usize], max, cost: &dyn Fn(Pass) -> f64| {
            plan(layout, rows, max, cost).padded
        };
        assert!(padded(BatchLayout::Auto, &rows, 512, &memory_bound));
        // Compute-bound: 0.73 per pass plus 0.27 per row (SmolLM2 Q8_0 on 2 cores).
        let compute_bound = |pass: Pass| 0.73 + 0.27 * pass.total() as f64;
        assert!(!padded(BatchLayout::Auto, &rows, 512, &compute_bound));
        assert!(
            !padded(BatchLayout::Auto, &[2, 2, 2], 512, &memory_bound),
            "one pass already"
        );
        assert!(padded(BatchLayout::Padded, &rows, 512, &compute_bound));
        assert!(!padded(BatchLayout::Split, &rows, 512, &memory_bound));
        assert!(
            !padded(BatchLayout::Padded, &rows, 30, &memory_bound),
            "36 padded rows exceed a batch of 30"
        );
    }

    #[test]
    fn a_plan_costs_its_passes() {
        let compute_bound = |pass: Pass| 0.73 + 0.27 * pass.total() as f64;
        let split = plan(BatchLayout::Auto, &[1, 1, 9, 1], 512, compute_bound);
        assert!(!split.padded);
        assert_eq!(split.passes.len(), 2);
        let passes = 0.73 + 0.27 * 4.0 + 0.73 + 0.27 * 8.0;
        assert!((split.cost - passes).abs() < 1e-12, "{split:?}");
        let memory_bound = |pass: Pass| 1.0 + 0.02 * pass.total() as f64;
        let padded = plan(BatchLayout::Auto, &[1, 1, 9, 1], 512, memory_bound);
        assert!(padded.padded);
        assert_eq!(
            padded.passes,
            [Pass {
                sequences: 4,
                rows: 9
            }]
        );
        assert!(
            (padded.cost - (1.0 + 0.02 * 36.0)).abs() < 1e-12,
            "{padded:?}"
        );
        assert!(
            plan(BatchLayout::Auto, &[2, 2], 512, |_| f64::NAN)
                .cost
                .is_nan()
        );
    }
}
