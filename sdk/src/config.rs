//! A parser for a plugin's configuration string.
//!
//! The host passes each plugin its settings as `key=value` pairs separated by `,`, for example
//! `min_ngram=2, max_ngram=4`. Whitespace around keys and values is ignored, empty entries
//! (a trailing comma) are skipped, and an empty string means "no settings". Values are plain
//! text: no quoting, so a value cannot contain `,`.
//!
//! Parse once, in [`Drafter::new`](crate::Drafter::new), into typed fields, then call
//! [`Config::finish`] so that a misspelt key is an error instead of a silently ignored setting:
//!
//! ```
//! use spechost_sdk::config::Config;
//!
//! fn parse(config: &str) -> Result<(usize, f32), String> {
//!     let config = Config::parse(config)?;
//!     let max_len = config.get_usize("max_len", 8)?;
//!     let min_prob = config.get_f32("min_prob", 0.5)?;
//!     config.finish()?;
//!     Ok((max_len, min_prob))
//! }
//!
//! assert_eq!(parse(""), Ok((8, 0.5)));
//! assert_eq!(parse("min_prob = 0.7"), Ok((8, 0.7)));
//! assert!(parse("max_lne=4").unwrap_err().contains("unknown setting `max_lne`"));
//! ```
//!
//! Every error message names the key, the offending value and what to write instead; the host
//! shows it to the user prefixed with the plugin's name.

use std::cell::RefCell;
use std::str::FromStr;

/// Parsed `key=value` settings, with a record of which keys the plugin asked for.
#[derive(Debug, Clone, Default)]
pub struct Config {
    entries: Vec<Entry>,
    /// Every key a getter was called with, given or not, in first-asked order: the known keys
    /// that [`Config::finish`] checks against and lists.
    asked: RefCell<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Entry {
    key: String,
    value: String,
}

/// How to write settings, appended to syntax errors.
const SYNTAX_HINT: &str = "write settings as `key=value` pairs separated by `,`, e.g. `a=1,b=2`";

impl Config {
    /// Splits `config` into `key=value` entries.
    ///
    /// Fails on an entry without `=`, an empty key, or a key given twice.
    pub fn parse(config: &str) -> Result<Self, String> {
        let mut entries: Vec<Entry> = Vec::new();
        for item in config.split(',').map(str::trim) {
            if item.is_empty() {
                continue;
            }
            let Some((key, value)) = item.split_once('=') else {
                return Err(format!("setting `{item}` has no `=`; {SYNTAX_HINT}"));
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return Err(format!(
                    "setting `{item}` has no key before `=`; {SYNTAX_HINT}"
                ));
            }
            if let Some(earlier) = entries.iter().find(|entry| entry.key == key) {
                return Err(format!(
                    "setting `{key}` is given twice (`{}` and `{value}`); keep only one",
                    earlier.value
                ));
            }
            entries.push(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            });
        }
        Ok(Self {
            entries,
            asked: RefCell::default(),
        })
    }

    /// Whether no settings were given.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The raw value of `key`, if it was given. Records `key` as known to [`Config::finish`].
    pub fn get(&self, key: &str) -> Option<&str> {
        let mut asked = self.asked.borrow_mut();
        if !asked.iter().any(|known| known == key) {
            asked.push(key.to_owned());
        }
        let entry = self.entries.iter().find(|entry| entry.key == key)?;
        Some(&entry.value)
    }

    /// The value of `key` as text, or `default` when it was not given.
    pub fn get_str<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// The value of `key` as a non-negative integer, or `default` when it was not given.
    pub fn get_usize(&self, key: &str, default: usize) -> Result<usize, String> {
        self.get_parsed(key, default, "a non-negative integer, e.g. `4`")
    }

    /// The value of `key` as a `u32`, or `default` when it was not given.
    pub fn get_u32(&self, key: &str, default: u32) -> Result<u32, String> {
        self.get_parsed(key, default, "a non-negative integer below 2^32, e.g. `4`")
    }

    /// The value of `key` as a finite number, or `default` when it was not given.
    pub fn get_f32(&self, key: &str, default: f32) -> Result<f32, String> {
        let expected = "a finite number, e.g. `0.5`";
        let value: f32 = self.get_parsed(key, default, expected)?;
        if value.is_finite() {
            Ok(value)
        } else {
            Err(bad_value(key, &value.to_string(), expected))
        }
    }

    /// The value of `key` as a fraction in `[0, 1]` (a rate or a probability), or `default` when
    /// it was not given.
    pub fn get_fraction(&self, key: &str, default: f32) -> Result<f32, String> {
        let expected = "a number from 0 to 1, e.g. `0.5`";
        let value: f32 = self.get_parsed(key, default, expected)?;
        if (0.0..=1.0).contains(&value) {
            Ok(value)
        } else {
            Err(bad_value(key, &value.to_string(), expected))
        }
    }

    /// The value of `key` as a boolean (`true`/`false`, `yes`/`no`, `on`/`off` or `1`/`0`), or
    /// `default` when it was not given.
    pub fn get_bool(&self, key: &str, default: bool) -> Result<bool, String> {
        let Some(value) = self.get(key) else {
            return Ok(default);
        };
        match value.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Ok(true),
            "false" | "no" | "off" | "0" => Ok(false),
            _ => Err(bad_value(key, value, "`true` or `false`")),
        }
    }

    /// Fails if a key was given that no getter asked for, naming it and listing the keys the
    /// getters asked for. Call it after reading every setting.
    pub fn finish(&self) -> Result<(), String> {
        let asked = self.asked.borrow();
        let known: Vec<&str> = asked.iter().map(String::as_str).collect();
        self.reject_unknown(&known)
    }

    /// Fails if a key was given that is not in `known`, naming it and listing `known`.
    ///
    /// Unlike [`Config::finish`], this does not depend on which getters ran, so it suits
    /// plugins that read some keys only conditionally.
    pub fn reject_unknown(&self, known: &[&str]) -> Result<(), String> {
        for entry in &self.entries {
            if !known.contains(&entry.key.as_str()) {
                return Err(unknown_key(entry, known));
            }
        }
        Ok(())
    }

    fn get_parsed<T: FromStr>(&self, key: &str, default: T, expected: &str) -> Result<T, String> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => value.parse().map_err(|_| bad_value(key, value, expected)),
        }
    }
}

fn bad_value(key: &str, value: &str, expected: &str) -> String {
    format!("setting `{key}` has value `{value}`, expected {expected}")
}

fn unknown_key(entry: &Entry, known: &[&str]) -> String {
    let Entry { key, value, .. } = entry;
    if known.is_empty() {
        return format!("unknown setting `{key}` (value `{value}`); this plugin takes no settings");
    }
    let known = known
        .iter()
        .map(|key| format!("`{key}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("unknown setting `{key}` (value `{value}`); known settings are {known}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_blank_strings_have_no_settings() {
        for text in ["", "  ", ",", " , ,"] {
            let config = Config::parse(text).expect("blank config parses");
            assert!(config.is_empty(), "{text:?} parsed as {config:?}");
            assert_eq!(config.finish(), Ok(()));
        }
    }

    #[test]
    fn trims_keys_and_values() {
        let config = Config::parse(" a = 1 ,b=two,  c= ").expect("valid config");
        assert_eq!(config.get("a"), Some("1"));
        assert_eq!(config.get_str("b", "x"), "two");
        assert_eq!(config.get("c"), Some(""));
        assert_eq!(config.get("d"), None);
    }

    #[test]
    fn getters_return_defaults_for_missing_keys() {
        let config = Config::parse("").expect("empty config");
        assert_eq!(config.get_usize("n", 3), Ok(3));
        assert_eq!(config.get_u32("n", 4), Ok(4));
        assert_eq!(config.get_f32("p", 0.25), Ok(0.25));
        assert_eq!(config.get_bool("b", true), Ok(true));
        assert_eq!(config.get_str("s", "dflt"), "dflt");
    }

    #[test]
    fn getters_parse_values() {
        let config = Config::parse("n=7,m=9,p=0.75,yes=on,no=0,loud=TRUE").expect("valid config");
        assert_eq!(config.get_usize("n", 0), Ok(7));
        assert_eq!(config.get_u32("m", 0), Ok(9));
        assert_eq!(config.get_f32("p", 0.0), Ok(0.75));
        assert_eq!(config.get_bool("yes", false), Ok(true));
        assert_eq!(config.get_bool("no", true), Ok(false));
        assert_eq!(config.get_bool("loud", false), Ok(true));
    }

    #[test]
    fn bad_values_name_key_value_and_expectation() {
        let config = Config::parse("n=-2,p=abc,q=NaN,b=maybe").expect("valid syntax");
        let error = config.get_usize("n", 0).unwrap_err();
        assert!(error.contains("`n`") && error.contains("`-2`"), "{error}");
        assert!(error.contains("non-negative integer"), "{error}");
        let error = config.get_f32("p", 0.0).unwrap_err();
        assert!(error.contains("`p`") && error.contains("`abc`"), "{error}");
        let error = config.get_f32("q", 0.0).unwrap_err();
        assert!(error.contains("`q`") && error.contains("finite"), "{error}");
        let error = config.get_bool("b", false).unwrap_err();
        assert!(
            error.contains("`maybe`") && error.contains("`true` or `false`"),
            "{error}"
        );
    }

    #[test]
    fn fractions_must_lie_in_zero_one() {
        let config = Config::parse("a=0,b=1,c=0.25,d=1.5,e=-0.1,f=NaN").expect("valid syntax");
        assert_eq!(config.get_fraction("a", 0.5), Ok(0.0));
        assert_eq!(config.get_fraction("b", 0.5), Ok(1.0));
        assert_eq!(config.get_fraction("c", 0.5), Ok(0.25));
        assert_eq!(config.get_fraction("missing", 0.5), Ok(0.5));
        for key in ["d", "e", "f"] {
            let error = config.get_fraction(key, 0.5).unwrap_err();
            assert!(
                error.contains(&format!("`{key}`")) && error.contains("from 0 to 1"),
                "{error}"
            );
        }
    }

    #[test]
    fn rejects_syntax_errors() {
        let error = Config::parse("a=1,oops").unwrap_err();
        assert!(
            error.contains("`oops` has no `=`") && error.contains("key=value"),
            "{error}"
        );
        let error = Config::parse("=3").unwrap_err();
        assert!(error.contains("no key"), "{error}");
        let error = Config::parse("a=1, a=2").unwrap_err();
        assert!(
            error.contains("`a` is given twice") && error.contains("`1` and `2`"),
            "{error}"
        );
    }

    #[test]
    fn finish_rejects_keys_no_getter_asked_for() {
        let config = Config::parse("min=1,mxa=4").expect("valid config");
        config.get_usize("min", 0).expect("valid min");
        config.get_usize("max", 0).expect("absent max");
        config.get_usize("min", 0).expect("asking twice is fine");
        assert_eq!(
            config.finish(),
            Err("unknown setting `mxa` (value `4`); known settings are `min`, `max`".to_owned())
        );
    }

    #[test]
    fn finish_accepts_when_every_key_was_read() {
        let config = Config::parse("a=1,b=x").expect("valid config");
        config.get_usize("a", 0).expect("valid a");
        config.get_str("b", "");
        assert_eq!(config.finish(), Ok(()));
    }

    #[test]
    fn reject_unknown_lists_known_keys() {
        let config = Config::parse("min_ngram=2,max_ngarm=4").expect("valid config");
        let error = config
            .reject_unknown(&["min_ngram", "max_ngram"])
            .unwrap_err();
        assert_eq!(
            error,
            "unknown setting `max_ngarm` (value `4`); known settings are `min_ngram`, `max_ngram`"
        );
        assert_eq!(config.reject_unknown(&["min_ngram", "max_ngarm"]), Ok(()));
        let error = config.reject_unknown(&[]).unwrap_err();
        assert!(error.contains("takes no settings"), "{error}");
    }
}
