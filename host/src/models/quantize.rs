//! `spechost models quantize`: requantizes a GGUF with llama.cpp's quantize API, to make a
//! cheaper draft model that shares the target's tokenizer, and the default drafts made that way.
//!
//! The output is written next to its final name and renamed into place, so a file at the final
//! name is always complete. It records how it was made in its metadata ([`RECIPE_KEY`]), and a
//! file already there with the same recipe is reused. Quantizing a model that is already
//! quantized (the default models are) loses more than quantizing from F16 would, which is
//! acceptable for a draft model: the target verifies every drafted token.
//!
//! The token embeddings of small models are a large share of the work per token (Gemma 3 270M:
//! 168M of its 268M weights, used again as the output matrix), and llama.cpp keeps them at Q8_0
//! whatever the type asked for when the rows do not fit its K-quant blocks. `--embeddings` sets
//! their type, which is what makes a requantized draft clearly cheaper than its target.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use llama_cpp_2::gguf::GgufContext;
use llama_cpp_sys_2 as sys;

use super::DefaultModel;
use crate::engine::{EngineError, started_backend};

/// GGUF metadata key in which a quantized file records its recipe ([`QuantizeRequest::recipe`]).
pub const RECIPE_KEY: &str = "spechost.quantize.recipe";

/// The types `spechost models quantize` makes: llama.cpp's quantization types that need no
/// importance matrix (the `IQ*` and `Q2_K_S` types do, and spechost has none to give), and the
/// float types, which dequantize: a quantized model's higher-precision copy, verified with the
/// quantized one as its draft (self-speculation), has the same tokenizer by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "verbatim")]
#[allow(non_camel_case_types)] // the names are llama.cpp's, as users type them
pub enum QuantType {
    /// 4.5 bits per weight, one scale per 32 weights.
    Q4_0,
    /// 5 bits per weight, a scale and a minimum per 32 weights.
    Q4_1,
    /// 5.5 bits per weight.
    Q5_0,
    /// 6 bits per weight.
    Q5_1,
    /// 8.5 bits per weight.
    Q8_0,
    /// K-quant mix around 2.6 bits per weight.
    Q2_K,
    /// K-quant mix around 3.4 bits per weight, small.
    Q3_K_S,
    /// K-quant mix around 3.9 bits per weight, medium.
    Q3_K_M,
    /// K-quant mix around 4.3 bits per weight, large.
    Q3_K_L,
    /// K-quant mix around 4.6 bits per weight, small.
    Q4_K_S,
    /// K-quant mix around 4.9 bits per weight, medium.
    Q4_K_M,
    /// K-quant mix around 5.5 bits per weight, small.
    Q5_K_S,
    /// K-quant mix around 5.7 bits per weight, medium.
    Q5_K_M,
    /// 6.6 bits per weight.
    Q6_K,
    /// 16-bit floats (dequantized).
    F16,
    /// bfloat16 (dequantized).
    BF16,
    /// 32-bit floats, every tensor (dequantized).
    F32,
}

impl QuantType {
    /// The name llama.cpp and file names use (`Q4_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K_S => "Q3_K_S",
            Self::Q3_K_M => "Q3_K_M",
            Self::Q3_K_L => "Q3_K_L",
            Self::Q4_K_S => "Q4_K_S",
            Self::Q4_K_M => "Q4_K_M",
            Self::Q5_K_S => "Q5_K_S",
            Self::Q5_K_M => "Q5_K_M",
            Self::Q6_K => "Q6_K",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::F32 => "F32",
        }
    }

    /// llama.cpp's `llama_ftype` for this type.
    fn ftype(self) -> sys::llama_ftype {
        match self {
            Self::Q4_0 => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
            Self::Q4_1 => sys::LLAMA_FTYPE_MOSTLY_Q4_1,
            Self::Q5_0 => sys::LLAMA_FTYPE_MOSTLY_Q5_0,
            Self::Q5_1 => sys::LLAMA_FTYPE_MOSTLY_Q5_1,
            Self::Q8_0 => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
            Self::Q2_K => sys::LLAMA_FTYPE_MOSTLY_Q2_K,
            Self::Q3_K_S => sys::LLAMA_FTYPE_MOSTLY_Q3_K_S,
            Self::Q3_K_M => sys::LLAMA_FTYPE_MOSTLY_Q3_K_M,
            Self::Q3_K_L => sys::LLAMA_FTYPE_MOSTLY_Q3_K_L,
            Self::Q4_K_S => sys::LLAMA_FTYPE_MOSTLY_Q4_K_S,
            Self::Q4_K_M => sys::LLAMA_FTYPE_MOSTLY_Q4_K_M,
            Self::Q5_K_S => sys::LLAMA_FTYPE_MOSTLY_Q5_K_S,
            Self::Q5_K_M => sys::LLAMA_FTYPE_MOSTLY_Q5_K_M,
            Self::Q6_K => sys::LLAMA_FTYPE_MOSTLY_Q6_K,
            Self::F16 => sys::LLAMA_FTYPE_MOSTLY_F16,
            Self::BF16 => sys::LLAMA_FTYPE_MOSTLY_BF16,
            Self::F32 => sys::LLAMA_FTYPE_ALL_F32,
        }
    }
}

/// Types for the token embeddings (and the output matrix): the block-32 types, which fit the
/// row length of every model (K-quants need rows of a multiple of 256).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "verbatim")]
#[allow(non_camel_case_types)] // the names are llama.cpp's, as users type them
pub enum EmbeddingsType {
    /// 4.5 bits per weight.
    Q4_0,
    /// 5 bits per weight.
    Q4_1,
    /// 5.5 bits per weight.
    Q5_0,
    /// 6 bits per weight.
    Q5_1,
    /// 8.5 bits per weight (what llama.cpp picks for small models).
    Q8_0,
}

impl EmbeddingsType {
    /// The name llama.cpp and file names use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
        }
    }

    fn ggml_type(self) -> sys::ggml_type {
        match self {
            Self::Q4_0 => sys::GGML_TYPE_Q4_0,
            Self::Q4_1 => sys::GGML_TYPE_Q4_1,
            Self::Q5_0 => sys::GGML_TYPE_Q5_0,
            Self::Q5_1 => sys::GGML_TYPE_Q5_1,
            Self::Q8_0 => sys::GGML_TYPE_Q8_0,
        }
    }
}

/// One requantization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeRequest {
    /// The GGUF to read.
    pub input: PathBuf,
    /// Where to write the result.
    pub output: PathBuf,
    /// The type to quantize to.
    pub quant_type: QuantType,
    /// The type of the token embeddings and output matrix; `None` leaves it to llama.cpp.
    pub embeddings: Option<EmbeddingsType>,
    /// Threads llama.cpp quantizes with.
    pub threads: usize,
}

impl QuantizeRequest {
    /// How the output is made, as recorded under [`RECIPE_KEY`]: `Q4_0`, or
    /// `Q4_0+embeddings=Q4_0`.
    pub fn recipe(&self) -> String {
        match self.embeddings {
            None => self.quant_type.name().to_owned(),
            Some(embeddings) => format!(
                "{}+embeddings={}",
                self.quant_type.name(),
                embeddings.name()
            ),
        }
    }
}

/// What [`quantize`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantized {
    /// The output was written.
    Written,
    /// The output was already there, made with the same recipe, and was kept.
    AlreadyThere,
}

/// Why a model could not be quantized. Every message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizeError {
    /// The input is missing or not a GGUF file llama.cpp can read.
    #[error(
        "cannot quantize {path}: it is missing or not a GGUF file; pass --model a .gguf path or a default model fetched with `spechost models fetch`"
    )]
    Input {
        /// The input path.
        path: PathBuf,
    },
    /// Input and output are the same file.
    #[error("--out {path} is the input model; write the quantized model to another file")]
    SameFile {
        /// The path given twice.
        path: PathBuf,
    },
    /// A path cannot be passed to llama.cpp.
    #[error("{path} contains a NUL byte; rename it")]
    Path {
        /// The offending path.
        path: PathBuf,
    },
    /// A file system operation failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// llama.cpp failed.
    #[error(
        "llama.cpp could not quantize {input} as {recipe}; check that the disk has room for {output}"
    )]
    Failed {
        /// The input path.
        input: PathBuf,
        /// The output path.
        output: PathBuf,
        /// The requested recipe.
        recipe: String,
    },
    /// llama.cpp could not be initialised.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Where `spechost models quantize` writes by default:
/// `<cache>/models/<input stem>.<TYPE>[-emb<TYPE>].gguf`.
pub fn default_output(
    cache_dir: &Path,
    input: &Path,
    quant_type: QuantType,
    embeddings: Option<EmbeddingsType>,
) -> PathBuf {
    let stem = input
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let embeddings = embeddings.map_or_else(String::new, |e| format!("-emb{}", e.name()));
    cache_dir
        .join("models")
        .join(format!("{stem}.{}{embeddings}.gguf", quant_type.name()))
}

/// Quantizes `request.input` as the request says, at `request.output`, unless the output is
/// already a file made with the same recipe.
pub fn quantize(request: &QuantizeRequest) -> Result<Quantized, QuantizeError> {
    let QuantizeRequest {
        input,
        output,
        quant_type,
        ..
    } = request;
    // First, so llama.cpp's own log lines (about the files read below, too) stay quiet.
    started_backend()?;
    if !is_gguf(input) {
        return Err(QuantizeError::Input {
            path: input.clone(),
        });
    }
    if same_file(input, output) {
        return Err(QuantizeError::SameFile {
            path: output.clone(),
        });
    }
    let recipe = request.recipe();
    if recipe_of(output).as_deref() == Some(recipe.as_str()) {
        return Ok(Quantized::AlreadyThere);
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| QuantizeError::Io {
            what: "create directory",
            path: dir.to_owned(),
            source,
        })?;
    }
    let mut partial = output.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let c_path = |path: &Path| {
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| QuantizeError::Path {
            path: path.to_owned(),
        })
    };
    let (c_input, c_partial) = (c_path(input)?, c_path(&partial)?);
    tracing::info!(input = %input.display(), output = %output.display(), %recipe, "quantizing");
    let settings = QuantizeSettings {
        ftype: quant_type.ftype(),
        embeddings: request.embeddings.map(EmbeddingsType::ggml_type),
        threads: request.threads,
        recipe: kv_override(RECIPE_KEY, &recipe),
    };
    let status = llama_model_quantize(&c_input, &c_partial, &settings);
    if status != 0 || recipe_of(&partial).as_deref() != Some(recipe.as_str()) {
        let _ = std::fs::remove_file(&partial);
        return Err(QuantizeError::Failed {
            input: input.clone(),
            output: output.clone(),
            recipe,
        });
    }
    std::fs::rename(&partial, output).map_err(|source| QuantizeError::Io {
        what: "move the quantized model to",
        path: output.clone(),
        source,
    })?;
    Ok(Quantized::Written)
}

/// What [`llama_model_quantize`] changes of llama.cpp's default quantize parameters.
struct QuantizeSettings {
    ftype: sys::llama_ftype,
    embeddings: Option<sys::ggml_type>,
    threads: usize,
    /// Written into the output's metadata.
    recipe: sys::llama_model_kv_override,
}

/// A string metadata entry for llama.cpp (key and value cut to its 127-byte limit).
fn kv_override(key: &str, value: &str) -> sys::llama_model_kv_override {
    let c_string = |text: &str| {
        let mut bytes = [0; 128];
        for (slot, byte) in bytes.iter_mut().zip(text.bytes().take(127)) {
            *slot = byte as std::ffi::c_char;
        }
        bytes
    };
    sys::llama_model_kv_override {
        tag: sys::LLAMA_KV_OVERRIDE_TYPE_STR,
        key: c_string(key),
        __bindgen_anon_1: sys::llama_model_kv_override__bindgen_ty_1 {
            val_str: c_string(value),
        },
    }
}

/// llama.cpp's `llama_model_quantize` with its default parameters but for `settings` and
/// `allow_requantize` (the inputs are usually quantized already); returns its status (0 is
/// success).
#[allow(unsafe_code)]
fn llama_model_quantize(input: &CStr, output: &CStr, settings: &QuantizeSettings) -> u32 {
    // llama.cpp reads overrides up to an entry whose key is empty.
    let overrides = [settings.recipe, kv_override("", "")];
    // SAFETY: the default parameters come from llama.cpp itself; the fields changed are plain
    // values, and the one pointer set (`kv_overrides`) points at `overrides`, a terminated array
    // that outlives the call (the other pointers stay null: no imatrix or pruning). Both paths
    // are NUL-terminated strings that outlive the call, which only reads them. llama.cpp catches
    // its own exceptions here and reports them as a non-zero status.
    unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.ftype = settings.ftype;
        params.nthread = i32::try_from(settings.threads).unwrap_or(0);
        params.allow_requantize = true;
        if let Some(embeddings) = settings.embeddings {
            params.token_embedding_type = embeddings;
            params.output_tensor_type = embeddings;
        }
        params.kv_overrides = overrides.as_ptr();
        sys::llama_model_quantize(input.as_ptr(), output.as_ptr(), &params)
    }
}

/// Whether `path` is a GGUF file whose header llama.cpp can read.
fn is_gguf(path: &Path) -> bool {
    path.is_file() && GgufContext::from_file(path).is_some()
}

/// The recipe a GGUF file made by [`quantize`] records; `None` for any other file.
fn recipe_of(path: &Path) -> Option<String> {
    if !path.is_file() {
        return None;
    }
    let gguf = GgufContext::from_file(path)?;
    let key = gguf.find_key(RECIPE_KEY);
    if key < 0 {
        return None;
    }
    gguf.val_str(key).map(str::to_owned)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The default draft model of a default target: the target requantized to a cheaper type. Its
/// name for `--draft-model` is the target's alias with `-draft` (`smollm2-draft`), or `auto`
/// next to a default target; it is made on first use. `docs/draft-model.md` has the
/// measurements behind each type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultDraft {
    /// The target it drafts for, and quantizes from.
    pub base: DefaultModel,
}

impl DefaultDraft {
    /// Suffix of a default draft's name after its base model's alias.
    const SUFFIX: &'static str = "-draft";

    /// The default draft of `base`.
    pub fn of(base: DefaultModel) -> Self {
        Self { base }
    }

    /// The default draft called `name` (`smollm2-draft`, ...), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        let alias = name.strip_suffix(Self::SUFFIX)?;
        DefaultModel::from_alias(alias).map(Self::of)
    }

    /// The name `--draft-model` takes.
    pub fn name(self) -> String {
        format!("{}{}", self.base.alias(), Self::SUFFIX)
    }

    /// The type the base model is quantized to.
    pub fn quant_type(self) -> QuantType {
        match self.base {
            DefaultModel::SmolLm2 => QuantType::Q4_0,
            DefaultModel::Gemma3 => QuantType::Q4_0,
        }
    }

    /// The type of its token embeddings and output matrix.
    pub fn embeddings(self) -> Option<EmbeddingsType> {
        match self.base {
            DefaultModel::SmolLm2 => Some(EmbeddingsType::Q4_0),
            DefaultModel::Gemma3 => Some(EmbeddingsType::Q4_0),
        }
    }

    /// The requantization that makes it.
    pub fn requantized(self) -> Requantized {
        Requantized {
            base: self.base,
            quant_type: self.quant_type(),
            embeddings: self.embeddings(),
        }
    }

    /// Where the draft lives in the cache (whether or not it has been made).
    pub fn path(self, cache_dir: &Path) -> PathBuf {
        self.requantized().path(cache_dir)
    }

    /// Makes the draft from its cached base model unless it is there; returns its path.
    pub fn make(self, cache_dir: &Path, threads: usize) -> Result<PathBuf, QuantizeError> {
        self.requantized().make(cache_dir, threads)
    }
}

/// A default model requantized in the cache on first use: a default draft, or a target
/// variant such as `smollm2-q8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requantized {
    /// The default model it is made from.
    pub base: DefaultModel,
    /// The type of its weights.
    pub quant_type: QuantType,
    /// The type of its token embeddings and output matrix (llama.cpp's choice when `None`).
    pub embeddings: Option<EmbeddingsType>,
}

/// Target variants `--model` takes by name, made from a default model on first use.
/// `smollm2-q8`: SmolLM2-135M-Instruct with Q8_0 weights and embeddings, whose verify batches
/// run on the host's batched int8 kernels (faster than the Q4_1 original, plain or batched):
/// the instruction-tuned target of the headline benchmarks.
pub const TARGET_VARIANTS: [(&str, Requantized); 1] = [(
    "smollm2-q8",
    Requantized {
        base: DefaultModel::SmolLm2,
        quant_type: QuantType::Q8_0,
        embeddings: Some(EmbeddingsType::Q8_0),
    },
)];

/// The target variant called `name`, if any.
pub fn target_variant(name: &str) -> Option<Requantized> {
    TARGET_VARIANTS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|&(_, variant)| variant)
}

impl Requantized {
    /// The quantization that makes it, with `threads`.
    pub fn request(self, cache_dir: &Path, threads: usize) -> QuantizeRequest {
        let input = self.base.path(cache_dir);
        QuantizeRequest {
            output: default_output(cache_dir, &input, self.quant_type, self.embeddings),
            input,
            quant_type: self.quant_type,
            embeddings: self.embeddings,
            threads,
        }
    }

    /// Where it lives in the cache (whether or not it has been made).
    pub fn path(self, cache_dir: &Path) -> PathBuf {
        self.request(cache_dir, 1).output
    }

    /// Makes it from its cached base model unless it is there; returns its path.
    pub fn make(self, cache_dir: &Path, threads: usize) -> Result<PathBuf, QuantizeError> {
        let request = self.request(cache_dir, threads);
        quantize(&request)?;
        Ok(request.output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_output_keeps_the_input_stem_and_names_the_type() {
        let input = Path::new("/m/SmolLM2-135M-Instruct.Q4_1.gguf");
        let out = default_output(Path::new("/c"), input, QuantType::Q2_K, None);
        assert_eq!(
            out,
            Path::new("/c/models/SmolLM2-135M-Instruct.Q4_1.Q2_K.gguf")
        );
        let out = default_output(
            Path::new("/c"),
            input,
            QuantType::Q4_0,
            Some(EmbeddingsType::Q4_0),
        );
        assert_eq!(
            out,
            Path::new("/c/models/SmolLM2-135M-Instruct.Q4_1.Q4_0-embQ4_0.gguf")
        );
    }

    #[test]
    fn default_drafts_are_named_after_their_target() {
        for model in DefaultModel::ALL {
            let draft = DefaultDraft::of(model);
            assert_eq!(DefaultDraft::from_name(&draft.name()), Some(draft));
        }
        assert_eq!(DefaultDraft::from_name("smollm2"), None);
        assert_eq!(DefaultDraft::from_name("llama-draft"), None);
    }

    #[test]
    fn target_variants_are_requantizations_of_default_models_in_the_cache() {
        let q8 = target_variant("smollm2-q8").expect("smollm2-q8");
        assert_eq!(q8.base, DefaultModel::SmolLm2);
        assert_eq!(
            q8.path(Path::new("/c")),
            Path::new("/c/models/SmolLM2-135M-Instruct.Q4_1.Q8_0-embQ8_0.gguf")
        );
        assert_eq!(target_variant("smollm2"), None);
        assert_eq!(target_variant("smollm2-draft"), None);
    }

    #[test]
    fn type_names_parse_as_typed() {
        use clap::ValueEnum;
        for quant_type in QuantType::value_variants() {
            assert_eq!(
                QuantType::from_str(quant_type.name(), false),
                Ok(*quant_type),
                "{}",
                quant_type.name()
            );
        }
    }

    #[test]
    fn rejects_missing_and_non_gguf_input() {
        let dir = std::env::temp_dir().join(format!("spechost-quantize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let text = dir.join("notes.gguf");
        std::fs::write(&text, b"not a model").expect("write");
        for input in [dir.join("missing.gguf"), text] {
            let request = QuantizeRequest {
                output: dir.join("out.gguf"),
                input,
                quant_type: QuantType::Q4_0,
                embeddings: None,
                threads: 1,
            };
            let err = quantize(&request).expect_err("bad input");
            assert!(
                matches!(err, QuantizeError::Input { .. }),
                "{}: {err}",
                request.input.display()
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
