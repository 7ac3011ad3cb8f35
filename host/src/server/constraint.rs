//! Constrained output in requests: llama-server's `grammar` (GBNF) and `json_schema`, and
//! OpenAI's `response_format` (`json_object`, `json_schema`), each turned into the one
//! [`Grammar`] the engine samples under, and checked on the model before the request queues.

use serde_json::{Value, json};

use super::error::ApiError;
use crate::engine::Grammar;

/// Longest grammar text a request may send: the grammar is parsed, and its state kept, for
/// every generated token.
pub const MAX_GRAMMAR_BYTES: usize = 64 * 1024;

/// The fields of a request that constrain its output.
#[derive(Debug, Default)]
pub struct ConstraintFields<'a> {
    /// `grammar`: GBNF text (empty: none).
    pub grammar: Option<&'a str>,
    /// `json_schema`: a JSON schema (`null`: none).
    pub json_schema: Option<&'a Value>,
    /// `response_format`.
    pub response_format: Option<&'a Value>,
}

impl ConstraintFields<'_> {
    /// The grammar the request's output must follow, if it asks for one; a 400 naming the
    /// field when it is malformed or when several fields ask.
    pub fn grammar(&self) -> Result<Option<(&'static str, Grammar)>, ApiError> {
        let mut asked = Vec::new();
        if let Some(text) = self.grammar.filter(|text| !text.is_empty()) {
            if text.len() > MAX_GRAMMAR_BYTES {
                return Err(ApiError::invalid_param(
                    "grammar",
                    format!(
                        "the grammar is {} bytes, more than the {MAX_GRAMMAR_BYTES} a request may send; simplify it",
                        text.len()
                    ),
                ));
            }
            asked.push(("grammar", Grammar::gbnf(text)));
        }
        if let Some(schema) = self.json_schema.filter(|schema| !schema.is_null()) {
            asked.push(("json_schema", schema_grammar("json_schema", schema)?));
        }
        if let Some(format) = self.response_format
            && let Some(grammar) = response_format_grammar(format)?
        {
            asked.push(("response_format", grammar));
        }
        if asked.len() > 1 {
            let names: Vec<&str> = asked.iter().map(|(name, _)| *name).collect();
            return Err(ApiError::invalid_param(
                asked[1].0,
                format!(
                    "{} each constrain the output; send one of them",
                    names.join(" and ")
                ),
            ));
        }
        Ok(asked.pop())
    }
}

/// `response_format`: `text` (no constraint), `json_object` (any JSON object, or llama-server's
/// `schema` inside it), or `json_schema` (`{"json_schema": {"schema": ...}}`).
fn response_format_grammar(format: &Value) -> Result<Option<Grammar>, ApiError> {
    const PARAM: &str = "response_format";
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => {
            let schema = format
                .get("schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            schema_grammar(PARAM, &schema).map(Some)
        }
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|spec| spec.get("schema"))
                .or_else(|| format.get("schema"))
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        PARAM,
                        "response_format of type json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                    )
                })?;
            schema_grammar(PARAM, schema).map(Some)
        }
        _ => Err(ApiError::invalid_param(
            PARAM,
            format!(
                "response_format type must be text, json_object or json_schema, got {}",
                format.get("type").unwrap_or(&Value::Null)
            ),
        )),
    }
}

fn schema_grammar(param: &'static str, schema: &Value) -> Result<Grammar, ApiError> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err(ApiError::invalid_param(
            param,
            format!("a JSON schema is an object, got {schema}"),
        ));
    }
    Grammar::json_schema(schema).map_err(|error| ApiError::invalid_param(param, error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(
        grammar: Option<&'a str>,
        schema: Option<&'a Value>,
        format: Option<&'a Value>,
    ) -> ConstraintFields<'a> {
        ConstraintFields {
            grammar,
            json_schema: schema,
            response_format: format,
        }
    }

    #[test]
    fn each_field_gives_a_grammar_and_neutral_values_none() {
        let text = json!({"type": "text"});
        let null = Value::Null;
        assert!(
            fields(Some(""), Some(&null), Some(&text))
                .grammar()
                .unwrap()
                .is_none()
        );
        let (name, grammar) = fields(Some("root ::= \"a\""), None, None)
            .grammar()
            .unwrap()
            .unwrap();
        assert_eq!((name, grammar.text()), ("grammar", "root ::= \"a\""));
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let (_, from_schema) = fields(None, Some(&schema), None)
            .grammar()
            .unwrap()
            .unwrap();
        assert!(
            from_schema.text().contains("root ::="),
            "{}",
            from_schema.text()
        );
        let format = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}});
        let (name, from_format) = fields(None, None, Some(&format))
            .grammar()
            .unwrap()
            .unwrap();
        assert_eq!(name, "response_format");
        assert_eq!(from_format, from_schema);
        let object = json!({"type": "json_object"});
        assert!(
            fields(None, None, Some(&object))
                .grammar()
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn conflicting_or_malformed_constraints_are_refused_by_name() {
        let schema = json!({"type": "string"});
        let bad_type = json!({"type": "xml"});
        let no_schema = json!({"type": "json_schema"});
        let not_a_schema = json!(3);
        let long = "x".repeat(MAX_GRAMMAR_BYTES + 1);
        for (fields, needle) in [
            (
                fields(Some("root ::= \"a\""), Some(&schema), None),
                "send one of them",
            ),
            (
                fields(None, None, Some(&bad_type)),
                "json_object or json_schema",
            ),
            (
                fields(None, None, Some(&no_schema)),
                "needs {\"json_schema\"",
            ),
            (fields(None, Some(&not_a_schema), None), "is an object"),
            (fields(Some(&long), None, None), "more than the"),
        ] {
            let error = fields.grammar().expect_err(needle);
            assert!(error.message().contains(needle), "{}", error.message());
        }
    }
}
