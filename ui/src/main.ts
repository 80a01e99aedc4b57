// The inspector's entry point: wires the panels together, the token form, the error notice and
// the tabs. The page loads without a token; every API call sends the one entered here (kept in
// sessionStorage), and a refused token is reported in words, never as a blank page.

import { ApiError, api, getToken, setToken } from "./api";
import { AgentsPanel } from "./agents";
import { ChangesPanel } from "./changes";
import { DesktopPanel } from "./desktop";
import { byId } from "./dom";
import { FilesPanel } from "./files";
import { InstancesPanel } from "./instances";
import { SessionsPanel } from "./sessions";
import { OpenCodePanel } from "./opencode";
import { PermissionDialog } from "./permission";
import { PortsPanel } from "./ports";
import { RawLog } from "./rawlog";
import { SessionView } from "./session";
import { Transcript } from "./transcript";

const notice = byId("notice");

function showError(error: unknown): void {
  notice.hidden = false;
  if (error instanceof ApiError && error.status === 401) {
    notice.dataset.kind = "auth";
    notice.textContent = getToken()
      ? `The daemon refused this token (HTTP 401: ${error.problem.detail ?? error.problem.title}). Enter the right token above.`
      : "This daemon needs a bearer token: enter it above.";
    session.showAuthProblem(getToken() ? "token refused" : "token required");
    byId("token").focus();
    return;
  }
  notice.dataset.kind = "error";
  notice.textContent =
    error instanceof ApiError
      ? `${error.problem.title}${error.status ? ` (HTTP ${error.status})` : ""}: ${error.problem.detail ?? ""}`
      : `Error: ${error instanceof Error ? error.message : String(error)}`;
}

function clearError(): void {
  notice.hidden = true;
  notice.textContent = "";
}

const transcript = new Transcript();
const raw = new RawLog();
const permission = new PermissionDialog();
let instances: InstancesPanel;
const session = new SessionView(
  transcript,
  raw,
  permission,
  () => void instances?.refresh(),
  (serverId, problem) => instances?.remember(serverId, problem),
);
instances = new InstancesPanel(
  () => session.connectedServerId,
  showError,
  (agent, serverId) => {
    byId<HTMLInputElement>("server-id").value = serverId;
    void session.connect(agent, serverId);
  },
);
const agents = new AgentsPanel((agent, serverId) => void session.connect(agent, serverId), showError);
const files = new FilesPanel(showError);
const sessionsPanel = new SessionsPanel(showError);
const openCode = new OpenCodePanel(showError, (serverId) => {
  selectTab(byId<HTMLButtonElement>("tab-instances"));
  instances.reveal(serverId);
});
byId("sessions-refresh").addEventListener("click", () => void openCode.refresh());
const desktop = new DesktopPanel(showError);
const changes = new ChangesPanel(showError);
const ports = new PortsPanel(showError);

/** (Re)loads everything that depends on the token. */
async function load(): Promise<void> {
  clearError();
  if (!(await agents.refresh())) return;
  // The token works: whatever the status said about it no longer holds.
  session.clearAuthProblem();
  await instances.refresh();
  const cwd = byId<HTMLInputElement>("cwd");
  if (!cwd.value) {
    try {
      cwd.value = (await api().stat(".")).path;
    } catch (error) {
      showError(error);
    }
  }
  void files.open("");
}

const tokenInput = byId<HTMLInputElement>("token");
tokenInput.value = getToken();
byId("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken(tokenInput.value.trim());
  void load();
});

// Tabs: arrow keys move between them (the WAI-ARIA tabs pattern), Enter/Space/click select.
const tabs = Array.from(document.querySelectorAll<HTMLButtonElement>('[role="tab"]'));
function selectTab(tab: HTMLButtonElement) {
  for (const t of tabs) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    byId(t.getAttribute("aria-controls")!).hidden = !on;
  }
  tab.focus();
  if (tab.id === "tab-instances") void instances.refresh();
  if (tab.id === "tab-sessions") {
    void sessionsPanel.refresh();
    void openCode.refresh();
  }
  if (tab.id === "tab-changes") void changes.show();
  if (tab.id === "tab-ports") ports.show();
  else ports.hide();
  if (tab.id === "tab-desktop") void desktop.show();
  else desktop.hide();
}
for (const [i, tab] of tabs.entries()) {
  tab.addEventListener("click", () => selectTab(tab));
  tab.addEventListener("keydown", (e) => {
    const step = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
    if (step) selectTab(tabs[(i + step + tabs.length) % tabs.length]);
  });
}

void load();
