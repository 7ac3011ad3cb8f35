//! [`serve`]: start-up and shutdown of `spechost serve`.
//!
//! Start-up, in order: start the plugin host and load the plugins and policies (a misspelt
//! cascade fails before the model is loaded); load the target and the draft model, if any,
//! and offer it to the plugins; create one llama.cpp context per slot; check every plugin's
//! config and the default policy's settings against the model; start the slot threads, the
//! HTTP listener (its address is printed on stdout) and the watcher.
//!
//! Shutdown on Ctrl-C or SIGTERM: the listener stops accepting, requests in flight (streams
//! included) run to their end, then the queue closes, the slots save the plugins' state (with
//! `--state-dir`) and their threads exit.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use super::hotswap::{Registry, Speculation, load_startup_plugins, load_startup_policies};
use super::metrics::Metrics;
use super::plugin_dirs::PluginDirs;
use super::pool::SourcePool;
use super::router::router;
use super::scheduler::Queue;
use super::slot::Slot;
use super::slot::VerifyCurve;
use super::state::{AppState, RequestLimits, Shared};
use super::watch;
use crate::config::{ServeConfig, SourceSpec};
use crate::engine::Target;
use crate::plugins::{PluginHost, PluginHostConfig};
use crate::run::{load_draft_model, require_draft_model};

/// Runs the server until Ctrl-C or SIGTERM.
pub fn serve(config: &ServeConfig, cache_dir: &Path) -> anyhow::Result<()> {
    for warning in &config.placement.warnings {
        tracing::warn!("{warning}");
    }
    // Threads started from here on (the plugin host's, the HTTP runtime's) inherit the
    // auxiliary CPUs; each slot pins itself to the compute CPUs.
    config
        .placement
        .pin_auxiliary()
        .context("pinning the server's threads")?;
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir.to_owned()),
        plugin_dirs: config.plugin_dirs.clone(),
        state_dir: config.state_dir.clone(),
        ..PluginHostConfig::default()
    })
    .context("starting the plugin host")?;
    let plugins = load_startup_plugins(&host, &config.cascade)?;
    let default_cascade: Vec<_> = plugins
        .iter()
        .filter(|(spec, _)| config.cascade.contains(spec))
        .map(|(_, plugin)| plugin.clone())
        .collect();
    require_draft_model(&default_cascade, config.draft.as_ref())?;
    let policies = load_startup_policies(&host, config.policy.as_deref())?;

    let target = Arc::new(Target::load(&config.model, &config.target)?);
    // Offered to drafter plugins through the WIT `draft-model` import; each plugin instance
    // (one per slot) opens its own draft context.
    if let Some(draft_model) =
        load_draft_model(config.draft.as_ref(), &target, &config.target, cache_dir)?
    {
        host.attach_draft_model(draft_model);
    }
    let sessions = (0..config.parallel)
        .map(|_| target.session(&config.session))
        .collect::<Result<Vec<_>, _>>()?;
    let ctx_size = sessions
        .first()
        .map_or(config.session.ctx_size, |s| s.ctx_size());
    let defaults = Speculation {
        cascade: config.cascade.iter().map(SourceSpec::name).collect(),
        draft_max: config.draft_max,
        mode: config.cascade_mode,
        policy: config.policy.clone(),
    };
    let registry = Arc::new(Registry::start(
        host,
        target.facts(ctx_size),
        plugins,
        policies,
        config.plugin_configs.clone(),
        defaults,
    )?);
    let queue = Arc::new(Queue::new(config.parallel, config.max_queue));
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Shared {
        model_id: config.model_id.clone(),
        target: Arc::clone(&target),
        limits: RequestLimits {
            default_max_tokens: config.default_max_tokens,
            max_tokens_limit: config.max_tokens_limit,
            max_body_bytes: config.max_body_bytes,
            ctx_size,
        },
        sampling: config.sampling.clone(),
        queue: Arc::clone(&queue),
        registry: Arc::clone(&registry),
        metrics: Arc::clone(&metrics),
        admin_token: config.admin_token.clone(),
        plugin_dirs: PluginDirs::new(config.plugin_dirs.iter().chain(&config.watch).cloned()),
    });

    std::thread::scope(|scope| {
        for (index, session) in sessions.into_iter().enumerate() {
            let slot = Slot {
                index,
                session,
                registry: Arc::clone(&registry),
                queue: Arc::clone(&queue),
                metrics: Arc::clone(&metrics),
                pool: SourcePool::default(),
                saves_state: config.state_dir.is_some(),
                verify_costs: VerifyCurve::default(),
            };
            let placement = &config.placement;
            let spawned = std::thread::Builder::new()
                .name(format!("slot-{index}"))
                .spawn_scoped(scope, move || {
                    // llama.cpp's OpenMP workers, started at the slot's first decode, inherit
                    // the compute CPUs.
                    if let Err(error) = placement.pin_compute() {
                        tracing::warn!(slot = index, %error, "cannot pin the slot to the compute CPUs; it runs unpinned");
                    }
                    slot.run();
                });
            if let Err(error) = spawned {
                queue.close();
                return Err(anyhow::Error::new(error).context("starting a slot thread"));
            }
        }
        let served = serve_http(config, state, &registry, &metrics);
        // Slots finish what is queued, then stop; the scope waits for them.
        queue.close();
        served
    })
}

/// Runs the HTTP server on a tokio runtime until a shutdown signal.
fn serve_http(
    config: &ServeConfig,
    state: AppState,
    registry: &Arc<Registry>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("spechost-http")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
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
            cascade = %registry.snapshot().defaults.cascade.join(","),
            admin = config.admin_token.is_some(),
            "serving"
        );
        // Scripts and tests read the address from this line; it is the only line on stdout.
        println!("listening on http://{address}");
        axum::serve(listener, router(state))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("serving HTTP")
    })
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
    tracing::info!("shutting down: finishing requests in flight");
}
