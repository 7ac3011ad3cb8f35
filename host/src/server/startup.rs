//! [`serve`]: start-up and shutdown of `spechost serve`.
//!
//! Start-up, in order: start the plugin host and load the plugins and policies (a misspelt
//! cascade fails before the model is loaded); load the target and the draft model, if any,
//! and offer it to the plugins; create one llama.cpp context per slot, each on the thread that
//! will decode with it; check every plugin's config and the default policy's settings against
//! the model; every slot measures the target's verify cost curve; then start the HTTP listener
//! (its address is printed on stdout) and the watcher on a thread of their own, and the slots
//! take requests.
//!
//! Slot 0 runs on the process's main thread, as llama.cpp's own server runs its decoding
//! loop: GNU OpenMP counts the main thread as one of its threads from the start, and a team
//! started by any other thread makes it count one thread more than there are cores, after
//! which its workers sleep between parallel regions instead of spinning (measured on 2 cores:
//! 30 ms instead of 6 ms per decoded token).
//!
//! Shutdown on Ctrl-C or SIGTERM: the listener stops accepting and the queue closes (new
//! requests get 503); requests in flight (streams included) run on for at most
//! `--shutdown-timeout`, then the ones still open are cancelled; the slots save the plugins'
//! state (with `--state-dir`) and their threads exit.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::Context as _;

use super::admin::AuthFailures;
use super::connections::{self, fit_file_limit};
use super::metrics::Metrics;
use super::plugin_dirs::PluginDirs;
use super::registry::{Registry, Speculation, load_startup_plugins, load_startup_policies};
use super::router::router;
use super::scheduler::Queue;
use super::slot::Slot;
use super::state::{AppState, PromptTokenizer, RequestLimits, Shared};
use super::watch;
use crate::config::ServeConfig;
use crate::engine::{EngineError, Session, Target};
use crate::plugins::PluginHost;
use crate::plugins::SourceSpec;
use crate::stack::{Decoding, Stack, StackConfig};

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
    } = Stack::load(
        &StackConfig {
            settings: &config.stack,
            state_dir: config.state_dir.as_deref(),
            cache_dir,
        },
        Decoding::OnOtherThreads,
        |host| {
            let plugins = load_startup_plugins(host, &config.cascade)?;
            let default_cascade = plugins
                .iter()
                .filter(|(spec, _)| config.cascade.contains(spec))
                .map(|(_, plugin)| plugin.clone())
                .collect();
            let policies = load_startup_policies(host, Some(&config.policy))?;
            Ok(((plugins, policies), default_cascade))
        },
    )?;
    std::thread::scope(|scope| {
        let mut others = Vec::with_capacity(config.parallel.saturating_sub(1));
        let (prepared, slots_prepared) = mpsc::channel::<()>();
        for index in 1..config.parallel {
            let (ready, context_made) = mpsc::channel();
            let (go, handles) = mpsc::channel::<SlotHandles>();
            let target = &*target;
            let prepared = prepared.clone();
            std::thread::Builder::new()
                .name(format!("slot-{index}"))
                .spawn_scoped(scope, move || {
                    let Some(session) = create_context(config, target, index, &ready) else {
                        return;
                    };
                    // Dropped unsent when the server does not start.
                    if let Ok(handles) = handles.recv() {
                        let mut slot = Slot::new(index, session, handles, config);
                        slot.prepare(config.max_draft_len);
                        let _ = prepared.send(());
                        drop(prepared);
                        slot.run();
                    }
                })
                .context("starting a slot thread")?;
            others.push((context_made, go));
        }
        drop(prepared);
        let (ready, context_made) = mpsc::channel();
        let first = create_context(config, &target, 0, &ready);
        let mut ctx_size = config.session.ctx_size;
        for context_made in std::iter::once(&context_made).chain(others.iter().map(|(c, _)| c)) {
            ctx_size = context_made
                .recv()
                .context("a slot thread ended while creating its context")??;
        }
        let shared = start_shared(config, &target, host, plugins, policies, ctx_size)?;
        let handles = || SlotHandles {
            registry: Arc::clone(&shared.registry),
            queue: Arc::clone(&shared.queue),
            metrics: Arc::clone(&shared.metrics),
        };
        for (_, go) in &others {
            // A slot that is gone has already reported why.
            let _ = go.send(handles());
        }
        let first = first.map(|session| {
            let mut slot = Slot::new(0, session, handles(), config);
            slot.prepare(config.max_draft_len);
            slot
        });
        // The server listens once every slot measured its verify costs (a slot that ended
        // early dropped its sender).
        while slots_prepared.recv().is_ok() {}
        let (registry, metrics, queue) = (
            Arc::clone(&shared.registry),
            Arc::clone(&shared.metrics),
            Arc::clone(&shared.queue),
        );
        let http = std::thread::Builder::new()
            .name("spechost-http".into())
            .spawn_scoped(scope, move || {
                let served = config
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
                    });
                // Slots finish what is queued, then stop.
                queue.close();
                served
            })
            .context("starting the HTTP thread")?;
        if let Some(slot) = first {
            slot.run();
        }
        http.join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the HTTP thread panicked")))
    })
}

/// On the calling slot thread: pins it to the compute CPUs (llama.cpp's OpenMP workers,
/// started at its first decode, inherit them) and creates its context, reporting the context's
/// size (or the error) on `ready`.
fn create_context<'t>(
    config: &ServeConfig,
    target: &'t Target,
    index: usize,
    ready: &mpsc::Sender<Result<u32, EngineError>>,
) -> Option<Session<'t>> {
    if let Err(error) = config.stack.placement.pin_compute() {
        tracing::warn!(slot = index, %error, "cannot pin the slot to the compute CPUs; it runs unpinned");
    }
    match target.session(&config.session) {
        Ok(session) => {
            let _ = ready.send(Ok(session.ctx_size()));
            Some(session)
        }
        Err(error) => {
            let _ = ready.send(Err(error));
            None
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
) -> anyhow::Result<Shared> {
    let defaults = Speculation {
        cascade: config.cascade.iter().map(SourceSpec::name).collect(),
        max_draft_len: config.max_draft_len,
        mode: config.cascade_mode,
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
        auth_failures: AuthFailures::default(),
        public_metrics: config.public_metrics,
        allowed_hosts: config.allowed_hosts.clone(),
        message_contents: config.message_contents,
        plugin_dirs: PluginDirs::new(
            config
                .stack
                .plugin_dirs
                .iter()
                .chain(&config.watch)
                .cloned(),
        ),
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
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {}:{}; pick another --port (0 picks a free one) or --host",
                    config.host, config.port
                )
            })?;
        let address = listener
            .local_addr()
            .context("reading the listener's address")?;
        if let Some(dir) = &config.watch {
            tokio::spawn(watch::run(
                dir.clone(),
                Arc::clone(registry),
                Arc::clone(metrics),
            ));
        }
        tracing::info!(
            %address,
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
                // Scripts and tests read the address from this line; it is the only line on
                // stdout.
                println!("listening on http://{address}");
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
        connections::serve(listener, router(state), limits, shutdown).await;
        anyhow::Ok(())
    });
    // A plugin compile still running on a blocking thread (an admin update, the watcher) does
    // not hold the exit up.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
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
