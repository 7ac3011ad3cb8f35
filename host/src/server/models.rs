//! `GET /v1/models` (the one served model) and `GET /health` (liveness, slots and queue).

use axum::Json;
use axum::extract::State;

use super::state::AppState;
use super::wire::{Model, ModelList};

/// `GET /v1/models`.
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".to_owned(),
        data: vec![Model {
            id: state.model_id.clone(),
            object: "model".to_owned(),
            created: state.started_at(),
            owned_by: "spechost".to_owned(),
        }],
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
