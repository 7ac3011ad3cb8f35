//! Chat templates: how a conversation becomes the prompt text, through one of llama.cpp's
//! built-in templates (the default: the GGUF's template, recognised by pattern) or through a
//! Jinja template rendered as Hugging Face's transformers renders it (`--jinja` with the GGUF's
//! own template, or `--chat-template FILE`).

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use minijinja::{Environment, ErrorKind, context};

use super::error::EngineError;

/// Which chat template chat requests go through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ChatTemplateChoice {
    /// The GGUF's template through llama.cpp's built-in templates (recognised from its text);
    /// without one, the architecture's (`gemma`) or ChatML.
    #[default]
    Gguf,
    /// The GGUF's own template text, rendered as Jinja (`--jinja`).
    GgufJinja,
    /// One of llama.cpp's built-in templates by name (`chatml`, `llama3`, `gemma`, ...).
    Builtin(String),
    /// A Jinja template's text, and where it came from (for messages).
    Jinja {
        /// The template.
        source: String,
        /// The file it was read from.
        origin: String,
    },
}

/// A conversation's renderer, made once when the model loads.
pub(super) enum ChatRenderer {
    /// llama.cpp's `llama_chat_apply_template`.
    Builtin(LlamaChatTemplate),
    /// A Jinja template (boxed: its environment is large, and there is one per model).
    Jinja(Box<JinjaTemplate>),
}

/// The one template in [`JinjaTemplate::environment`].
const TEMPLATE: &str = "chat";

/// A Jinja chat template with the special tokens it may print.
pub(super) struct JinjaTemplate {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Whether the tokenizer adds BOS itself: a rendered BOS is then dropped, not doubled.
    adds_bos: bool,
}

impl ChatRenderer {
    /// The renderer `choice` asks for on `model`, checked on a one-message conversation.
    pub(super) fn new(
        model: &LlamaModel,
        choice: &ChatTemplateChoice,
    ) -> Result<Self, EngineError> {
        let renderer = match choice {
            ChatTemplateChoice::Gguf => Self::Builtin(gguf_or_fallback(model)?),
            ChatTemplateChoice::Builtin(name) => {
                Self::Builtin(LlamaChatTemplate::new(name).map_err(|e| {
                    EngineError::ChatTemplate(format!("--chat-template {name}: {e}"))
                })?)
            }
            ChatTemplateChoice::GgufJinja => {
                let source = model
                    .chat_template(None)
                    .ok()
                    .and_then(|template| template.to_string().ok())
                    .ok_or_else(|| {
                        EngineError::ChatTemplateSetting(
                            "--jinja: the GGUF has no chat template to render; give one with --chat-template FILE".into(),
                        )
                    })?;
                Self::Jinja(Box::new(JinjaTemplate::new(
                    model,
                    source,
                    "the GGUF's chat template",
                )?))
            }
            ChatTemplateChoice::Jinja { source, origin } => {
                Self::Jinja(Box::new(JinjaTemplate::new(model, source.clone(), origin)?))
            }
        };
        renderer.render(model, &[("user", "Hello")]).map_err(|error| match choice {
            ChatTemplateChoice::Builtin(name) => EngineError::ChatTemplateSetting(format!(
                "--chat-template {name} is not one of llama.cpp's built-in templates nor a file; use a name such as chatml, llama3, gemma, mistral-v7, phi3, deepseek3, or a Jinja template file"
            )),
            _ => EngineError::ChatTemplateSetting(format!("the chat template cannot render a conversation: {error}")),
        })?;
        Ok(renderer)
    }

    /// `messages` (role, content) as prompt text, ready for the assistant's turn.
    pub(super) fn render(
        &self,
        model: &LlamaModel,
        messages: &[(&str, &str)],
    ) -> Result<String, EngineError> {
        match self {
            Self::Builtin(template) => {
                let chat = messages
                    .iter()
                    .map(|(role, content)| {
                        LlamaChatMessage::new(role.to_string(), content.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
                model
                    .apply_chat_template(template, &chat, true)
                    .map_err(|e| EngineError::ChatTemplate(e.to_string()))
            }
            Self::Jinja(template) => template.render(messages),
        }
    }

    /// The template as text: the Jinja source, or the built-in template's text or name.
    pub(super) fn text(&self) -> String {
        match self {
            Self::Builtin(template) => template.to_string().unwrap_or_default(),
            Self::Jinja(template) => template
                .environment
                .get_template(TEMPLATE)
                .map(|template| template.source().to_owned())
                .unwrap_or_default(),
        }
    }
}

/// The GGUF's chat template; without one, llama.cpp's built-in template for the model's
/// architecture (`gemma` for Gemma), else ChatML, as llama.cpp's own tools do.
fn gguf_or_fallback(model: &LlamaModel) -> Result<LlamaChatTemplate, EngineError> {
    if let Ok(template) = model.chat_template(None) {
        return Ok(template);
    }
    let architecture = model
        .meta_val_str("general.architecture")
        .unwrap_or_default();
    let fallback = if architecture.starts_with("gemma") {
        "gemma"
    } else {
        "chatml"
    };
    tracing::debug!(%architecture, fallback, "model has no chat template; using a built-in one");
    LlamaChatTemplate::new(fallback).map_err(|e| EngineError::ChatTemplate(e.to_string()))
}

impl JinjaTemplate {
    fn new(model: &LlamaModel, source: String, origin: &str) -> Result<Self, EngineError> {
        let mut environment = Environment::new();
        // Python's string and dict methods (`.strip()`, `.items()`), which templates call.
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        environment.set_trim_blocks(true);
        environment.set_lstrip_blocks(true);
        environment
            .add_template_owned(TEMPLATE, source)
            .map_err(|e| {
                EngineError::ChatTemplate(format!("{origin} is not a valid Jinja template: {e}"))
            })?;
        let vocab = model.vocab();
        let text = |token: llama_cpp_2::token::LlamaToken| {
            (token.0 >= 0)
                .then(|| vocab.text(token))
                .flatten()
                .map(|text| text.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        Ok(Self {
            environment,
            bos_token: text(vocab.bos()),
            eos_token: text(vocab.eos()),
            adds_bos: vocab.should_add_bos(),
        })
    }

    fn render(&self, messages: &[(&str, &str)]) -> Result<String, EngineError> {
        let messages: Vec<_> = messages
            .iter()
            .map(|(role, content)| context! { role => role, content => content })
            .collect();
        let template = self
            .environment
            .get_template(TEMPLATE)
            .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
        let text = template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| {
                EngineError::ChatTemplate(format!("rendering the Jinja chat template failed: {e}"))
            })?;
        // The tokenizer adds BOS itself: one the template printed too would be doubled.
        Ok(match text.strip_prefix(self.bos_token.as_str()) {
            Some(rest) if self.adds_bos && !self.bos_token.is_empty() => rest.to_owned(),
            _ => text,
        })
    }
}
