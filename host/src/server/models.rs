//! `GET /v1/models` (the served model, under each of its names), `GET /health` (liveness, slots and queue) and
//! `GET /props` (llama-server's server properties).

use axum::Json;
use axum::extract::State;

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
    }))
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
