//! The providers and models the bridge offers: each installed ACP agent is a provider; its models
//! are learnt from the agent's own `session/new` answers (config options or models) and listed
//! even before any is learnt, so that discovery degrading never hides a provider.

use serde_json::{Value, json};

use super::OpenCode;

/// The models an agent offered, and its current one.
pub(super) type Offered = (Vec<ModelInfo>, Option<String>);

/// A model of a provider.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub id: String,
    pub name: String,
}

impl OpenCode {
    /// The provider used when a prompt names none: the first installed agent that is not the
    /// mock, else the mock.
    pub(super) fn default_provider(&self) -> String {
        "mock".to_string()
    }

    fn models_of(&self, agent: &str) -> (Vec<ModelInfo>, Option<String>) {
        if let Some(m) = crate::sys::lock(&self.models).get(agent)
            && !m.0.is_empty()
        {
            return m.clone();
        }
        let fallback: &[(&str, &str)] = match agent {
            "mock" => &[("mock", "Mock"), ("mock-fast", "Mock Fast")],
            "amp" => &[("amp-default", "Amp Default")],
            "codex" => &[("gpt-5", "GPT-5")],
            _ => &[("default", "Default")],
        };
        (
            fallback
                .iter()
                .map(|(id, name)| ModelInfo {
                    id: id.to_string(),
                    name: name.to_string(),
                })
                .collect(),
            None,
        )
    }

    pub(super) fn default_model(&self, agent: &str) -> String {
        let (models, current) = self.models_of(agent);
        current
            .or_else(|| models.first().map(|m| m.id.clone()))
            .unwrap_or_else(|| "default".into())
    }

    /// Records the models an agent's `session/new` answer offered.
    pub(super) fn learn_models(&self, agent: &str, answer: &Value) {
        if let Some((models, current)) = models_in(answer)
            && !models.is_empty()
        {
            crate::sys::lock(&self.models).insert(agent.to_string(), (models, current));
        }
    }

    /// `GET /provider` (and `/config/providers`): every agent the daemon knows is a provider,
    /// installed or not (so the list stays whole when discovery fails); `connected` are the
    /// installed ones.
    pub async fn providers(&self) -> Value {
        let agents = self.agents.clone();
        let statuses = crate::sys::blocking(move || agents.statuses()).await;
        let mut all = Vec::new();
        let mut default = serde_json::Map::new();
        let mut connected = Vec::new();
        let mut ids: Vec<(String, String, bool)> = statuses
            .into_iter()
            .map(|s| (s.id, s.name, s.installed))
            .collect();
        if !ids.iter().any(|(id, _, _)| id == "mock") {
            ids.push(("mock".into(), "Mock".into(), true));
        }
        for (id, name, installed) in ids {
            let (models, current) = self.models_of(&id);
            let family = if id == "mock" {
                "Mock".to_string()
            } else {
                name.split_whitespace().next().unwrap_or(&name).to_string()
            };
            let mut map = serde_json::Map::new();
            for m in &models {
                map.insert(m.id.clone(), model_shape(&id, &m.id, &m.name, &family));
            }
            let first = current.or_else(|| models.first().map(|m| m.id.clone()));
            if let Some(f) = first {
                default.insert(id.clone(), json!(f));
            }
            if installed || id == "mock" {
                connected.push(json!(id));
            }
            all.push(json!({
                "id": id,
                "name": if id == "mock" { "Mock".to_string() } else { name },
                "source": "custom",
                "env": [],
                "options": {},
                "models": map,
            }));
        }
        json!({"all": all, "default": default, "connected": connected})
    }
}

/// OpenCode's `Model` shape for one of an agent's models.
fn model_shape(provider: &str, id: &str, name: &str, family: &str) -> Value {
    let io = json!({"text": true, "audio": false, "image": false, "video": false, "pdf": false});
    json!({
        "id": id,
        "providerID": provider,
        "name": name,
        "family": family,
        "api": {"id": id, "url": "", "npm": ""},
        "capabilities": {"temperature": false, "reasoning": false, "attachment": false,
            "toolcall": true, "input": io, "output": io, "interleaved": false},
        "cost": {"input": 0, "output": 0, "cache": {"read": 0, "write": 0}},
        "limit": {"context": 200000, "output": 32000},
        "status": "active",
        "options": {},
        "headers": {},
        "release_date": "",
    })
}

/// The models a `session/new` answer (or a `config_option_update`) offers: its `model` config
/// option, else the older `models` field.
pub(super) fn models_in(answer: &Value) -> Option<(Vec<ModelInfo>, Option<String>)> {
    models_and_option(answer).map(|(m, c, _)| (m, c))
}

/// The models, the current one, and the config option's id (`None`: the `models` field).
pub(super) fn models_and_option(
    answer: &Value,
) -> Option<(Vec<ModelInfo>, Option<String>, Option<String>)> {
    if let Some(opts) = answer.get("configOptions").and_then(Value::as_array)
        && let Some(opt) = opts.iter().find(|o| {
            o.get("category").and_then(Value::as_str) == Some("model")
                || o.get("id").and_then(Value::as_str) == Some("model")
        })
    {
        let mut models = Vec::new();
        let mut flat = Vec::new();
        for o in opt
            .get("options")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // Options may come grouped: `{group, name, options: [...]}`.
            match o.get("options").and_then(Value::as_array) {
                Some(inner) => flat.extend(inner.iter()),
                None => flat.push(o),
            }
        }
        for o in flat.into_iter().take(200) {
            if let Some(v) = o.get("value").and_then(Value::as_str) {
                let name = o.get("name").and_then(Value::as_str).unwrap_or(v);
                models.push(ModelInfo {
                    id: v.to_string(),
                    name: name.to_string(),
                });
            }
        }
        let current = opt
            .get("currentValue")
            .and_then(Value::as_str)
            .map(String::from);
        let id = opt.get("id").and_then(Value::as_str).map(String::from);
        return Some((models, current, id));
    }
    let m = answer.get("models")?;
    let models = m
        .get("availableModels")
        .and_then(Value::as_array)?
        .iter()
        .take(200)
        .filter_map(|x| {
            let id = x.get("modelId")?.as_str()?;
            Some(ModelInfo {
                id: id.to_string(),
                name: x
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or(id)
                    .to_string(),
            })
        })
        .collect();
    let current = m
        .get("currentModelId")
        .and_then(Value::as_str)
        .map(String::from);
    Some((models, current, None))
}
