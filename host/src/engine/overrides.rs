//! Model metadata overrides: llama.cpp's `--override-kv KEY=TYPE:VALUE`, and `--experts N`, which
//! finds the architecture's `expert_used_count` key (a mixture-of-experts model then routes each
//! token through N experts: the seeds' expert reduction, seed 002 Track 2).
//!
//! Every override is checked against the GGUF's own metadata before the model loads: a key the
//! model lacks, a value of another type, or more experts than the model has is an error naming
//! the fix, never a setting llama.cpp would silently ignore.

use std::ffi::CString;
use std::path::Path;
use std::pin::Pin;
use std::str::FromStr;

use llama_cpp_2::gguf::GgufContext;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::params::kv_overrides::ParamOverrideValue;
use llama_cpp_sys_2 as sys;

/// A metadata value, typed as llama.cpp's overrides are.
#[derive(Debug, Clone, PartialEq)]
pub enum KvValue {
    /// `int:` any integer key.
    Int(i64),
    /// `float:` a floating-point key.
    Float(f64),
    /// `bool:` `true` or `false`.
    Bool(bool),
    /// `str:` a string of at most 127 bytes.
    Str(String),
}

impl KvValue {
    /// The type's name in `KEY=TYPE:VALUE`.
    fn type_name(&self) -> &'static str {
        match self {
            Self::Int(_) => "int",
            Self::Float(_) => "float",
            Self::Bool(_) => "bool",
            Self::Str(_) => "str",
        }
    }

    /// Whether a GGUF value of type `kind` takes this override.
    fn fits(&self, kind: sys::gguf_type) -> bool {
        match self {
            Self::Int(_) => [
                sys::GGUF_TYPE_UINT8,
                sys::GGUF_TYPE_INT8,
                sys::GGUF_TYPE_UINT16,
                sys::GGUF_TYPE_INT16,
                sys::GGUF_TYPE_UINT32,
                sys::GGUF_TYPE_INT32,
                sys::GGUF_TYPE_UINT64,
                sys::GGUF_TYPE_INT64,
            ]
            .contains(&kind),
            Self::Float(_) => [sys::GGUF_TYPE_FLOAT32, sys::GGUF_TYPE_FLOAT64].contains(&kind),
            Self::Bool(_) => kind == sys::GGUF_TYPE_BOOL,
            Self::Str(_) => kind == sys::GGUF_TYPE_STRING,
        }
    }
}

/// One `--override-kv KEY=TYPE:VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvOverride {
    /// The metadata key (`qwen3moe.expert_used_count`).
    pub key: String,
    /// Its new value.
    pub value: KvValue,
}

/// Longest key or string value llama.cpp's override holds (its arrays are 128 bytes with the
/// terminating NUL).
const MAX_OVERRIDE_BYTES: usize = 127;

impl FromStr for KvOverride {
    type Err = OverrideError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let syntax = |problem: &str| OverrideError::Syntax {
            given: given.to_owned(),
            problem: problem.to_owned(),
        };
        let (key, typed) = given
            .split_once('=')
            .ok_or_else(|| syntax("it has no `=`"))?;
        let (kind, value) = typed
            .split_once(':')
            .ok_or_else(|| syntax("the value has no `TYPE:`"))?;
        if key.is_empty() || key.len() > MAX_OVERRIDE_BYTES || key.contains('\0') {
            return Err(syntax("the key must be 1 to 127 bytes"));
        }
        let value = match kind {
            "int" => KvValue::Int(value.parse().map_err(|_| syntax("not an integer"))?),
            "float" => KvValue::Float(value.parse().map_err(|_| syntax("not a number"))?),
            "bool" => KvValue::Bool(match value {
                "true" => true,
                "false" => false,
                _ => return Err(syntax("a bool is `true` or `false`")),
            }),
            "str" if value.len() <= MAX_OVERRIDE_BYTES && !value.contains('\0') => {
                KvValue::Str(value.to_owned())
            }
            "str" => return Err(syntax("a string is at most 127 bytes")),
            _ => return Err(syntax("TYPE is `int`, `float`, `bool` or `str`")),
        };
        Ok(Self {
            key: key.to_owned(),
            value,
        })
    }
}

/// What a model is loaded with besides its file: metadata overrides and the experts used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelOverrides {
    /// `--override-kv`, in the order given.
    pub kv: Vec<KvOverride>,
    /// `--experts N`: experts per token of a mixture of experts.
    pub experts: Option<u32>,
}

/// Why an override cannot apply. Every message says what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverrideError {
    /// Not `KEY=TYPE:VALUE`.
    #[error(
        "invalid --override-kv `{given}`: {problem}; write KEY=TYPE:VALUE with TYPE int, float, bool or str, e.g. qwen3moe.expert_used_count=int:4"
    )]
    Syntax {
        /// What was given.
        given: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The model has no such key.
    #[error(
        "--override-kv {key}: {model} has no such key; `spechost info --model {model}` lists its architecture's keys"
    )]
    MissingKey {
        /// The key.
        key: String,
        /// The model file.
        model: String,
    },
    /// The value's type is not the key's.
    #[error(
        "--override-kv {key}: the model stores it as {stored}, not {given}; give it as {stored}"
    )]
    WrongType {
        /// The key.
        key: String,
        /// The type given (`int`, ...).
        given: &'static str,
        /// The type that fits the stored value.
        stored: &'static str,
    },
    /// `--experts` on a model without experts.
    #[error(
        "--experts: {model} is not a mixture of experts (its architecture `{arch}` has no {arch}.expert_used_count); drop --experts"
    )]
    NotMixture {
        /// The model file.
        model: String,
        /// Its architecture.
        arch: String,
    },
    /// `--experts` out of the model's range.
    #[error("--experts {given}: {model} has {experts} experts; give 1 to {experts}")]
    Experts {
        /// What was given.
        given: u32,
        /// The model file.
        model: String,
        /// How many experts it has.
        experts: u32,
    },
    /// `--experts` and an `--override-kv` of the same key.
    #[error("--experts and --override-kv both set {key}; give one of them")]
    Twice {
        /// The key.
        key: String,
    },
    /// The file's metadata cannot be read.
    #[error("cannot read the metadata of {model}; check that it is a GGUF file")]
    Unreadable {
        /// The model file.
        model: String,
    },
}

/// What a model's GGUF says about its architecture and experts (`spechost info --model`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArchitectureFacts {
    /// `general.architecture`.
    pub arch: String,
    /// Experts of a mixture of experts (`None` for a dense model).
    pub experts: Option<u32>,
    /// Experts each token goes through, as stored in the file.
    pub experts_used: Option<u32>,
}

impl ArchitectureFacts {
    /// Reads them from the GGUF at `path` (metadata only).
    pub fn read(path: &Path) -> Result<Self, OverrideError> {
        let gguf = open(path)?;
        Ok(Self::of(&gguf))
    }

    /// The architecture's metadata keys (`ARCH.*`), with their values where they are
    /// numbers or strings: what `--override-kv` can set.
    pub fn keys(path: &Path) -> Result<Vec<(String, String)>, OverrideError> {
        let gguf = open(path)?;
        let arch = Self::of(&gguf).arch;
        let prefix = format!("{arch}.");
        Ok((0..gguf.n_kv())
            .filter_map(|index| {
                let key = gguf.key_at(index)?;
                key.starts_with(&prefix).then(|| {
                    let value = match gguf.kv_type(index) {
                        sys::GGUF_TYPE_UINT32 => gguf.val_u32(index).to_string(),
                        sys::GGUF_TYPE_INT32 => gguf.val_i32(index).to_string(),
                        sys::GGUF_TYPE_UINT64 => gguf.val_u64(index).to_string(),
                        sys::GGUF_TYPE_STRING => gguf.val_str(index).unwrap_or("").to_owned(),
                        kind => format!("({})", stored_type(kind)),
                    };
                    (key.to_owned(), value)
                })
            })
            .collect())
    }

    fn of(gguf: &GgufContext) -> Self {
        let arch = string(gguf, "general.architecture").unwrap_or_default();
        let count = |suffix: &str| unsigned(gguf, &format!("{arch}.{suffix}"));
        Self {
            experts: count("expert_count").filter(|&n| n > 0),
            experts_used: count("expert_used_count").filter(|&n| n > 0),
            arch,
        }
    }
}

impl ModelOverrides {
    /// Checks every override against the GGUF at `path`, and returns them with `--experts`
    /// turned into its key's override.
    pub fn resolve(&self, path: &Path) -> Result<Vec<KvOverride>, OverrideError> {
        if self.kv.is_empty() && self.experts.is_none() {
            return Ok(Vec::new());
        }
        let model = path.display().to_string();
        let gguf = open(path)?;
        let mut resolved = Vec::with_capacity(self.kv.len() + 1);
        for kv in &self.kv {
            let index = gguf.find_key(&kv.key);
            if index < 0 {
                return Err(OverrideError::MissingKey {
                    key: kv.key.clone(),
                    model,
                });
            }
            let kind = gguf.kv_type(index);
            if !kv.value.fits(kind) {
                return Err(OverrideError::WrongType {
                    key: kv.key.clone(),
                    given: kv.value.type_name(),
                    stored: stored_type(kind),
                });
            }
            resolved.push(kv.clone());
        }
        if let Some(experts) = self.experts {
            let facts = ArchitectureFacts::of(&gguf);
            let key = format!("{}.expert_used_count", facts.arch);
            let Some(count) = facts.experts.filter(|_| gguf.find_key(&key) >= 0) else {
                return Err(OverrideError::NotMixture {
                    model,
                    arch: facts.arch,
                });
            };
            if experts == 0 || experts > count {
                return Err(OverrideError::Experts {
                    given: experts,
                    model,
                    experts: count,
                });
            }
            if resolved.iter().any(|kv| kv.key == key) {
                return Err(OverrideError::Twice { key });
            }
            resolved.push(KvOverride {
                key,
                value: KvValue::Int(i64::from(experts)),
            });
        }
        Ok(resolved)
    }
}

/// `params` with `overrides` applied, pinned as llama.cpp's override list must be.
pub(super) fn model_params(
    params: LlamaModelParams,
    overrides: &[KvOverride],
) -> Pin<Box<LlamaModelParams>> {
    let mut params = Box::pin(params);
    for kv in overrides {
        let key = CString::new(kv.key.as_str()).expect("checked: no NUL in the key");
        let value = match &kv.value {
            KvValue::Int(value) => ParamOverrideValue::Int(*value),
            KvValue::Float(value) => ParamOverrideValue::Float(*value),
            KvValue::Bool(value) => ParamOverrideValue::Bool(*value),
            KvValue::Str(value) => {
                let mut bytes = [0; 128];
                for (slot, &byte) in bytes.iter_mut().zip(value.as_bytes()) {
                    *slot = byte as std::os::raw::c_char;
                }
                ParamOverrideValue::Str(bytes)
            }
        };
        params.as_mut().append_kv_override(&key, value);
    }
    params
}

fn open(path: &Path) -> Result<GgufContext, OverrideError> {
    GgufContext::from_file(path).ok_or_else(|| OverrideError::Unreadable {
        model: path.display().to_string(),
    })
}

fn string(gguf: &GgufContext, key: &str) -> Option<String> {
    let index = gguf.find_key(key);
    (index >= 0 && gguf.kv_type(index) == sys::GGUF_TYPE_STRING)
        .then(|| gguf.val_str(index).map(str::to_owned))
        .flatten()
}

fn unsigned(gguf: &GgufContext, key: &str) -> Option<u32> {
    let index = gguf.find_key(key);
    if index < 0 {
        return None;
    }
    match gguf.kv_type(index) {
        sys::GGUF_TYPE_UINT32 => Some(gguf.val_u32(index)),
        sys::GGUF_TYPE_INT32 => u32::try_from(gguf.val_i32(index)).ok(),
        _ => None,
    }
}

/// The override type that fits a stored value of type `kind`.
fn stored_type(kind: sys::gguf_type) -> &'static str {
    match kind {
        sys::GGUF_TYPE_FLOAT32 | sys::GGUF_TYPE_FLOAT64 => "float",
        sys::GGUF_TYPE_BOOL => "bool",
        sys::GGUF_TYPE_STRING => "str",
        sys::GGUF_TYPE_ARRAY => "an array (which cannot be overridden)",
        _ => "int",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_as_llama_cpp_writes_them() {
        let parsed: KvOverride = "qwen3moe.expert_used_count=int:4".parse().expect("valid");
        assert_eq!(parsed.key, "qwen3moe.expert_used_count");
        assert_eq!(parsed.value, KvValue::Int(4));
        for (given, value) in [
            ("a.b=float:1e-5", KvValue::Float(1e-5)),
            ("a.b=bool:true", KvValue::Bool(true)),
            ("a.b=str:x=y:z", KvValue::Str("x=y:z".into())),
        ] {
            assert_eq!(given.parse::<KvOverride>().expect(given).value, value);
        }
        for (given, needle) in [
            ("a.b", "no `=`"),
            ("a.b=4", "no `TYPE:`"),
            ("=int:4", "1 to 127 bytes"),
            ("a.b=int:four", "not an integer"),
            ("a.b=bool:yes", "`true` or `false`"),
            ("a.b=u32:4", "`int`, `float`, `bool` or `str`"),
        ] {
            let error = given.parse::<KvOverride>().expect_err(given).to_string();
            assert!(
                error.contains(needle) && error.contains("KEY=TYPE:VALUE"),
                "{given}: {error}"
            );
        }
        let long = format!("a.b=str:{}", "x".repeat(128));
        assert!(long.parse::<KvOverride>().is_err());
    }

    #[test]
    fn values_fit_the_stored_types() {
        assert!(KvValue::Int(1).fits(sys::GGUF_TYPE_UINT32));
        assert!(!KvValue::Int(1).fits(sys::GGUF_TYPE_FLOAT32));
        assert!(KvValue::Float(1.0).fits(sys::GGUF_TYPE_FLOAT32));
        assert!(!KvValue::Bool(true).fits(sys::GGUF_TYPE_STRING));
        assert_eq!(stored_type(sys::GGUF_TYPE_FLOAT32), "float");
    }
}
