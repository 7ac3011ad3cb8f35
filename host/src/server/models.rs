//! `GET /v1/models` (the served model, under each of its names), `GET /health` (liveness, slots
//! and queue), and llama-server's `GET /props` (server properties) and `GET /slots` (what each
//! slot is doing).

use axum::Json;
use axum::extract::{RawQuery, State};

use super::error::ApiError;
use super::state::AppState;
use super::wire::{GenerationParams, GenerationSettings, Modalities, Model, ModelList, Props};

/// `GET /v1/models`.
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".to_owned(),
        data: state
            .model_aliases
            .iter()
            .map(|name| Model {
                id: name.clone(),
                object: "model".to_owned(),
                created: state.started_at(),
                owned_by: "spechost".to_owned(),
            })
            .collect(),
    })
}

/// `GET /health`: `200 {"status": "ok", ...}` while the server accepts requests.
pub async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let queue = state.queue.gauges();
    Json(serde_json::json!({
        "status": "ok",
        "model": state.model_id,
        "slots": queue.slots,
        "running": queue.running,
        "waiting": queue.waiting,
        "max_queue": queue.max_queue,
        "registry_generation": state.registry.generation(),
        "share": state.sharing.health(),
    }))
}

/// `GET /slots`, in llama-server's layout: each slot's id, context and whether it is
/// generating; with `?fail_on_no_slot=1`, 503 when every slot is generating. Unlike
/// llama-server, never the prompt or tokens of a request: those belong to its client.
pub async fn slots(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut fail_on_no_slot = false;
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        fail_on_no_slot = match pair {
            "fail_on_no_slot=1" | "fail_on_no_slot=true" => true,
            "fail_on_no_slot=0" | "fail_on_no_slot=false" => false,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query `{other}`; the only one is fail_on_no_slot=1"
                )));
            }
        };
    }
    let busy = state.queue.slots_busy();
    if fail_on_no_slot && busy.iter().all(|&busy| busy) {
        return Err(ApiError::unavailable(
            "no slot available: every slot is generating",
        ));
    }
    let slots: Vec<serde_json::Value> = busy
        .iter()
        .enumerate()
        .map(|(id, &is_processing)| {
            serde_json::json!({
                "id": id,
                "n_ctx": state.limits.ctx_size,
                "speculative": true,
                "is_processing": is_processing,
            })
        })
        .collect();
    Ok(Json(serde_json::Value::from(slots)))
}

/// `GET /props`, as llama-server answers it (the fields its web UI and clients read).
pub async fn props(State(state): State<AppState>) -> Json<Props> {
    let sampling = &state.sampling;
    Json(Props {
        default_generation_settings: GenerationSettings {
            n_ctx: state.limits.ctx_size,
            params: GenerationParams {
                n_predict: state.limits.default_max_tokens,
                temperature: sampling.temperature,
                top_k: sampling.top_k,
                top_p: sampling.top_p,
                min_p: sampling.min_p,
            },
        },
        total_slots: state.queue.gauges().slots,
        model_alias: state.model_id.clone(),
        model_path: state.model_path.clone(),
        chat_template: state.chat_template.clone(),
        modalities: Modalities {
            vision: false,
            audio: false,
        },
        build_info: format!("spechost {}", env!("CARGO_PKG_VERSION")),
    })
}
