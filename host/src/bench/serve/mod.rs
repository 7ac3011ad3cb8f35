//! `spechost bench --clients`: the server benchmark. Closed-loop clients drive a server over
//! HTTP with the workloads' requests, streamed, and measure what a user of the server sees.
//!
//! In order:
//! 1. [`plan_requests`] turns each workload request into an HTTP body in the form `bench`
//!    prompts it (`messages` to `/v1/chat/completions`, a raw `prompt` with its stop strings
//!    to `/v1/completions`), sampled as the bench is (greedy by default); each [`Row`] (plain decoding, then every bench
//!    configuration) adds its `speculative` block, or none for a server at `--url`;
//! 2. in-process, the one-client level's requests are decoded through the engine as
//!    `spechost bench` does ([`OneClientShare`]), for the single-stream comparison: half of
//!    the passes before the server's levels, the rest after them;
//! 3. [`run`] starts the server in this process (or drives the one at `--url`); each level, a
//!    row at a client count, sends one warm-up request and then the clients' shares; every
//!    answer is timed by its client ([`send`]) and its text checked against plain decoding's;
//! 4. [`ServeReport`] turns the levels into aggregate tok/s, ratios, time to first token and
//!    per output token, prints the table and writes `serve-results.{md,csv,json}`.
//!
//! Not here: the server (`server`, used through HTTP and `server::serve_embedded` only), flags
//! (`config::BenchArgs`), decoding one stream (`bench::runner`).

mod client;
mod driver;
mod figures;
mod levels;
mod plan;
mod report;
mod single_stream;

pub use self::client::{AnswerReader, Streamed, send};
pub use self::driver::run;
pub use self::figures::{LevelFigures, Percentiles, figures, time_per_output_token};
pub use self::levels::{Difference, Driven, Level, Levels, Reference, drive};
pub use self::plan::{Endpoint, PlannedRequest, Row, client_share, plan_requests};
pub use self::report::{
    IN_PROCESS, SERVE_RESULTS_CSV, SERVE_RESULTS_JSON, SERVE_RESULTS_MARKDOWN, ServeReport,
    ServeRow, ServerSettings, SingleStream,
};
pub use self::single_stream::OneClientShare;
