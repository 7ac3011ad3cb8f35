//! How the cascade chooses among its sources' proposals ([`CascadeMode`]) and the settings that
//! tune the choice.

/// Default minimum proposal length for a source to win a round.
pub const DEFAULT_MIN_LEN: usize = 1;
/// Default expected accepted length under which the scored mode also asks expensive sources.
pub const DEFAULT_EXPENSIVE_THRESHOLD: f64 = 2.0;
/// Longest shadow proposal asked for, whatever the policy says.
pub const MAX_SHADOW_LEN: usize = 32;

/// How the cascade chooses among its sources' proposals.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum CascadeMode {
    /// The first source (in order) with a long enough proposal wins.
    #[default]
    First,
    /// The proposal with the highest expected accepted length wins.
    Scored,
    /// As `scored`, and the other sources' proposals join the winner's as further paths of a
    /// tree, verified in the same batch, keeping the tokens likeliest to be accepted within
    /// the draft length (a verifier that takes only chains gets the winner's).
    Tree,
}

impl CascadeMode {
    /// `first`, `scored` or `tree`.
    pub fn as_str(self) -> &'static str {
        match self {
            CascadeMode::First => "first",
            CascadeMode::Scored => "scored",
            CascadeMode::Tree => "tree",
        }
    }
}

impl std::str::FromStr for CascadeMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "first" => Ok(CascadeMode::First),
            "scored" => Ok(CascadeMode::Scored),
            "tree" => Ok(CascadeMode::Tree),
            other => Err(format!(
                "unknown cascade mode `{other}`; use `first` (ordered, the default), `scored` or `tree`"
            )),
        }
    }
}

/// How the cascade chooses among its sources.
#[derive(Debug, Clone, PartialEq)]
pub struct CascadeSettings {
    /// A source wins only with a proposal of at least this many tokens.
    pub min_len: usize,
    /// How the winner is chosen.
    pub mode: CascadeMode,
    /// Scored mode: expensive sources are asked when the best cheap proposal is expected to
    /// accept fewer tokens than this.
    pub expensive_threshold: f64,
    /// Whether a request with a grammar also drafts with the host's grammar source (what the
    /// grammar makes certain or likely), asked before the cascade's own sources.
    pub grammar_drafts: bool,
}

impl Default for CascadeSettings {
    fn default() -> Self {
        Self {
            min_len: DEFAULT_MIN_LEN,
            mode: CascadeMode::First,
            expensive_threshold: DEFAULT_EXPENSIVE_THRESHOLD,
            grammar_drafts: true,
        }
    }
}
