//! `spechost serve`: an OpenAI-compatible HTTP server whose speculation (cascade, draft length,
//! plugin versions) can change while it runs.
//!
//! # How a request flows
//!
//! 0. `connections` accepts the TCP connection (within `--max-connections`) and serves it with
//!    hyper, timing out slow headers, idle connections and slow bodies; `hosts` refuses
//!    requests addressed to names the server does not answer to.
//! 1. `router::router` (axum on tokio) routes `POST /v1/completions` or `/v1/chat/completions` to its
//!    handler, which checks the body (`generation::Plan`), tokenizes the prompt (chat template
//!    from the GGUF, messages as plain text) and queues a job.
//! 2. The queue (`scheduler`) is bounded and first-come-first-served; a full queue answers 429
//!    with `Retry-After`.
//! 3. A slot (`slot`) takes the job: one std thread per slot keeps the plugin instances it uses
//!    across requests (`pool`) and runs the engine's round loop on its sequence of the shared
//!    context (`engine::BatchedSequence`); the batcher (`engine::Batcher`), on the main thread,
//!    decodes for every slot: each step verifies the rounds of every running request in one
//!    batch and reads a chunk of a starting request's prompt.
//! 4. Between prompt chunks and before every round the slot checks whether the client went away
//!    (stop), and before every round whether the plugin registry (`registry`) published new
//!    sources for this request (swap the cascade, begun again with the context so far).
//! 5. Text flows back over a channel and is returned whole or as server-sent events, with
//!    `usage` and a `speculative` block (per-source drafted, accepted, rounds won, acceptance,
//!    mean accepted length, and how many requests shared the request's verify batches).
//!
//! # Concurrency: one batch for every request
//!
//! `--parallel N` (default 1) gives one llama.cpp context N sequences, each with a KV stream of
//! `--ctx-size` tokens, and all the compute threads. A step reads the weights once for every
//! running request's pending token and draft, which on a memory-bound machine costs about what
//! one request's round costs; llama.cpp splits a batch into passes where sequences' row counts
//! or numbers leave gaps, so a free slot's request goes to the lowest-numbered idle slot
//! (`scheduler`). A request's output does not depend on what shares its batch: every row is
//! computed as it would be alone (`docs/exactness.md`), which the context checks at start-up for
//! batches of several sequences. A draft model is batched the same way: one draft context with
//! a sequence per plugin instance using it. Each slot keeps its own plugin instances; every
//! finished response is handed to the other slots' drafters (`share`), so a cross-request cache
//! (the `suffix` plugin's) learns from every slot's requests.
//!
//! # Replicas
//!
//! With `--share redis://HOST:PORT[/NAMESPACE]`, replicas behind a load balancer share their
//! finished responses and the admin's updates of the defaults through Redis (`share`), off
//! the request path; without Redis they serve alone.
//!
//! # Hot swap
//!
//! The registry is one immutable snapshot behind an atomic pointer. An update (admin call or
//! `--watch`) compiles and smoke-tests new plugin versions on a blocking thread, then publishes
//! the next snapshot; a refused update changes nothing. Slots read the snapshot's generation
//! before every round, so a swap lands between two rounds of a request in flight and greedy
//! output stays identical to plain decoding.
//!
//! # Policies, the draft model, state
//!
//! The default policy is `cost`, as for `spechost run`. A request may choose any loaded policy
//! with its own settings (`speculative.policy`); each slot keeps a bounded number of policy
//! instances (`pool`); the target's verify cost curve is measured once, at start-up, up to
//! `--draft-max`, the most a request may draft, and every policy learns what the server's
//! batches cost from their rounds. With `--draft-model`, every plugin instance that drafts
//! with it gets a sequence of the batcher's draft context. With `--state-dir`, each
//! slot saves the plugins' cross-request state at most once a minute and when the server stops;
//! with several slots the last save of a plugin's state wins.
//!
//! # Limits
//!
//! Clients are untrusted: every parameter, connection and timing a client controls is bounded
//! (`docs/security.md`, Server, lists each with its default and its test).
//!
//! Not here: the round loop and verification (`engine`), the cascade (`cascade`), the sandbox
//! (`plugins`), and parsing flags (`config`).

mod admin;
mod api_key;
mod chat;
mod completions;
mod connections;
mod constraint;
mod cors;
mod error;
mod extract;
mod fields;
mod generation;
mod hosts;
mod logprobs;
mod metrics;
mod models;
mod plugin_dirs;
mod pool;
mod registry;
mod router;
mod scheduler;
mod share;
mod slot;
mod startup;
mod state;
mod tokens;
mod watch;
pub mod wire;

pub use self::connections::ConnectionLimits;
pub use self::cors::CorsOrigins;
pub use self::hosts::AllowedHosts;
pub use self::share::ShareTarget;
pub use self::startup::{Embedding, serve, serve_embedded};
