//! What replicas and slots share: finished responses, for the drafters that learn across
//! requests, and, between replicas, the admin's updates of the defaults.
//!
//! Within one server, every finished response is recorded in [`SharedResponses`]; before a
//! request, its slot hands each of its drafter instances the responses it has not seen
//! (`drafter-api.observe-response`), so a cross-request cache learns from every slot's
//! requests, not only its own.
//!
//! With `serve --share redis://HOST:PORT[/NAMESPACE]`, replicas share through Redis
//! (`link.rs`; the entries are in `entry.rs`):
//! - every finished response is appended to the capped stream `NAMESPACE:responses`, and every
//!   replica reads the others' into its [`SharedResponses`]; entries of another namespace or
//!   model (tokenizer fingerprint) and malformed ones are ignored and counted;
//! - an admin update (`PUT /admin/cascade`, `POST /admin/plugins/reload`) or a `--watch` reload
//!   publishes the new defaults, and the plugin files they need by sha256; every replica
//!   applies them through its own checked update path (`Registry::apply_shared`) and reports
//!   the generation it applied in `/health` and `/metrics`.
//!
//! Redis is never on a request's path: responses are queued for the link (bounded: when the
//! queue is full they are dropped and counted), and a replica whose Redis is gone serves alone,
//! logs it once, retries with backoff, publishes what it queued meanwhile and reads what it
//! missed when Redis returns.

mod entry;
mod link;
mod responses;
mod target;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

pub use self::entry::SharedUpdate;
use self::entry::{Expected, PublishedPlugin};
use self::link::Outgoing;
pub use self::responses::{Origin, SharedResponses};
pub use self::target::ShareTarget;
use super::registry::{Registry, Snapshot, SourceKey};
use super::state::PromptTokenizer;
use crate::cascade::Token;
use crate::plugins::{SourceSpec, parse_policy};

/// Responses and updates waiting for the link to Redis; past it, new ones are dropped.
pub const OUTBOX_CAPACITY: usize = 1024;

/// What the server shares: always its responses between slots; with `--share`, with other
/// replicas through Redis.
#[derive(Debug, Default)]
pub struct Sharing {
    /// The last finished responses, for every slot's drafters.
    pub responses: SharedResponses,
    /// Responses recorded from this server's slots and from other replicas.
    recorded: [AtomicU64; 2],
    link: Option<Link>,
}

/// The link to Redis and its counters.
#[derive(Debug)]
struct Link {
    target: ShareTarget,
    expected: Expected,
    /// Local copies of plugin files other replicas published.
    plugin_dir: PathBuf,
    outbox: mpsc::Sender<Outgoing>,
    /// Taken by [`Sharing::start`].
    outbox_reader: Mutex<Option<mpsc::Receiver<Outgoing>>>,
    counters: LinkCounters,
}

/// What the link did, for `/health` and `/metrics`.
#[derive(Debug, Default)]
struct LinkCounters {
    connected: AtomicBool,
    published_responses: AtomicU64,
    published_updates: AtomicU64,
    /// Responses not queued because the outbox was full.
    dropped: AtomicU64,
    ignored_foreign: AtomicU64,
    ignored_malformed: AtomicU64,
    /// Updates not signed with this replica's admin token.
    ignored_unsigned: AtomicU64,
    applied_updates: AtomicU64,
    refused_updates: AtomicU64,
    /// The shared generation of the defaults this replica runs: the last it published or
    /// applied (0: none yet).
    applied_generation: AtomicU64,
}

impl Sharing {
    /// Sharing between slots only.
    pub fn local() -> Self {
        Self::default()
    }

    /// Sharing between slots and, through `target`, with other replicas of the same model (the
    /// fingerprint of `tokenizer`, whose responses are at most `max_tokens` long). Updates of
    /// the defaults are signed with `admin_token`, and applied only when signed with it (never
    /// without one). Plugin files other replicas publish are kept under `cache_dir`. Nothing
    /// connects before [`Self::start`].
    pub fn with_replicas(
        target: ShareTarget,
        tokenizer: &dyn PromptTokenizer,
        max_tokens: usize,
        admin_token: Option<String>,
        cache_dir: &std::path::Path,
    ) -> Self {
        let (outbox, outbox_reader) = mpsc::channel(OUTBOX_CAPACITY);
        let expected = Expected {
            replica: replica_id(),
            namespace: target.namespace.clone(),
            model: tokenizer_fingerprint(tokenizer),
            vocab_size: tokenizer.vocab_size(),
            max_tokens,
            admin_token,
        };
        tracing::info!(
            server = %target.display_server(),
            namespace = %target.namespace,
            replica = %expected.replica,
            model = %expected.model,
            "sharing responses and updates with other replicas"
        );
        Self {
            link: Some(Link {
                plugin_dir: cache_dir.join("shared-plugins"),
                target,
                expected,
                outbox,
                outbox_reader: Mutex::new(Some(outbox_reader)),
                counters: LinkCounters::default(),
            }),
            ..Self::default()
        }
    }

    /// Starts the link to Redis on the current tokio runtime, applying other replicas' updates
    /// to `registry` (and counting them in `metrics`). Does nothing without `--share`, or when
    /// already started.
    pub fn start(self: &Arc<Self>, registry: Arc<Registry>, metrics: Arc<super::metrics::Metrics>) {
        let Some(link) = &self.link else { return };
        let Some(outbox) = link
            .outbox_reader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        tokio::spawn(link::run(Arc::clone(self), outbox, registry, metrics));
    }

    /// Records a response slot `slot` finished with the sources `served_by` and queues it for
    /// the other replicas.
    pub fn finished(&self, slot: usize, served_by: Vec<SourceKey>, tokens: &[Token]) {
        let tokens: Arc<[Token]> = Arc::from(tokens);
        if self
            .responses
            .record(Arc::clone(&tokens), Origin::Slot { slot, served_by })
            == 0
        {
            return;
        }
        self.recorded[0].fetch_add(1, Ordering::Relaxed);
        if let Some(link) = &self.link
            && link.outbox.try_send(Outgoing::Response(tokens)).is_err()
        {
            link.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Publishes the defaults of `snapshot` (after an admin update) to the other replicas.
    pub fn publish_update(&self, snapshot: &Snapshot) {
        let Some(link) = &self.link else { return };
        let (update, files) = shared_update(snapshot);
        if link
            .outbox
            .try_send(Outgoing::Update { update, files })
            .is_err()
        {
            tracing::warn!("the update was not queued for the other replicas: the outbox is full");
            link.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `share` block of `/health`: `null` without `--share`.
    pub fn health(&self) -> serde_json::Value {
        let Some(link) = &self.link else {
            return serde_json::Value::Null;
        };
        let c = &link.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        serde_json::json!({
            "server": link.target.display_server(),
            "namespace": link.target.namespace,
            "replica": link.expected.replica,
            "connected": c.connected.load(Ordering::Relaxed),
            "applied_generation": get(&c.applied_generation),
            "published_responses": get(&c.published_responses),
            "received_responses": get(&self.recorded[1]),
            "ignored_foreign": get(&c.ignored_foreign),
            "ignored_malformed": get(&c.ignored_malformed),
            "ignored_unsigned": get(&c.ignored_unsigned),
            "dropped": get(&c.dropped),
        })
    }

    /// The sharing families of `/metrics`, in the text format.
    pub fn metrics(&self) -> String {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut families = vec![Family {
            name: "shared_responses_total",
            kind: "counter",
            help: "Finished responses handed to the drafters of other slots, by origin.",
            label: "origin",
            samples: vec![
                ("slot", get(&self.recorded[0])),
                ("replica", get(&self.recorded[1])),
            ],
        }];
        if let Some(link) = &self.link {
            let c = &link.counters;
            families.extend([
                Family {
                    name: "share_connected",
                    kind: "gauge",
                    help: "1 while the link to the shared Redis is up.",
                    label: "",
                    samples: vec![("", u64::from(c.connected.load(Ordering::Relaxed)))],
                },
                Family {
                    name: "share_applied_generation",
                    kind: "gauge",
                    help: "The shared generation of the defaults this replica runs (the last it published or applied).",
                    label: "",
                    samples: vec![("", get(&c.applied_generation))],
                },
                Family {
                    name: "share_published_total",
                    kind: "counter",
                    help: "Entries this replica wrote to the shared streams, by kind.",
                    label: "kind",
                    samples: vec![
                        ("response", get(&c.published_responses)),
                        ("update", get(&c.published_updates)),
                    ],
                },
                Family {
                    name: "share_ignored_total",
                    kind: "counter",
                    help: "Shared entries ignored: another namespace or model (foreign), malformed, or an update not signed with this replica's admin token (unsigned).",
                    label: "reason",
                    samples: vec![
                        ("foreign", get(&c.ignored_foreign)),
                        ("malformed", get(&c.ignored_malformed)),
                        ("unsigned", get(&c.ignored_unsigned)),
                    ],
                },
                Family {
                    name: "share_dropped_total",
                    kind: "counter",
                    help: "Responses and updates not shared: the queue to Redis was full.",
                    label: "",
                    samples: vec![("", get(&c.dropped))],
                },
                Family {
                    name: "share_updates_total",
                    kind: "counter",
                    help: "Other replicas' updates of the defaults, by outcome.",
                    label: "outcome",
                    samples: vec![
                        ("applied", get(&c.applied_updates)),
                        ("refused", get(&c.refused_updates)),
                    ],
                },
            ]);
        }
        let mut page = super::metrics::Page::default();
        for family in families {
            page.family(family.name, family.kind, family.help);
            for (value, count) in family.samples {
                let label = [(family.label, value)];
                let labels = if family.label.is_empty() {
                    &label[..0]
                } else {
                    &label[..]
                };
                page.sample(family.name, labels, count);
            }
        }
        page.text
    }
}

/// A metrics family of the sharing counters: samples by the value of one label (none when
/// `label` is empty).
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    label: &'static str,
    samples: Vec<(&'static str, u64)>,
}

/// The defaults of `snapshot` as another replica applies them, and the plugin files (by
/// sha256) they need.
fn shared_update(snapshot: &Snapshot) -> (SharedUpdate, Vec<(String, PathBuf)>) {
    let plugins = snapshot.plugins();
    let mut files = Vec::new();
    let cascade = snapshot
        .defaults
        .cascade
        .iter()
        .filter_map(|name| plugins.iter().find(|p| &p.name == name))
        .map(|plugin| {
            files.push((plugin.sha256.clone(), plugin.path.clone()));
            PublishedPlugin {
                name: plugin.name.clone(),
                sha256: plugin.sha256.clone(),
            }
        })
        .collect();
    let mut policy = snapshot.defaults.policy.clone();
    let mut policy_file = None;
    if let Some(parsed) = policy.as_deref().and_then(|spec| parse_policy(spec).ok())
        && let SourceSpec::Path(_) = parsed.plugin
        && let Some(loaded) = snapshot
            .policies()
            .into_iter()
            .find(|p| p.name == parsed.name())
    {
        files.push((loaded.sha256.clone(), loaded.path.clone()));
        policy = Some(if parsed.config.is_empty() {
            parsed.name()
        } else {
            format!("{},{}", parsed.name(), parsed.config)
        });
        policy_file = Some(PublishedPlugin {
            name: loaded.name,
            sha256: loaded.sha256,
        });
    }
    let update = SharedUpdate {
        cascade,
        draft_max: snapshot.defaults.max_draft_len,
        mode: snapshot.defaults.mode,
        policy,
        policy_file,
        plugin_configs: plugins.into_iter().map(|p| (p.name, p.config)).collect(),
    };
    (update, files)
}

/// An id for this process among the replicas: its host name, process id and start time, hashed.
fn replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = Sha256::digest(format!("{host}/{}/{started}", std::process::id()));
    hex(&digest[..8])
}

/// The target's tokenizer, as a short hash of every token's text: replicas of another model
/// (whose token ids mean other text) have another.
fn tokenizer_fingerprint(tokenizer: &dyn PromptTokenizer) -> String {
    let mut hasher = Sha256::new();
    hasher.update(tokenizer.vocab_size().to_le_bytes());
    for token in 0..tokenizer.vocab_size() {
        let piece = tokenizer.piece(token, true);
        hasher.update((piece.len() as u32).to_le_bytes());
        hasher.update(&piece);
    }
    hex(&hasher.finalize()[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
