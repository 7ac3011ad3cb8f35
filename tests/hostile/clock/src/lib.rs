//! Hostile drafter: reads WASI's monotonic and wall clocks in a tight loop in `propose`, each
//! read a host call, so the loop spends most of its time in the host rather than in guest code.
//!
//! Without config it reads forever: only the call deadline can stop it. With `reads=N` it stops
//! after `N` reads of each clock and proposes nothing, a plugin that is merely clock-hungry and
//! must not be faulted for it when it returns in time.

use std::hint::black_box;
use std::time::{Instant, SystemTime};

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Reads both clocks `reads` times per `propose` (`None`: forever).
pub struct ClockLoop {
    reads: Option<u64>,
}

impl Drafter for ClockLoop {
    fn new(config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        let reads = match config.trim() {
            "" => None,
            setting => {
                let value = setting.strip_prefix("reads=").ok_or_else(|| {
                    format!("unknown setting `{setting}`; the only one is reads=N")
                })?;
                let reads = value
                    .parse()
                    .map_err(|e| format!("reads=`{value}` is not a count: {e}"))?;
                Some(reads)
            }
        };
        Ok(Self { reads })
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        let mut done: u64 = 0;
        while self.reads.is_none_or(|reads| done < reads) {
            // `black_box` keeps both host calls in the loop.
            black_box(Instant::now());
            black_box(SystemTime::now());
            done += 1;
        }
        Proposal::empty()
    }
}

export_drafter!(ClockLoop);
