//! The entries replicas write to and read from Redis (`serve --share`), and how a reader checks
//! them. Everything read is untrusted: an entry from another model or namespace is *foreign*,
//! one that does not parse or breaks a limit is *malformed*; both are ignored and counted.
//!
//! - A response, on the stream `NAMESPACE:responses`: `replica` (the writer's id), `namespace`,
//!   `model` (the target's tokenizer fingerprint), `tokens` (the output token ids, 4 bytes
//!   each, little-endian).
//! - An update of the defaults, on the stream `NAMESPACE:updates`: `replica`, `namespace`,
//!   `generation` (from the counter `NAMESPACE:generation`), `update` (a [`SharedUpdate`] as
//!   JSON) and `signature` (HMAC-SHA256 of the generation and the update, keyed with the admin
//!   token, hex): a replica applies only updates signed with its own admin token, so writing to
//!   Redis is not enough to change the fleet's defaults. The plugin files an update names are
//!   under `NAMESPACE:plugin:SHA256`, checked against their sha256 when read.

use std::collections::{BTreeMap, HashMap};

use hmac::{Hmac, Mac};
use redis::Value;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::cascade::{CascadeMode, Token};

/// Largest update entry read, in bytes of JSON.
pub const MAX_UPDATE_BYTES: usize = 64 * 1024;

/// What a reader expects of every entry.
#[derive(Debug, Clone)]
pub struct Expected {
    /// This replica's id: its own entries are skipped.
    pub replica: String,
    /// The namespace shared.
    pub namespace: String,
    /// The target's tokenizer fingerprint.
    pub model: String,
    /// Every token must be below it.
    pub vocab_size: u32,
    /// Most tokens in a response.
    pub max_tokens: usize,
    /// The admin token, which signs updates; without one, updates are neither published nor
    /// applied.
    pub admin_token: Option<String>,
}

/// Why an entry was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// This replica wrote it.
    Own,
    /// Another namespace or model wrote it.
    Foreign,
    /// An update not signed with this replica's admin token (or this replica has none).
    Unsigned,
    /// It does not parse, or breaks a limit; says how.
    Malformed(String),
}

/// The fields of a response entry written by `replica`.
pub fn response_fields(expected: &Expected, tokens: &[Token]) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("replica", expected.replica.as_bytes().to_vec()),
        ("namespace", expected.namespace.as_bytes().to_vec()),
        ("model", expected.model.as_bytes().to_vec()),
        (
            "tokens",
            tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
        ),
    ]
}

/// The tokens of a response entry, or why it is skipped.
pub fn read_response(
    fields: &HashMap<String, Value>,
    expected: &Expected,
) -> Result<Vec<Token>, Skipped> {
    check_origin(fields, expected)?;
    if text(fields, "model")? != expected.model {
        return Err(Skipped::Foreign);
    }
    let bytes = bytes(fields, "tokens")?;
    if bytes.is_empty() || bytes.len() % 4 != 0 {
        return Err(Skipped::Malformed(format!(
            "`tokens` has {} bytes, not a positive multiple of 4",
            bytes.len()
        )));
    }
    if bytes.len() / 4 > expected.max_tokens {
        return Err(Skipped::Malformed(format!(
            "{} tokens, more than the context size {}",
            bytes.len() / 4,
            expected.max_tokens
        )));
    }
    let tokens: Vec<Token> = bytes
        .chunks_exact(4)
        .map(|b| Token::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some(bad) = tokens.iter().find(|&&t| t >= expected.vocab_size) {
        return Err(Skipped::Malformed(format!(
            "token {bad} is outside the vocabulary of {}",
            expected.vocab_size
        )));
    }
    Ok(tokens)
}

/// A replica's defaults as published: the default cascade with each plugin's version, the other
/// defaults and the configs of the loaded plugins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedUpdate {
    /// The default cascade, in order.
    pub cascade: Vec<PublishedPlugin>,
    /// Default draft length.
    pub draft_max: usize,
    /// Default cascade mode.
    pub mode: CascadeMode,
    /// Default policy settings (`name[,key=value...]`; for a policy file, its name stands for
    /// the file, which is `policy_file`).
    pub policy: Option<String>,
    /// The default policy's file, when it is not a built-in.
    pub policy_file: Option<PublishedPlugin>,
    /// Config strings of the loaded plugins, by name.
    pub plugin_configs: BTreeMap<String, String>,
}

/// A plugin version in a [`SharedUpdate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedPlugin {
    /// Its name (a built-in's, or the file stem).
    pub name: String,
    /// sha256 of its `.wasm`, hex: its bytes are under `NAMESPACE:plugin:SHA256`.
    pub sha256: String,
}

/// The fields of an update entry, signed with `admin_token`.
pub fn update_fields(
    expected: &Expected,
    admin_token: &str,
    generation: u64,
    update: &SharedUpdate,
) -> Vec<(&'static str, Vec<u8>)> {
    let json = serde_json::to_vec(update).expect("an update serializes");
    let signature = signer(admin_token, generation, &json)
        .finalize()
        .into_bytes();
    vec![
        ("replica", expected.replica.as_bytes().to_vec()),
        ("namespace", expected.namespace.as_bytes().to_vec()),
        ("generation", generation.to_string().into_bytes()),
        ("update", json),
        ("signature", super::hex(&signature).into_bytes()),
    ]
}

/// An HMAC-SHA256 keyed with `admin_token`, fed the generation and the update's JSON.
fn signer(admin_token: &str, generation: u64, json: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(admin_token.as_bytes()).expect("HMAC takes any key");
    mac.update(&generation.to_le_bytes());
    mac.update(json);
    mac
}

/// Checks an update's `signature` field against this replica's admin token.
fn check_signature(
    fields: &HashMap<String, Value>,
    expected: &Expected,
    generation: u64,
    json: &[u8],
) -> Result<(), Skipped> {
    let Some(admin_token) = &expected.admin_token else {
        return Err(Skipped::Unsigned);
    };
    let signature = text(fields, "signature").map_err(|_| Skipped::Unsigned)?;
    let bytes = (0..signature.len())
        .step_by(2)
        .map(|i| {
            signature
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or(Skipped::Unsigned)?;
    // `verify_slice` compares in constant time.
    signer(admin_token, generation, json)
        .verify_slice(&bytes)
        .map_err(|_| Skipped::Unsigned)
}

/// The generation and update of an update entry, or why it is skipped.
pub fn read_update(
    fields: &HashMap<String, Value>,
    expected: &Expected,
) -> Result<(u64, SharedUpdate), Skipped> {
    check_origin(fields, expected)?;
    let generation = text(fields, "generation")?
        .parse::<u64>()
        .map_err(|e| Skipped::Malformed(format!("`generation`: {e}")))?;
    let json = bytes(fields, "update")?;
    if json.len() > MAX_UPDATE_BYTES {
        return Err(Skipped::Malformed(format!(
            "`update` has {} bytes, more than {MAX_UPDATE_BYTES}",
            json.len()
        )));
    }
    check_signature(fields, expected, generation, json)?;
    let update: SharedUpdate =
        serde_json::from_slice(json).map_err(|e| Skipped::Malformed(format!("`update`: {e}")))?;
    let plugins = update.cascade.iter().chain(&update.policy_file);
    if let Some(bad) = plugins.clone().find(|p| !is_plugin_name(&p.name)) {
        return Err(Skipped::Malformed(format!(
            "plugin name {:?} is not a plain file stem",
            bad.name
        )));
    }
    if let Some(bad) = plugins.clone().find(|p| !is_sha256(&p.sha256)) {
        return Err(Skipped::Malformed(format!(
            "{:?} is not a sha256 in hex",
            bad.sha256
        )));
    }
    Ok((generation, update))
}

/// Own entries are skipped, and those of another namespace are foreign.
fn check_origin(fields: &HashMap<String, Value>, expected: &Expected) -> Result<(), Skipped> {
    if text(fields, "replica")? == expected.replica {
        return Err(Skipped::Own);
    }
    if text(fields, "namespace")? != expected.namespace {
        return Err(Skipped::Foreign);
    }
    Ok(())
}

fn bytes<'a>(fields: &'a HashMap<String, Value>, name: &str) -> Result<&'a [u8], Skipped> {
    match fields.get(name) {
        Some(Value::BulkString(bytes)) => Ok(bytes),
        Some(_) => Err(Skipped::Malformed(format!("`{name}` is not a string"))),
        None => Err(Skipped::Malformed(format!("no `{name}` field"))),
    }
}

fn text<'a>(fields: &'a HashMap<String, Value>, name: &str) -> Result<&'a str, Skipped> {
    std::str::from_utf8(bytes(fields, name)?)
        .map_err(|_| Skipped::Malformed(format!("`{name}` is not UTF-8")))
}

/// Whether `name` can be a plugin's file stem: no path, no dot files, not empty.
fn is_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether `hex` is a sha256 in lowercase hex.
pub fn is_sha256(hex: &str) -> bool {
    hex.len() == 64 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> Expected {
        Expected {
            replica: "me".into(),
            namespace: "ns".into(),
            model: "abc".into(),
            vocab_size: 100,
            max_tokens: 8,
            admin_token: Some("the-admin-token".into()),
        }
    }

    fn entry(fields: &[(&str, &[u8])]) -> HashMap<String, Value> {
        fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::BulkString(v.to_vec())))
            .collect()
    }

    fn written_by_other(fields: Vec<(&'static str, Vec<u8>)>) -> HashMap<String, Value> {
        let mut map: HashMap<String, Value> = fields
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::BulkString(v)))
            .collect();
        map.insert("replica".into(), Value::BulkString(b"other".to_vec()));
        map
    }

    #[test]
    fn a_response_reads_back_as_written_and_own_ones_are_skipped() {
        let fields = response_fields(&expected(), &[1, 99, 7]);
        let own: HashMap<String, Value> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::BulkString(v.clone())))
            .collect();
        assert_eq!(read_response(&own, &expected()), Err(Skipped::Own));
        let other = written_by_other(fields);
        assert_eq!(read_response(&other, &expected()), Ok(vec![1, 99, 7]));
    }

    #[test]
    fn foreign_and_malformed_responses_are_told_apart() {
        let base = |ns: &[u8], model: &[u8], tokens: &[u8]| {
            entry(&[
                ("replica", b"other"),
                ("namespace", ns),
                ("model", model),
                ("tokens", tokens),
            ])
        };
        let one = 1u32.to_le_bytes();
        assert_eq!(
            read_response(&base(b"other-ns", b"abc", &one), &expected()),
            Err(Skipped::Foreign)
        );
        assert_eq!(
            read_response(&base(b"ns", b"other-model", &one), &expected()),
            Err(Skipped::Foreign)
        );
        let malformed = |entry: HashMap<String, Value>| {
            matches!(
                read_response(&entry, &expected()),
                Err(Skipped::Malformed(_))
            )
        };
        assert!(
            malformed(base(b"ns", b"abc", &[1, 2, 3])),
            "not whole tokens"
        );
        assert!(malformed(base(b"ns", b"abc", &[])), "empty");
        assert!(
            malformed(base(b"ns", b"abc", &100u32.to_le_bytes())),
            "outside the vocabulary"
        );
        assert!(
            malformed(base(b"ns", b"abc", &[0; 36])),
            "longer than the context"
        );
        assert!(malformed(entry(&[
            ("replica", b"other"),
            ("namespace", b"ns")
        ])));
        let mut not_a_string = base(b"ns", b"abc", &one);
        not_a_string.insert("tokens".into(), Value::Int(3));
        assert!(malformed(not_a_string));
        assert!(malformed(base(b"ns", b"\xff", &one)), "not UTF-8");
    }

    #[test]
    fn an_update_reads_back_as_written_and_bad_ones_are_malformed() {
        let update = SharedUpdate {
            cascade: vec![PublishedPlugin {
                name: "suffix".into(),
                sha256: "a".repeat(64),
            }],
            draft_max: 8,
            mode: CascadeMode::default(),
            policy: Some("fixed,k=4".into()),
            policy_file: None,
            plugin_configs: BTreeMap::from([("suffix".into(), "max_depth=32".into())]),
        };
        let other = written_by_other(update_fields(&expected(), "the-admin-token", 7, &update));
        assert_eq!(read_update(&other, &expected()), Ok((7, update.clone())));
        let forged = written_by_other(update_fields(&expected(), "a-guess", 7, &update));
        assert_eq!(read_update(&forged, &expected()), Err(Skipped::Unsigned));
        let mut replayed = other.clone();
        replayed.insert("generation".into(), Value::BulkString(b"8".to_vec()));
        assert_eq!(
            read_update(&replayed, &expected()),
            Err(Skipped::Unsigned),
            "the signature covers the generation"
        );
        let without_token = Expected {
            admin_token: None,
            ..expected()
        };
        assert_eq!(read_update(&other, &without_token), Err(Skipped::Unsigned));

        let mut sneaky = update.clone();
        sneaky.cascade[0].name = "../../etc/passwd".into();
        let entry = written_by_other(update_fields(&expected(), "the-admin-token", 8, &sneaky));
        assert!(matches!(
            read_update(&entry, &expected()),
            Err(Skipped::Malformed(_))
        ));
        let mut bad_hash = update;
        bad_hash.cascade[0].sha256 = "xyz".into();
        let entry = written_by_other(update_fields(&expected(), "the-admin-token", 8, &bad_hash));
        assert!(matches!(
            read_update(&entry, &expected()),
            Err(Skipped::Malformed(_))
        ));
        let garbage = entry_with_update(b"{\"cascade\": 3}");
        assert_eq!(
            read_update(&garbage, &expected()),
            Err(Skipped::Unsigned),
            "unsigned entries are not even parsed"
        );
    }

    fn entry_with_update(json: &[u8]) -> HashMap<String, Value> {
        entry(&[
            ("replica", b"other"),
            ("namespace", b"ns"),
            ("generation", b"9"),
            ("update", json),
        ])
    }
}
