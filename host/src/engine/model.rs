//! The target model: loading, facts, tokenization and detokenization.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use llama_cpp_2::llama_backend::{LlamaBackend, NumaStrategy};
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

use super::chat_template::{ChatRenderer, ChatTemplateChoice};
use super::context::{ContextSettings, ModelContext};
use super::error::EngineError;
use super::grammar::{ByteTokens, ChoiceMemory, Grammar, GrammarError, GrammarSource};
use super::overrides::{ArchitectureFacts, ModelOverrides, model_params};
use super::sample::MAX_GRAMMAR_TIME_PER_TOKEN;
use super::verify::{Session, SessionParams};
use crate::cascade::{ModelFacts, Token};
use crate::placement::NumaMode;

/// llama.cpp's backend is process-wide state that may be initialised only once; every model of
/// the process shares it, and the NUMA strategy it was started with.
static BACKEND: OnceLock<(LlamaBackend, NumaMode)> = OnceLock::new();

/// ggml's tiled CPU matmul handles batches of 8+ rows of K-quant weights with another kernel
/// than single rows; this variable (read once, at the first matmul) turns it off, so verify
/// batches round exactly like single-token decoding. See `docs/exactness.md`.
const TILED_MATMUL_SWITCH: (&str, &str) = ("GGML_CPU_TILED_MM", "0");

/// The backend, started with `numa` on first use. llama.cpp reads the calling thread's CPU set
/// when it starts with `--numa numactl`, so the engine thread must be pinned before this runs.
pub(crate) fn backend(numa: NumaMode) -> Result<&'static LlamaBackend, EngineError> {
    if let Some((backend, active)) = BACKEND.get() {
        if *active != numa {
            return Err(EngineError::NumaAlreadySet {
                requested: numa.name(),
                active: active.name(),
            });
        }
        return Ok(backend);
    }
    disable_tiled_matmul();
    let init = match numa_strategy(numa) {
        Some(strategy) => LlamaBackend::init_numa(strategy),
        None => LlamaBackend::init(),
    };
    let mut backend = init.map_err(|e| EngineError::Backend(e.to_string()))?;
    // llama.cpp logs every tensor at load; our own tracing says what matters.
    backend.void_logs();
    tracing::debug!(numa = numa.name(), "started llama.cpp");
    Ok(&BACKEND.get_or_init(|| (backend, numa)).0)
}

/// The backend as it was started, or started without NUMA set-up when nothing started it yet:
/// for work that follows the target's load (the draft model, quantizing) and must not
/// choose the NUMA strategy itself.
pub(crate) fn started_backend() -> Result<&'static LlamaBackend, EngineError> {
    match BACKEND.get() {
        Some((backend, _)) => Ok(backend),
        None => backend(NumaMode::Off),
    }
}

/// llama.cpp's strategy for `--numa`; `None` for `off`, which skips its NUMA set-up entirely.
fn numa_strategy(numa: NumaMode) -> Option<NumaStrategy> {
    match numa {
        NumaMode::Distribute => Some(NumaStrategy::DISTRIBUTE),
        NumaMode::Isolate => Some(NumaStrategy::ISOLATE),
        NumaMode::Numactl => Some(NumaStrategy::NUMACTL),
        NumaMode::Off => None,
    }
}

/// Sets [`TILED_MATMUL_SWITCH`] unless the user set the variable.
#[allow(unsafe_code)]
fn disable_tiled_matmul() {
    let (name, value) = TILED_MATMUL_SWITCH;
    if std::env::var_os(name).is_none() {
        // SAFETY: runs once, before llama.cpp is initialised (so before any of its threads
        // exist); nothing in spechost reads the environment concurrently (config reads it at
        // start-up, before the engine).
        unsafe { std::env::set_var(name, value) };
    }
}

/// Marks a message's place in a template rendered with stand-ins (private-use characters no
/// template adds or trims).
const CONTENT_SENTINEL_OPEN: char = '\u{E000}';
/// Closes [`CONTENT_SENTINEL_OPEN`].
const CONTENT_SENTINEL_CLOSE: char = '\u{E001}';

/// How special-token text written inside chat messages is tokenized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageContents {
    /// As ordinary text (the default): `<|im_end|>` in a message is those characters, not the
    /// end-of-turn token, so a message cannot close its turn or forge system and assistant
    /// turns. Messages without such text tokenize exactly as with [`Self::Markup`].
    #[default]
    Plain,
    /// As the special tokens it spells, for trusted callers that write template markup on
    /// purpose (what llama.cpp's server does for everyone).
    Markup,
}

/// How the model file is mapped into memory, llama.cpp's NUMA strategy, and what the target is
/// loaded with besides its file.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetParams {
    /// Map the file instead of reading it (llama.cpp's default).
    pub use_mmap: bool,
    /// Lock the weights in RAM so they are never paged out.
    pub use_mlock: bool,
    /// llama.cpp's NUMA strategy; process-wide, so every target of a process must agree.
    pub numa: NumaMode,
    /// Let the host compute the Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K matrix products (AVX2)
    /// of batches (verify batches, prompts) in one pass over the weights when the CPU has the
    /// instructions and a short decode checks out bit-exact against decoding one token at a
    /// time (the same output, faster);
    /// `false` leaves them to llama.cpp. Process-wide: the last target loaded decides.
    pub host_batch_products: bool,
    /// The chat template chat prompts go through.
    pub chat_template: ChatTemplateChoice,
    /// Metadata overrides of the target (`--override-kv`, `--experts`); a draft model has its
    /// own.
    pub overrides: ModelOverrides,
}

impl TargetParams {
    /// llama.cpp's parameters for loading the model at `path` as these settings say, with
    /// `overrides` checked against it and applied.
    pub(super) fn model_params(
        &self,
        path: &Path,
        overrides: &ModelOverrides,
    ) -> Result<Pin<Box<LlamaModelParams>>, EngineError> {
        let overrides = overrides.resolve(path)?;
        Ok(model_params(
            LlamaModelParams::default()
                .with_use_mmap(self.use_mmap)
                .with_use_mlock(self.use_mlock),
            &overrides,
        ))
    }

    /// Loads the GGUF at `path` as these settings say, with `overrides`. A recurrent or hybrid
    /// model is loaded again with every weight in plain CPU buffers: on CPUs with AMX,
    /// llama.cpp's AMX buffers (an extra buffer type, see docs/exactness.md) compute a matrix
    /// product whose input holds several sequences (a 3-D input, as such models' layers have
    /// when a ubatch holds several sequences) from past the end of the weights, which crashed a
    /// server's draft context of several sequences.
    pub(super) fn load_model(
        &self,
        backend: &LlamaBackend,
        path: &Path,
        overrides: &ModelOverrides,
    ) -> Result<LlamaModel, EngineError> {
        let failed = |_| EngineError::LoadFailed {
            path: path.to_owned(),
        };
        let params = self.model_params(path, overrides)?;
        let model = LlamaModel::load_from_file(backend, path, &params).map_err(failed)?;
        if !(model.is_recurrent() || model.is_hybrid()) {
            return Ok(model);
        }
        drop(model);
        let mut params = self.model_params(path, overrides)?;
        params.as_mut().add_cpu_buft_override(c".*");
        LlamaModel::load_from_file(backend, path, &params).map_err(failed)
    }
}

impl Default for TargetParams {
    fn default() -> Self {
        Self {
            use_mmap: true,
            use_mlock: false,
            numa: NumaMode::Off,
            host_batch_products: true,
            chat_template: ChatTemplateChoice::default(),
            overrides: ModelOverrides::default(),
        }
    }
}

/// What `spechost info --model` says of a model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelDescription {
    /// The file.
    pub path: PathBuf,
    /// Its architecture and experts.
    pub architecture: ArchitectureFacts,
    /// The architecture's metadata keys and their values (what `--override-kv` sets).
    pub keys: Vec<(String, String)>,
    /// Whether llama.cpp runs it as a recurrent or hybrid (state-space) model: drafts are then
    /// rolled back by restoring the state saved before the verify batch and decoding the
    /// accepted tokens again, not with `seq_rm`.
    pub recurrent: bool,
}

impl ModelDescription {
    /// Reads the GGUF at `path`: its metadata, and its vocabulary to learn whether llama.cpp
    /// runs it as a recurrent or hybrid model (no weights are loaded).
    pub fn read(path: &Path) -> Result<Self, EngineError> {
        check_gguf(path)?;
        let architecture = ArchitectureFacts::read(path)?;
        let keys = ArchitectureFacts::keys(path)?;
        let params = LlamaModelParams::default().with_vocab_only(true);
        let model =
            LlamaModel::load_from_file(started_backend()?, path, &params).map_err(|_| {
                EngineError::LoadFailed {
                    path: path.to_owned(),
                }
            })?;
        Ok(Self {
            path: path.to_owned(),
            architecture,
            keys,
            recurrent: model.is_recurrent() || model.is_hybrid(),
        })
    }

    /// The report's text.
    pub fn render(&self) -> String {
        let facts = &self.architecture;
        let mut text = format!(
            "model         {}
architecture  {}
",
            self.path.display(),
            facts.arch
        );
        match (facts.experts, facts.experts_used) {
            (Some(experts), used) => text.push_str(&format!(
                "experts       {experts}, {} per token (--experts 1-{experts} changes it)
",
                used.map_or_else(|| "?".to_owned(), |used| used.to_string())
            )),
            (None, _) => text.push_str(
                "experts       none (dense)
",
            ),
        }
        text.push_str(if self.recurrent {
            "speculation   drafts verified in one batch; a recurrent state cannot be rolled back with seq_rm, so the state is saved before each batch and, when a draft is cut short, restored and the accepted tokens decoded again
"
        } else {
            "speculation   drafts verified in one batch, rejected tokens rolled back with seq_rm
"
        });
        text.push_str(
            "metadata keys (--override-kv KEY=TYPE:VALUE)
",
        );
        for (key, value) in &self.keys {
            text.push_str(&format!(
                "  {key} = {value}
"
            ));
        }
        text
    }
}

/// The verified model: a GGUF loaded through llama.cpp.
pub struct Target {
    model: Arc<LlamaModel>,
    /// The vocabulary's single-byte tokens, for grammar sources (found at the first).
    byte_tokens: OnceLock<Arc<ByteTokens>>,
    /// What grammar sources learnt of the model's choices, per grammar.
    grammar_choices: ChoiceMemory,
    /// How a conversation becomes prompt text.
    chat: ChatRenderer,
    path: PathBuf,
    /// The NUMA strategy the backend was started with.
    numa: NumaMode,
}

impl Target {
    /// Loads the GGUF at `path`, checking first that it exists and is a GGUF file.
    pub fn load(path: &Path, params: &TargetParams) -> Result<Self, EngineError> {
        check_gguf(path)?;
        let backend = backend(params.numa)?;
        let model = params.load_model(backend, path, &params.overrides)?;
        tracing::info!(path = %path.display(), vocab = model.n_vocab(), params = model.n_params(), "loaded target");
        use_batch_products(params.host_batch_products);
        let chat = ChatRenderer::new(&model, &params.chat_template)?;
        Ok(Self {
            model: Arc::new(model),
            byte_tokens: OnceLock::new(),
            grammar_choices: ChoiceMemory::default(),
            chat,
            path: path.to_owned(),
            numa: params.numa,
        })
    }

    /// The file the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> u32 {
        self.model.n_vocab().max(0) as u32
    }

    /// Whether `grammar` parses and can be followed on this model's vocabulary, in the time
    /// a token may take ([`MAX_GRAMMAR_TIME_PER_TOKEN`], estimated at its start).
    pub fn check_grammar(&self, grammar: &Grammar) -> Result<(), GrammarError> {
        grammar.check(&self.model, MAX_GRAMMAR_TIME_PER_TOKEN)
    }

    /// A draft source for a request that generates under `grammar` (see [`GrammarSource`]);
    /// `None` when the grammar does not open (the request is refused on its own).
    pub fn grammar_source(&self, grammar: &Grammar) -> Option<GrammarSource> {
        let start = grammar.open(&self.model).ok()?;
        let bytes = self
            .byte_tokens
            .get_or_init(|| Arc::new(ByteTokens::of(&self.model)));
        Some(GrammarSource::new(
            Arc::clone(&self.model),
            Arc::clone(bytes),
            start,
            self.grammar_choices.of(grammar.text()),
        ))
    }

    /// The llama.cpp model, for the engine's other modules.
    pub(super) fn llama_model(&self) -> &LlamaModel {
        &self.model
    }

    /// Context length the model was trained with.
    pub fn n_ctx_train(&self) -> u32 {
        self.model.n_ctx_train()
    }

    /// Whether llama.cpp runs it as a recurrent or hybrid (state-space) model, whose sequences
    /// roll back by a saved state and a replay (`engine/recurrent.rs`) instead of `seq_rm`.
    pub fn is_recurrent(&self) -> bool {
        self.model.is_recurrent() || self.model.is_hybrid()
    }

    /// Whether `token` ends generation (EOS, end-of-turn, ...).
    pub fn is_eog(&self, token: Token) -> bool {
        self.model.vocab().is_eog(to_llama(token))
    }

    /// Facts given to draft sources, for a context of `context_size` tokens.
    pub fn facts(&self, context_size: u32) -> ModelFacts {
        let vocab = self.model.vocab();
        let known = |t: LlamaToken| (t.0 >= 0).then_some(t.0 as Token);
        let eog = (0..self.model.n_vocab())
            .filter(|&id| vocab.is_eog(LlamaToken(id)))
            .map(|id| id as Token)
            .collect();
        ModelFacts {
            vocab_size: self.vocab_size(),
            bos: known(vocab.bos()),
            eos: known(vocab.eos()),
            eog,
            context_size,
        }
    }

    /// Tokenizes a conversation with the model's chat template, ready for the assistant's turn.
    /// `messages` are `(role, content)` pairs; `contents` says whether special-token text inside
    /// them is plain text (the default) or markup.
    pub fn tokenize_messages(
        &self,
        messages: &[(&str, &str)],
        contents: MessageContents,
    ) -> Result<Vec<Token>, EngineError> {
        let text = self.template_messages(messages)?;
        let plain_needed = contents == MessageContents::Plain
            && messages
                .iter()
                .any(|(_, content)| self.has_special_text(content));
        if !plain_needed {
            return Ok(self.tokenize_raw(&text));
        }
        self.tokenize_with_plain_contents(messages, &text)
    }

    /// Whether `text` holds special-token markup (`<|im_end|>`): it tokenizes differently with
    /// special tokens parsed.
    fn has_special_text(&self, text: &str) -> bool {
        let vocab = self.model.vocab();
        vocab.tokenize(text.as_bytes(), false, true)
            != vocab.tokenize(text.as_bytes(), false, false)
    }

    /// `rendered` (the conversation through the template) tokenized with the template's own
    /// markup parsed and each message's content as plain text. The template is rendered once
    /// more with a sentinel for each content, which tells the template's text from the
    /// contents'; a template that rewrites contents beyond trimming whitespace is refused.
    fn tokenize_with_plain_contents(
        &self,
        messages: &[(&str, &str)],
        rendered: &str,
    ) -> Result<Vec<Token>, EngineError> {
        let sentinels: Vec<String> = (0..messages.len())
            .map(|i| format!("{CONTENT_SENTINEL_OPEN}{i}{CONTENT_SENTINEL_CLOSE}"))
            .collect();
        let stand_ins: Vec<(&str, &str)> = messages
            .iter()
            .zip(&sentinels)
            .map(|((role, _), sentinel)| (*role, sentinel.as_str()))
            .collect();
        let skeleton = self.template_messages(&stand_ins)?;
        let rewritten = || {
            EngineError::ChatTemplate(
            "a message contains special-token text (such as an end-of-turn marker) and this model's chat template rewrites message text, so it cannot be kept as plain text; remove the markup from the message, or let trusted callers write markup (`spechost serve --message-special-tokens`)".into(),
        )
        };
        let mut template_parts = Vec::with_capacity(messages.len() + 1);
        let mut rest = skeleton.as_str();
        for sentinel in &sentinels {
            let (before, after) = rest.split_once(sentinel.as_str()).ok_or_else(rewritten)?;
            template_parts.push(before);
            rest = after;
        }
        template_parts.push(rest);

        let vocab = self.model.vocab();
        let mut tokens = Vec::new();
        let mut at = 0;
        for (index, part) in template_parts.iter().enumerate() {
            if !rendered[at..].starts_with(part) {
                return Err(rewritten());
            }
            // BOS (when the model adds one) goes before the first part, even an empty one.
            tokens.extend(vocab.tokenize(part.as_bytes(), index == 0, true));
            at += part.len();
            let Some((_, content)) = messages.get(index) else {
                break;
            };
            let next = template_parts[index + 1];
            let shown = [
                *content,
                content.trim(),
                content.trim_end(),
                content.trim_start(),
            ]
            .into_iter()
            .find(|shown| {
                rendered[at..].starts_with(shown) && rendered[at + shown.len()..].starts_with(next)
            })
            .ok_or_else(rewritten)?;
            tokens.extend(vocab.tokenize(shown.as_bytes(), false, false));
            at += shown.len();
        }
        if at != rendered.len() {
            return Err(rewritten());
        }
        Ok(tokens.into_iter().map(from_llama).collect())
    }

    /// The text [`tokenize_messages`](Self::tokenize_messages) tokenizes: the conversation in
    /// the chat template, ending where the assistant's turn starts.
    pub fn template_messages(&self, messages: &[(&str, &str)]) -> Result<String, EngineError> {
        self.chat.render(&self.model, messages)
    }

    /// Whether the GGUF carries a chat template of its own: llama.cpp's converter writes the
    /// one an instruction-tuned model's tokenizer configuration has, and base models have none.
    pub fn has_chat_template(&self) -> bool {
        self.model.chat_template(None).is_ok()
    }

    /// The chat template chat requests go through, as text: the Jinja source, the GGUF's, or
    /// the name of the llama.cpp built-in used (`gemma`, `chatml`).
    pub fn chat_template_text(&self) -> String {
        self.chat.text()
    }

    /// Tokenizes one user message with the chat template; special-token text in it is plain
    /// text.
    pub fn tokenize_chat(&self, user_message: &str) -> Result<Vec<Token>, EngineError> {
        self.tokenize_messages(&[("user", user_message)], MessageContents::Plain)
    }

    /// Tokenizes `text` as-is (special tokens written in the text are recognised; BOS is added
    /// when the model asks for it).
    pub fn tokenize_raw(&self, text: &str) -> Vec<Token> {
        self.tokenize_with(text, true, true)
    }

    /// Tokenizes `text`, adding BOS when `add_special` (and the model asks for it) and
    /// recognising special-token markup when `parse_special`.
    pub fn tokenize_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), add_special, parse_special)
            .into_iter()
            .map(from_llama)
            .collect()
    }

    /// Tokens of `text` as it would appear inside generated output: no BOS, and special-token
    /// markup is not parsed (it is ordinary text).
    pub fn tokenize_text(&self, text: &str) -> Vec<Token> {
        self.tokenize_with(text, false, false)
    }

    /// The bytes `token` stands for in generated text (special tokens render as nothing).
    pub fn token_bytes(&self, token: Token, out: &mut Vec<u8>) {
        self.token_piece(token, false, out);
    }

    /// The bytes of `token` into `out`: a special token's markup when `special`, else nothing
    /// for it.
    pub fn token_piece(&self, token: Token, special: bool, out: &mut Vec<u8>) {
        out.clear();
        self.model
            .vocab()
            .token_to_piece_into(to_llama(token), out, special, None);
    }

    /// The text of `tokens`, lossily decoded (a character split across tokens at either end
    /// becomes U+FFFD): for content-aware policies, not for output.
    pub fn text_of(&self, tokens: &[Token]) -> String {
        let mut bytes = Vec::new();
        let mut piece = Vec::new();
        for &token in tokens {
            if !self.is_eog(token) {
                self.token_bytes(token, &mut piece);
                bytes.extend_from_slice(&piece);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Creates a session: a llama.cpp context with its own KV cache, one sequence of
    /// `params.ctx_size` tokens per request it decodes at once.
    pub fn session(&self, params: &SessionParams) -> Result<Session<'_>, EngineError> {
        let context_error = |reason: String| EngineError::Context {
            ctx_size: params.ctx_size,
            reason,
        };
        if params.ctx_size == 0 {
            return Err(context_error("--ctx-size must be at least 1".into()));
        }
        let settings = ContextSettings {
            ctx_size: params.ctx_size,
            batch_size: params.batch_size,
            threads: params.threads,
            sequences: u32::try_from(params.sequences.max(1)).unwrap_or(u32::MAX),
            check_rows: params.max_draft_len + 1,
            tree_leaves: u32::try_from(params.tree_leaves.max(1)).unwrap_or(u32::MAX),
        };
        // The backend must be started (with this target's NUMA strategy) before a context.
        let context = ModelContext::new(backend(self.numa)?, &self.model, &settings)
            .map_err(context_error)?;
        Ok(Session::new(self, context, params.layout, params.draft_cut))
    }
}

/// Turns the host's batched matrix products on or off for contexts made from now on.
#[cfg(target_arch = "x86_64")]
fn use_batch_products(wanted: bool) {
    if !wanted {
        super::kernels::backend::disable();
    } else if !super::kernels::backend::enable() {
        tracing::info!("batches: llama.cpp computes every matrix product (this CPU lacks AVX2)");
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn use_batch_products(_: bool) {}

/// Checks that `path` exists, is readable and starts with the GGUF magic.
pub(super) fn check_gguf(path: &Path) -> Result<(), EngineError> {
    if !path.exists() {
        return Err(EngineError::ModelNotFound {
            path: path.to_owned(),
        });
    }
    let unreadable = |source| EngineError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let n = file.read(&mut magic).map_err(unreadable)?;
    if &magic[..n] != b"GGUF" {
        return Err(EngineError::NotGguf {
            path: path.to_owned(),
            found: String::from_utf8_lossy(&magic[..n]).into_owned(),
        });
    }
    Ok(())
}

pub(super) fn to_llama(token: Token) -> LlamaToken {
    LlamaToken(token as i32)
}

pub(super) fn from_llama(token: LlamaToken) -> Token {
    token.0 as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_missing_and_non_gguf_files() {
        let dir = std::env::temp_dir().join(format!("spechost-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let missing = dir.join("missing.gguf");
        let err = check_gguf(&missing).expect_err("missing file");
        assert!(
            matches!(err, EngineError::ModelNotFound { .. }),
            "got {err}"
        );
        let text = dir.join("notes.gguf");
        std::fs::write(&text, b"hello").expect("write");
        let err = check_gguf(&text).expect_err("not gguf");
        assert!(err.to_string().contains("\"hell\""), "got {err}");
        std::fs::write(&text, b"GGUF\x03\0\0\0").expect("write");
        check_gguf(&text).expect("gguf magic accepted");
        std::fs::remove_dir_all(&dir).ok();
    }
}
