//! What session bundles (`acp::bundle`) need of the registry: the state dir, the agent check,
//! the log limits, holding a serverId for its import and listing it once imported; and the
//! agent's own session files made ready for a restore (after a restart as after an import).

use std::sync::Arc;

use super::AcpService;
use crate::acp::events::LogLimits;
use crate::acp::instance::AcpInstance;

/// A serverId held for its import until `insert_imported` lists it or the import fails.
pub(crate) struct ImportReservation<'a> {
    acp: &'a AcpService,
    server_id: String,
}

impl Drop for ImportReservation<'_> {
    fn drop(&mut self) {
        crate::sys::lock(&self.acp.importing).remove(&self.server_id);
    }
}

impl AcpService {
    /// The state dir's store, when there is one (session bundles need it).
    pub(crate) fn state_store(&self) -> Option<Arc<crate::state::StateStore>> {
        self.state.clone()
    }

    pub(crate) fn knows_agent(&self, agent: &str) -> bool {
        self.deps.agents.is_known(agent)
    }

    pub(crate) fn log_limits(&self) -> LogLimits {
        self.limits
    }

    /// Holds `server_id` for an import: `None` when it exists or is being imported already.
    pub(crate) fn reserve_import(&self, server_id: &str) -> Option<ImportReservation<'_>> {
        let map = self.instances();
        if map.contains_key(server_id)
            || !crate::sys::lock(&self.importing).insert(server_id.to_string())
        {
            return None;
        }
        Some(ImportReservation {
            acp: self,
            server_id: server_id.to_string(),
        })
    }

    /// Lists an imported serverId as a recovered one (`exited`, restored by its first POST);
    /// false when the serverId exists meanwhile.
    pub(crate) fn insert_imported(
        &self,
        _held: &ImportReservation<'_>,
        server_id: &str,
        m: &crate::acp::bundle::Manifest,
        events: Vec<(u64, bytes::Bytes)>,
        next_id: u64,
        t: Arc<crate::acp::durable::Tracked>,
    ) -> bool {
        let mut map = self.instances();
        if map.contains_key(server_id) || self.stops.is_closed() {
            return false;
        }
        let base = self.make_instance(server_id, &m.agent);
        let log = crate::acp::events::EventLog::recovered(self.limits, events, next_id, None);
        let inst = AcpInstance::recovered(base, m.created_at_ms, log);
        // The inventory lists an imported session like one restored after a restart.
        let meta = t.meta();
        for s in &meta.sessions {
            self.inventory.record(s.entry(server_id, &meta));
        }
        if let Some(caps) = meta.session_caps() {
            self.inventory.set_caps(server_id, caps);
        }
        inst.events.set_durable(t);
        map.insert(server_id.to_string(), Arc::new(inst));
        true
    }

    /// Before the agent of a serverId that awaits its restore starts: the agent's own session
    /// files are made ready for the restore's `session/load` (Gemini's file of the current
    /// minute renamed, `agent_files::gemini_ready_for_load`). Logged, never fatal: a file left
    /// as it was makes that session's restore fail, named in `_sandboxagent/restored`.
    pub(crate) async fn ready_for_restore(&self, inst: &AcpInstance) {
        if inst.agent != "gemini" {
            return;
        }
        let Some(t) = inst.events.durable() else {
            return;
        };
        if !t.awaits_restore() {
            return;
        }
        let Some(home) = self.deps.agents.home_of(&inst.agent) else {
            return;
        };
        let sessions: Vec<String> = t
            .meta()
            .sessions
            .into_iter()
            .map(|s| s.session_id)
            .collect();
        let server_id = inst.server_id.clone();
        let work = move || {
            let now = crate::acp::inventory::now_ms();
            for sid in sessions {
                match crate::acp::bundle::agent_files::gemini_ready_for_load(&home, &sid, now) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(server_id = %server_id, session_id = %sid, files = n,
                        "Gemini session file renamed for an earlier minute before its restore"),
                    Err(e) => tracing::warn!(server_id = %server_id, session_id = %sid, error = %e,
                        "cannot rename a Gemini session file before its restore"),
                }
            }
        };
        let _ = tokio::task::spawn_blocking(work).await;
    }
}
