//! The link to the shared Redis (`serve --share`): one task on the server's async runtime that
//! connects, writes what the server queued (its responses, its admin updates) and reads what
//! other replicas wrote; when Redis goes away it logs once, retries with backoff, and picks up
//! where it left off.
//!
//! Two connections: a reader blocked in `XREAD` on both streams, and a writer, so that reading
//! never holds writing up. A queued entry stays queued until Redis took it (an entry may be
//! written twice when the link fails just after Redis took it: harmless for drafters). A
//! stream emptied while the link was down (Redis restarted without its data) is read again
//! from its start.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamRangeReply, StreamReadReply};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::entry::{self, SharedUpdate, Skipped};
use super::responses::Origin;
use super::{Link, Sharing, hex};
use crate::cascade::Token;
use crate::server::metrics::{Metrics, ReloadOutcome};
use crate::server::registry::{Registry, SharedDefaults, SharedPlugin};

/// Responses the stream keeps (approximately: Redis trims whole blocks).
pub const RESPONSES_STREAM_LENGTH: usize = 1024;
/// Updates the stream keeps.
const UPDATES_STREAM_LENGTH: usize = 64;
/// Entries read per `XREAD`.
const READ_COUNT: usize = 64;
/// How long one `XREAD` waits for new entries.
const READ_BLOCK: Duration = Duration::from_millis(1000);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long Redis may take to answer a command (beyond `READ_BLOCK` for a read).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// First wait before reconnecting; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Longest wait before reconnecting.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Largest plugin file read from Redis.
const MAX_PLUGIN_BYTES: usize = 64 << 20;

/// What the server queued for the other replicas.
#[derive(Debug, Clone)]
pub enum Outgoing {
    /// A finished response's tokens.
    Response(Arc<[Token]>),
    /// New defaults, and the plugin files (sha256, path) they need.
    Update {
        /// The defaults.
        update: SharedUpdate,
        /// The plugin files, by sha256.
        files: Vec<(String, PathBuf)>,
    },
}

/// Where the reader is in each stream.
#[derive(Debug, Clone)]
struct Cursors {
    responses: String,
    updates: String,
}

/// Runs the link until the runtime shuts down.
pub async fn run(
    sharing: Arc<Sharing>,
    mut outbox: mpsc::Receiver<Outgoing>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
) {
    let Some(link) = &sharing.link else { return };
    let server = link.target.display_server();
    let client = match redis::Client::open(link.target.server.as_str()) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%server, %error, "cannot use the --share URL; serving alone");
            return;
        }
    };
    let mut unsent: Option<Outgoing> = None;
    // A replica that starts reads every response the stream still keeps.
    let mut cursors = Cursors {
        responses: "0-0".into(),
        updates: "0-0".into(),
    };
    let mut backoff = MIN_BACKOFF;
    let mut down = false;
    let reader = Reader {
        sharing: &sharing,
        link,
        registry: &registry,
        metrics: &metrics,
    };
    loop {
        match connect(&client).await {
            Ok((read_connection, write_connection)) => {
                link.counters.connected.store(true, Ordering::Relaxed);
                tracing::info!(%server, "connected to the shared Redis");
                backoff = MIN_BACKOFF;
                let error = tokio::select! {
                    error = reader.run(read_connection, &mut cursors) => error,
                    error = write(link, write_connection, &mut outbox, &mut unsent) => error,
                };
                link.counters.connected.store(false, Ordering::Relaxed);
                tracing::warn!(%server, error = format!("{error:#}"), "lost the shared Redis; serving alone, reconnecting");
                down = true;
            }
            Err(error) if !down => {
                tracing::warn!(%server, %error, "cannot reach the shared Redis; serving alone, retrying with backoff");
                down = true;
            }
            Err(error) => tracing::debug!(%server, %error, "still cannot reach the shared Redis"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A reading and a writing connection.
async fn connect(
    client: &redis::Client,
) -> redis::RedisResult<(MultiplexedConnection, MultiplexedConnection)> {
    let config = |response_timeout| {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(response_timeout))
    };
    let reader = client
        .get_multiplexed_async_connection_with_config(&config(READ_BLOCK + RESPONSE_TIMEOUT))
        .await?;
    let writer = client
        .get_multiplexed_async_connection_with_config(&config(RESPONSE_TIMEOUT))
        .await?;
    Ok((reader, writer))
}

/// Writes queued entries (`unsent` first: the one the last connection did not finish) until
/// the connection fails.
async fn write(
    link: &Link,
    mut connection: MultiplexedConnection,
    outbox: &mut mpsc::Receiver<Outgoing>,
    unsent: &mut Option<Outgoing>,
) -> anyhow::Error {
    loop {
        let item = match unsent.take() {
            Some(item) => item,
            // The sender lives as long as the server: `None` never comes.
            None => match outbox.recv().await {
                Some(item) => item,
                None => std::future::pending().await,
            },
        };
        *unsent = Some(item.clone());
        let written = match &item {
            Outgoing::Response(tokens) => write_response(link, &mut connection, tokens).await,
            Outgoing::Update { update, files } => {
                write_update(link, &mut connection, update, files).await
            }
        };
        if let Err(error) = written {
            return error;
        }
        *unsent = None;
    }
}

async fn write_response(
    link: &Link,
    connection: &mut MultiplexedConnection,
    tokens: &[Token],
) -> anyhow::Result<()> {
    let key = link.target.key("responses");
    let fields = entry::response_fields(&link.expected, tokens);
    xadd(connection, &key, RESPONSES_STREAM_LENGTH, &fields).await?;
    link.counters
        .published_responses
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Stores the update's plugin files by sha256, takes the next shared generation and appends the
/// update; this replica then runs that generation.
async fn write_update(
    link: &Link,
    connection: &mut MultiplexedConnection,
    update: &SharedUpdate,
    files: &[(String, PathBuf)],
) -> anyhow::Result<()> {
    for (sha256, path) in files {
        let read = tokio::task::spawn_blocking({
            let path = path.clone();
            move || std::fs::read(path)
        })
        .await?;
        let bytes = match read {
            Ok(bytes) if hex(&Sha256::digest(&bytes)) == *sha256 => bytes,
            Ok(_) | Err(_) => {
                tracing::warn!(path = %path.display(), "a plugin file changed or went away since it was loaded: other replicas will refuse the update until it is published again");
                continue;
            }
        };
        redis::cmd("SET")
            .arg(link.target.key(&format!("plugin:{sha256}")))
            .arg(bytes)
            .arg("NX")
            .query_async::<()>(connection)
            .await
            .context("storing a plugin file")?;
    }
    let counters = &link.counters;
    let counted: u64 = redis::cmd("INCR")
        .arg(link.target.key("generation"))
        .query_async(connection)
        .await
        .context("taking a generation")?;
    // After Redis lost its data the counter starts again: never go back.
    let generation = counted.max(counters.applied_generation.load(Ordering::Relaxed) + 1);
    if generation != counted {
        redis::cmd("SET")
            .arg(link.target.key("generation"))
            .arg(generation)
            .query_async::<()>(connection)
            .await?;
    }
    let Some(admin_token) = &link.expected.admin_token else {
        return Ok(());
    };
    let fields = entry::update_fields(&link.expected, admin_token, generation, update);
    xadd(
        connection,
        &link.target.key("updates"),
        UPDATES_STREAM_LENGTH,
        &fields,
    )
    .await?;
    counters
        .applied_generation
        .store(generation, Ordering::Relaxed);
    counters.published_updates.fetch_add(1, Ordering::Relaxed);
    tracing::info!(generation, "published the defaults to the other replicas");
    Ok(())
}

/// `XADD key MAXLEN ~ length * fields...`.
async fn xadd(
    connection: &mut MultiplexedConnection,
    key: &str,
    length: usize,
    fields: &[(&str, Vec<u8>)],
) -> anyhow::Result<()> {
    let mut command = redis::cmd("XADD");
    command.arg(key).arg("MAXLEN").arg("~").arg(length).arg("*");
    for (name, value) in fields {
        command.arg(*name).arg(value.as_slice());
    }
    command
        .query_async::<String>(connection)
        .await
        .with_context(|| format!("appending to {key}"))?;
    Ok(())
}

/// Reads the other replicas' entries.
struct Reader<'a> {
    sharing: &'a Sharing,
    link: &'a Link,
    registry: &'a Arc<Registry>,
    metrics: &'a Metrics,
}

impl Reader<'_> {
    /// Catches up with the latest update, then reads both streams until the connection fails.
    async fn run(
        &self,
        mut connection: MultiplexedConnection,
        cursors: &mut Cursors,
    ) -> anyhow::Error {
        match self.read(&mut connection, cursors).await {
            Ok(never) => match never {},
            Err(error) => error,
        }
    }

    async fn read(
        &self,
        connection: &mut MultiplexedConnection,
        cursors: &mut Cursors,
    ) -> anyhow::Result<std::convert::Infallible> {
        let responses = self.link.target.key("responses");
        let updates = self.link.target.key("updates");
        if let Some(last) = last_entry(connection, &responses).await? {
            if id_order(&last.id) < id_order(&cursors.responses) {
                tracing::info!(
                    "the shared response stream started again; reading it from its start"
                );
                cursors.responses = "0-0".into();
            }
        } else {
            cursors.responses = "0-0".into();
        }
        // Only the latest update matters: it holds every default.
        if let Some(latest) = last_entry(connection, &updates).await? {
            cursors.updates.clone_from(&latest.id);
            self.update(connection, &latest).await;
        } else {
            cursors.updates = "0-0".into();
        }
        loop {
            let reply: Option<StreamReadReply> = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(READ_COUNT)
                .arg("BLOCK")
                .arg(READ_BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&responses)
                .arg(&updates)
                .arg(&cursors.responses)
                .arg(&cursors.updates)
                .query_async(connection)
                .await
                .context("reading the shared streams")?;
            for stream in reply.map(|reply| reply.keys).unwrap_or_default() {
                for entry in &stream.ids {
                    if stream.key == responses {
                        self.response(entry);
                        cursors.responses.clone_from(&entry.id);
                    } else {
                        self.update(connection, entry).await;
                        cursors.updates.clone_from(&entry.id);
                    }
                }
            }
        }
    }

    /// Hands another replica's response to the slots' drafters.
    fn response(&self, entry: &StreamId) {
        match entry::read_response(&entry.map, &self.link.expected) {
            Ok(tokens) => {
                self.sharing
                    .responses
                    .record(Arc::from(tokens), Origin::Replica);
                self.sharing.recorded[1].fetch_add(1, Ordering::Relaxed);
            }
            Err(skipped) => self.skipped(entry, skipped),
        }
    }

    fn skipped(&self, entry: &StreamId, skipped: Skipped) {
        let counters = &self.link.counters;
        match skipped {
            Skipped::Own => {}
            Skipped::Foreign => {
                counters.ignored_foreign.fetch_add(1, Ordering::Relaxed);
            }
            Skipped::Unsigned => {
                counters.ignored_unsigned.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(id = %entry.id, "ignoring an update not signed with this replica's admin token; give every replica the same --admin-token-file");
            }
            Skipped::Malformed(why) => {
                counters.ignored_malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(id = %entry.id, %why, "ignoring a malformed shared entry");
            }
        }
    }

    /// Applies another replica's update of the defaults, if it is newer than what this replica
    /// runs.
    async fn update(&self, connection: &mut MultiplexedConnection, entry: &StreamId) {
        let (generation, update) = match entry::read_update(&entry.map, &self.link.expected) {
            Ok(read) => read,
            Err(skipped) => return self.skipped(entry, skipped),
        };
        let counters = &self.link.counters;
        if generation <= counters.applied_generation.load(Ordering::Relaxed) {
            return;
        }
        let outcome = match self.fetch_files(connection, update).await {
            Ok(shared) => {
                let registry = Arc::clone(self.registry);
                tokio::task::spawn_blocking(move || registry.apply_shared(shared))
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|applied| applied.map_err(anyhow::Error::from))
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(snapshot) => {
                counters
                    .applied_generation
                    .store(generation, Ordering::Relaxed);
                counters.applied_updates.fetch_add(1, Ordering::Relaxed);
                self.metrics.reload(ReloadOutcome::Published);
                tracing::info!(
                    generation,
                    registry_generation = snapshot.generation,
                    cascade = %snapshot.defaults.cascade.join(","),
                    "applied another replica's defaults"
                );
            }
            Err(error) => {
                counters.refused_updates.fetch_add(1, Ordering::Relaxed);
                self.metrics.reload(ReloadOutcome::Rejected);
                tracing::warn!(
                    generation,
                    error = format!("{error:#}"),
                    "refused another replica's defaults; keeping ours"
                );
            }
        }
    }

    /// The update as the registry applies it, with a local copy of each plugin version this
    /// server does not run (fetched from Redis by sha256 and checked).
    async fn fetch_files(
        &self,
        connection: &mut MultiplexedConnection,
        update: SharedUpdate,
    ) -> anyhow::Result<SharedDefaults> {
        let snapshot = self.registry.snapshot();
        let loaded = snapshot.plugins();
        let policies = snapshot.policies();
        let mut cascade = Vec::with_capacity(update.cascade.len());
        for plugin in &update.cascade {
            let runs_it = loaded
                .iter()
                .any(|p| p.name == plugin.name && p.sha256 == plugin.sha256);
            cascade.push(self.local_copy(connection, plugin, runs_it).await?);
        }
        let policy_file = match &update.policy_file {
            Some(plugin) => {
                let runs_it = policies
                    .iter()
                    .any(|p| p.name == plugin.name && p.sha256 == plugin.sha256);
                Some(self.local_copy(connection, plugin, runs_it).await?)
            }
            None => None,
        };
        Ok(SharedDefaults {
            cascade,
            max_draft_len: update.draft_max,
            mode: update.mode,
            policy: update.policy,
            policy_file,
            plugin_configs: update.plugin_configs,
        })
    }

    /// `plugin`, with a local copy of its file unless this server already runs it (`runs_it`).
    async fn local_copy(
        &self,
        connection: &mut MultiplexedConnection,
        plugin: &entry::PublishedPlugin,
        runs_it: bool,
    ) -> anyhow::Result<SharedPlugin> {
        let mut shared = SharedPlugin {
            name: plugin.name.clone(),
            sha256: plugin.sha256.clone(),
            file: None,
        };
        if runs_it {
            return Ok(shared);
        }
        let dir = self.link.plugin_dir.join(&plugin.sha256);
        let path = dir.join(format!("{}.wasm", plugin.name));
        if !path.is_file() {
            let bytes: Option<Vec<u8>> = redis::cmd("GET")
                .arg(self.link.target.key(&format!("plugin:{}", plugin.sha256)))
                .query_async(connection)
                .await
                .context("fetching a plugin file")?;
            // Missing or wrong bytes: the registry refuses the update, naming the plugin.
            let Some(bytes) = bytes.filter(|b| {
                b.len() <= MAX_PLUGIN_BYTES && hex(&Sha256::digest(b)) == plugin.sha256
            }) else {
                return Ok(shared);
            };
            tokio::task::spawn_blocking({
                let (dir, path) = (dir.clone(), path.clone());
                move || write_atomically(&dir, &path, &bytes)
            })
            .await?
            .with_context(|| format!("writing {}", path.display()))?;
        }
        shared.file = Some(path);
        Ok(shared)
    }
}

/// Writes `bytes` to `path` in `dir` through a temporary file, so a reader never sees half.
fn write_atomically(
    dir: &std::path::Path,
    path: &std::path::Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

/// The last entry of stream `key`, if it has one.
async fn last_entry(
    connection: &mut MultiplexedConnection,
    key: &str,
) -> anyhow::Result<Option<StreamId>> {
    let reply: StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(connection)
        .await
        .with_context(|| format!("reading the end of {key}"))?;
    Ok(reply.ids.into_iter().next())
}

/// A stream entry id (`MILLISECONDS-SEQUENCE`) as numbers, in their order.
fn id_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_order_as_numbers() {
        assert!(id_order("0-0") < id_order("1-0"));
        assert!(id_order("1700000000000-2") < id_order("1700000000000-10"));
        assert!(id_order("999-5") < id_order("1000-0"));
    }
}
