//! Per-source counters, kept by the cascade and printed once at the end of a request.

use std::time::Duration;

use serde::Serialize;

/// What one source of a cascade did during a request.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SourceStats {
    /// The source's name.
    pub name: String,
    /// Rounds in which the source was asked to propose.
    pub asked: u64,
    /// Rounds in which it proposed at least one token.
    pub proposed: u64,
    /// Rounds its proposal won (was verified by the target).
    pub won: u64,
    /// Tokens of its winning proposals that were verified.
    pub drafted: u64,
    /// Tokens of its winning proposals the target accepted.
    pub accepted: u64,
    /// `accepted_by_position[i]`: winning rounds in which draft position `i` was accepted.
    pub accepted_by_position: Vec<u64>,
    /// Calls that faulted (trap, time-out, invalid proposal).
    pub faults: u64,
    /// Shadow proposals it made (unverified, while the policy had speculation off).
    pub shadow_proposed: u64,
    /// Tokens of its settled shadow proposals.
    pub shadow_drafted: u64,
    /// Leading tokens of its settled shadow proposals that matched the target.
    pub shadow_matched: u64,
    /// Time spent in the source's `propose`, `feedback` and `feed`.
    #[serde(serialize_with = "serialize_micros")]
    pub time: Duration,
}

impl SourceStats {
    /// Empty counters for a source called `name`.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Accepted over drafted tokens, in [0, 1]; 0 when nothing was drafted.
    pub fn acceptance(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Adds `other`'s counters to these (same source, another request).
    pub fn add(&mut self, other: &SourceStats) {
        debug_assert_eq!(self.name, other.name, "adding counters of another source");
        self.asked += other.asked;
        self.proposed += other.proposed;
        self.won += other.won;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.faults += other.faults;
        self.shadow_proposed += other.shadow_proposed;
        self.shadow_drafted += other.shadow_drafted;
        self.shadow_matched += other.shadow_matched;
        self.time += other.time;
        if self.accepted_by_position.len() < other.accepted_by_position.len() {
            self.accepted_by_position
                .resize(other.accepted_by_position.len(), 0);
        }
        for (sum, count) in self
            .accepted_by_position
            .iter_mut()
            .zip(&other.accepted_by_position)
        {
            *sum += count;
        }
    }

    /// Records a verified proposal of `drafted` tokens of which the first `accepted` matched.
    pub(super) fn record_win(&mut self, drafted: usize, accepted: usize) {
        self.won += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        if self.accepted_by_position.len() < accepted {
            self.accepted_by_position.resize(accepted, 0);
        }
        for count in &mut self.accepted_by_position[..accepted] {
            *count += 1;
        }
    }
}

/// `part / whole`, or 0 for an empty whole.
pub(crate) fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn serialize_micros<S: serde::Serializer>(time: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(time.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_accepted_positions_of_each_win() {
        let mut stats = SourceStats::named("lookup");
        stats.record_win(4, 2);
        stats.record_win(4, 3);
        stats.record_win(2, 0);
        assert_eq!(stats.accepted_by_position, vec![2, 2, 1], "seen {stats:?}");
        assert_eq!((stats.won, stats.drafted, stats.accepted), (3, 10, 5));
        assert!((stats.acceptance() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn adding_requests_sums_counters_and_positions() {
        let mut total = SourceStats::named("lookup");
        total.record_win(4, 1);
        let mut other = SourceStats::named("lookup");
        other.record_win(4, 3);
        other.faults = 2;
        total.add(&other);
        assert_eq!(total.accepted_by_position, vec![2, 1, 1], "seen {total:?}");
        assert_eq!(
            (total.won, total.drafted, total.accepted, total.faults),
            (2, 8, 4, 2)
        );
    }
}
