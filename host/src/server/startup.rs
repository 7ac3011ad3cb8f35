//! [`serve`]: start-up and shutdown of `spechost serve`.
//!
//! Start-up, in order: start the plugin host and load the plugins and policies (a misspelt
//! cascade fails before the model is loaded); load the target and the draft model, if any,
//! and offer it to the plugins; create the one llama.cpp context, with a sequence per slot, and
//! measure the target's verify cost curve in it; check every plugin's config and the default
//! policy's settings against the model; then start a thread per slot, the HTTP listener (its
//! address is printed on stdout) and the watcher on a thread of their own, and decode.
//!
//! The batcher (`engine::Batcher`) decodes on the process's main thread, as llama.cpp's own
//! server runs its decoding loop: GNU OpenMP counts the main thread as one of its threads from
//! the start, and a team started by any other thread makes it count one thread more than there
//! are cores, after which its workers sleep between parallel regions instead of spinning
//! (measured on 2 cores: 30 ms instead of 6 ms per decoded token). Slot threads run the round
//! protocol and the plugins, on the CPUs left over from the compute CPUs when there are any.
//!
//! Shutdown on Ctrl-C or SIGTERM: the listener stops accepting and the queue closes (new
//! requests get 503); requests in flight (streams included) run on for at most
//! `--shutdown-timeout`, then the ones still open are cancelled; the slots save the plugins'
//! state (with `--state-dir`) and their threads exit, and then the batcher.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::admin::AuthFailures;
use super::connections::{self, fit_file_limit};
use super::metrics::Metrics;
use super::plugin_dirs::PluginDirs;
use super::registry::{Registry, Speculation, load_startup_plugins, load_startup_policies};
use super::router::router;
use super::scheduler::Queue;
use super::share::Sharing;
use super::slot::Slot;
use super::state::{AppState, PromptTokenizer, RequestLimits, Shared};
use super::watch;
use crate::config::ServeConfig;
use crate::engine::{
    BatchDrafter, BatchedSequence, Batcher, BatcherSettings, DEFAULT_COST_REPETITIONS,
    DRAFT_SEQUENCES_PER_SLOT, DraftModelHost, Session, Target,
};
use crate::placement::PinnedDraftBatch;
use crate::plugins::PluginHost;
use crate::plugins::SourceSpec;
use crate::stack::{DraftContexts, Stack, StackConfig, measure_draft_model_costs};

/// Time the server may spend measuring its verify cost curve at start-up beyond one warm-up
/// and one measured sweep per context length (which always run).
pub const VERIFY_CURVE_BUDGET: Duration = Duration::from_secs(3);
/// The short context the verify cost curve is measured after, in tokens.
const VERIFY_CURVE_SHORT_CONTEXT: usize = 64;
/// The long one: requests between the two get costs interpolated for their prompt's length.
const VERIFY_CURVE_LONG_CONTEXT: usize = 1024;

/// How a server started from code (`spechost bench --clients`) tells its address and is
/// stopped, besides Ctrl-C and SIGTERM.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// Receives the address once the server listens.
    pub listening: mpsc::Sender<SocketAddr>,
    /// Stops the server as SIGTERM does once notified (a notification before the server
    /// listens is kept).
    pub stop: Arc<tokio::sync::Notify>,
}

/// Runs the server until Ctrl-C or SIGTERM.
pub fn serve(config: &ServeConfig, cache_dir: &Path) -> anyhow::Result<()> {
    serve_with(config, cache_dir, None)
}

/// Runs the server until Ctrl-C, SIGTERM or `embedding.stop`, sending its address to
/// `embedding.listening` once it listens. Decoding runs on the calling thread, which should be
/// the process's main thread (see the [module](self) docs).
pub fn serve_embedded(
    config: &ServeConfig,
    cache_dir: &Path,
    embedding: Embedding,
) -> anyhow::Result<()> {
    serve_with(config, cache_dir, Some(embedding))
}

fn serve_with(
    config: &ServeConfig,
    cache_dir: &Path,
    embedding: Option<Embedding>,
) -> anyhow::Result<()> {
    // Requests may choose any loaded plugin and policy: every built-in is loaded with the
    // default cascade's; only the default cascade must have its draft model.
    let Stack {
        host,
        plugins: (plugins, policies),
        target,
        draft_model,
    } = Stack::load(
        &StackConfig {
            settings: &config.stack,
            state_dir: config.state_dir.as_deref(),
            cache_dir,
        },
        DraftContexts::Batched,
        |host| {
            let plugins = load_startup_plugins(host, &config.cascade)?;
            let default_cascade = plugins
                .iter()
                .filter(|(spec, _)| config.cascade.contains(spec))
                .map(|(_, plugin)| plugin.clone())
                .collect();
            let policies = load_startup_policies(
                host,
                std::iter::once(&config.policy).chain(&config.other_policies),
            )?;
            Ok(((plugins, policies), default_cascade))
        },
    )?;
    let mut session = target
        .session(&config.session)
        .context("creating the server's llama.cpp context")?;
    measure_verify_curve(&mut session, config.max_draft_len);
    let draft = draft_model
        .clone()
        .map(|draft| open_draft_batch(config, draft))
        .transpose()
        .context("creating the draft model's context")?;
    // Measured on a one-sequence context of its own, as `run`'s plugins draft, before the
    // batcher owns the shared one.
    let draft_costs = draft_model
        .as_deref()
        .and_then(|draft| measure_draft_model_costs(draft, draft, &target, config.session.threads));
    let (batcher, sequences) = Batcher::new(
        session,
        draft,
        BatcherSettings {
            prefill_chunk: config.prefill_chunk,
        },
    );
    if let Some(factory) = batcher.draft_factory() {
        host.attach_draft_model(Arc::new(factory), draft_costs);
    }
    let shared = start_shared(
        config,
        &target,
        host,
        plugins,
        policies,
        batcher.ctx_size(),
        cache_dir,
    )?;
    std::thread::scope(|scope| {
        let queue = Arc::clone(&shared.queue);
        let started = start_threads(scope, config, shared, sequences, embedding);
        if started.is_err() {
            // Slots already started finish what is queued (nothing), then stop.
            queue.close();
        }
        // Decodes until every slot has stopped: after shutdown, once the queue is drained.
        batcher.run();
        started?
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the HTTP thread panicked")))
    })
}

/// The draft model's context for every slot's plugin instances: on a worker thread pinned to
/// `--draft-cpus` when given, else on the batcher's thread with the target.
fn open_draft_batch(
    config: &ServeConfig,
    draft: Arc<DraftModelHost>,
) -> anyhow::Result<Box<dyn BatchDrafter>> {
    let sequences = config.parallel * DRAFT_SEQUENCES_PER_SLOT;
    match config.stack.draft.as_ref().and_then(|d| d.cpus.clone()) {
        Some(cpus) => {
            let pinned = PinnedDraftBatch::open(cpus, move || {
                draft.open_batch(sequences).map_err(|e| e.to_string())
            })
            .map_err(anyhow::Error::msg)?;
            Ok(Box::new(pinned))
        }
        None => Ok(Box::new(draft.open_batch(sequences)?)),
    }
}

/// Starts a thread per slot, each generating on its sequence, and the HTTP thread, which closes
/// the queue when the server shuts down (the slots then finish and stop).
fn start_threads<'scope, 'env: 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    config: &'env ServeConfig,
    shared: Shared,
    sequences: Vec<BatchedSequence<'env>>,
    embedding: Option<Embedding>,
) -> anyhow::Result<std::thread::ScopedJoinHandle<'scope, anyhow::Result<()>>> {
    for (index, sequence) in sequences.into_iter().enumerate() {
        let handles = SlotHandles {
            registry: Arc::clone(&shared.registry),
            queue: Arc::clone(&shared.queue),
            metrics: Arc::clone(&shared.metrics),
            sharing: Arc::clone(&shared.sharing),
        };
        std::thread::Builder::new()
            .name(format!("slot-{index}"))
            .spawn_scoped(scope, move || {
                // A slot runs plugins, not llama.cpp: it keeps off the compute CPUs when
                // others are left.
                if let Err(error) = config.stack.placement.pin_auxiliary() {
                    tracing::warn!(slot = index, %error, "cannot pin the slot's thread; it runs unpinned");
                }
                Slot::new(index, sequence, handles, config).run();
            })
            .context("starting a slot thread")?;
    }
    let (registry, metrics, queue) = (
        Arc::clone(&shared.registry),
        Arc::clone(&shared.metrics),
        Arc::clone(&shared.queue),
    );
    std::thread::Builder::new()
        .name("spechost-http".into())
        .spawn_scoped(scope, move || {
            // Slots finish what is queued, then stop: also when serving panics, or they
            // would wait for requests for ever and the process would never exit.
            let _close = CloseOnExit(queue);
            config
                .stack
                .placement
                .pin_auxiliary()
                .context("pinning the server's threads")
                .and_then(|()| {
                    serve_http(
                        config,
                        AppState::new(shared),
                        &registry,
                        &metrics,
                        embedding,
                    )
                })
        })
        .context("starting the HTTP thread")
}

/// Closes the queue when dropped: when the HTTP thread ends, however it ends.
struct CloseOnExit(Arc<Queue>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Measures the verify cost curve for batches of 1 to `max_draft_len + 1` tokens (as far as
/// the context and batch allow) after a short and a long context, within
/// [`VERIFY_CURVE_BUDGET`]: once, before the server listens, so no request waits for it.
fn measure_verify_curve(session: &mut Session<'_>, max_draft_len: usize) {
    let long = VERIFY_CURVE_LONG_CONTEXT.min(session.ctx_size() as usize / 2);
    let started = Instant::now();
    match session.measure_verify_curve(
        &[VERIFY_CURVE_SHORT_CONTEXT, long],
        max_draft_len + 1,
        DEFAULT_COST_REPETITIONS,
        VERIFY_CURVE_BUDGET,
    ) {
        Ok(curve) => {
            let (short, long_costs) = (curve.at(VERIFY_CURVE_SHORT_CONTEXT), curve.at(long));
            let ms = |costs: &[Duration], n: usize| {
                costs.get(n).map_or(0.0, |cost| cost.as_secs_f64() * 1e3)
            };
            tracing::info!(
                tokens = short.len(),
                one_token_ms = ms(&short, 0),
                all_tokens_ms = ms(&short, short.len().saturating_sub(1)),
                long_context = long,
                long_one_token_ms = ms(&long_costs, 0),
                long_all_tokens_ms = ms(&long_costs, long_costs.len().saturating_sub(1)),
                took_ms = started.elapsed().as_secs_f64() * 1e3,
                "measured the verify cost curve"
            );
        }
        Err(error) => {
            tracing::warn!(%error, "cannot measure the verify cost curve; policies learn it from rounds");
        }
    }
}

/// What a slot gets once the server starts.
pub struct SlotHandles {
    /// The published plugins and defaults.
    pub registry: Arc<Registry>,
    /// Where requests come from.
    pub queue: Arc<Queue>,
    /// Where counters go.
    pub metrics: Arc<Metrics>,
    /// Finished responses shared between slots and replicas.
    pub sharing: Arc<Sharing>,
}

/// The plugin registry (checked against the model and its context size), the queue, the
/// counters, and what handlers share.
fn start_shared(
    config: &ServeConfig,
    target: &Arc<Target>,
    host: PluginHost,
    plugins: Vec<(SourceSpec, crate::plugins::LoadedPlugin)>,
    policies: Vec<crate::plugins::LoadedPolicy>,
    ctx_size: u32,
    cache_dir: &Path,
) -> anyhow::Result<Shared> {
    let defaults = Speculation {
        cascade: config.cascade.iter().map(SourceSpec::name).collect(),
        max_draft_len: config.max_draft_len,
        mode: config.cascade_mode,
        grammar_drafts: config.grammar_drafts,
        policy: Some(config.policy.clone()),
    };
    let registry = Arc::new(Registry::start(
        host,
        target.facts(ctx_size),
        plugins,
        policies,
        config.plugin_configs.clone(),
        defaults,
    )?);
    Ok(Shared {
        model_id: config.model_id.clone(),
        model_aliases: config.model_aliases.clone(),
        accept_any_model: config.accept_any_model,
        model_path: target.path().display().to_string(),
        chat_template: target.chat_template_text(),
        tokenizer: Arc::clone(target) as Arc<dyn PromptTokenizer>,
        limits: RequestLimits {
            default_max_tokens: config.default_max_tokens,
            max_tokens_limit: config.max_tokens_limit,
            max_body_bytes: config.max_body_bytes,
            ctx_size,
            max_draft_len: config.max_draft_len,
            body_timeout: config.connections.body_timeout,
        },
        sampling: config.sampling.clone(),
        queue: Arc::new(Queue::new(config.parallel, config.max_queue)),
        registry,
        metrics: Arc::new(Metrics::default()),
        admin_token: config.admin_token.clone(),
        api_keys: config.api_keys.clone(),
        auth_failures: AuthFailures::default(),
        public_metrics: config.public_metrics,
        allowed_hosts: config.allowed_hosts.clone(),
        cors_origins: config.cors_origins.clone(),
        message_contents: config.message_contents,
        plugin_dirs: PluginDirs::new(
            config
                .stack
                .plugin_dirs
                .iter()
                .chain(&config.watch)
                .cloned(),
        ),
        sharing: Arc::new(match &config.share {
            Some(share) => Sharing::with_replicas(
                share.clone(),
                &**target,
                ctx_size as usize,
                config.admin_token.clone(),
                cache_dir,
            ),
            None => Sharing::local(),
        }),
    })
}

/// Runs the HTTP server on a tokio runtime until a shutdown signal, then closes the queue and
/// every connection within the shutdown deadline.
fn serve_http(
    config: &ServeConfig,
    state: AppState,
    registry: &Arc<Registry>,
    metrics: &Arc<Metrics>,
    embedding: Option<Embedding>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("spechost-http")
        .build()
        .context("starting the async runtime")?;
    let mut limits = config.connections;
    fit_file_limit(&mut limits);
    let queue = Arc::clone(&state.queue);
    let sharing = Arc::clone(&state.sharing);
    let served = runtime.block_on(async {
        sharing.start(Arc::clone(registry), Arc::clone(metrics));
        let listeners = bind(&config.hosts, config.port).await?;
        let addresses: Vec<SocketAddr> = listeners
            .iter()
            .map(tokio::net::TcpListener::local_addr)
            .collect::<Result<_, _>>()
            .context("reading the listeners' addresses")?;
        let address = addresses[0];
        if let Some(dir) = &config.watch {
            tokio::spawn(watch::run(
                dir.clone(),
                Arc::clone(registry),
                Arc::clone(metrics),
                Arc::clone(&sharing),
            ));
        }
        tracing::info!(
            address = %addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            model = %config.model_id,
            slots = config.parallel,
            max_queue = config.max_queue,
            max_connections = limits.max_connections,
            cascade = %registry.snapshot().defaults.cascade.join(","),
            policy = %config.policy,
            admin = config.admin_token.is_some(),
            "serving"
        );
        let stop = match embedding {
            Some(embedding) => {
                let _ = embedding.listening.send(address);
                Some(embedding.stop)
            }
            None => {
                announce(&addresses);
                None
            }
        };
        let shutdown = async {
            match stop {
                Some(stop) => tokio::select! {
                    () = shutdown_signal() => {}
                    () = stop.notified() => {
                        tracing::info!("shutting down: stopped by the embedding program");
                    }
                },
                None => shutdown_signal().await,
            }
            // New requests get 503 from now on; the slots finish what they hold, then stop.
            queue.close();
        };
        connections::serve(listeners, router(state), limits, shutdown).await;
        anyhow::Ok(())
    });
    // A plugin compile still running on a blocking thread (an admin update, the watcher) does
    // not hold the exit up.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

/// Writes `listening on http://ADDRESS` to stdout, one line per `--host` in order, in one write:
/// scripts and tests read the address from the first line. A reader that closed stdout after
/// the line it wanted (`| head -1`) must not stop the server, so a failed write is only logged
/// (`println!` would panic on the broken pipe).
fn announce(addresses: &[SocketAddr]) {
    use std::io::Write as _;
    let lines: String = addresses
        .iter()
        .map(|address| format!("listening on http://{address}\n"))
        .collect();
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(lines.as_bytes())
        .and_then(|()| stdout.flush())
    {
        tracing::debug!(%error, "cannot write the listening addresses to stdout");
    }
}

/// Listeners on every one of `hosts`, all on `port`; with port 0 the first picks a free port
/// and the others take the same.
async fn bind(hosts: &[String], port: u16) -> anyhow::Result<Vec<tokio::net::TcpListener>> {
    let mut listeners: Vec<tokio::net::TcpListener> = Vec::with_capacity(hosts.len());
    for host in hosts {
        let port = match listeners.first() {
            Some(first) if port == 0 => first.local_addr()?.port(),
            _ => port,
        };
        let listener = tokio::net::TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {host} port {port}; pick another --port (0 picks a free one) or --host"
                )
            })?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing requests in flight within the shutdown deadline");
}
