// The agents panel: every known agent with its install state, provenance (`source`) and whether
// credentials were found; install with visible progress; and the connect form (agent and a
// generated, editable serverId). Invariant: a generated serverId is never reused for a second
// connection (an exited instance keeps its id until it is stopped), one the user typed is.

import { api, type AgentInfo } from "./api";
import { byId, h, randomHex } from "./dom";

export class AgentsPanel {
  private readonly select = byId<HTMLSelectElement>("agent");
  private readonly serverId = byId<HTMLInputElement>("server-id");
  private readonly body = byId("agents").querySelector("tbody")!;
  private edited = false;
  private readonly used = new Set<string>();
  /** Installs running, with when each started (the table may be redrawn meanwhile). */
  private readonly installing = new Map<string, number>();
  /** The outcome of the last install of each agent, shown until the page reloads. */
  private readonly outcomes = new Map<string, { ok: boolean; text: string }>();

  constructor(
    private readonly onConnect: (agent: string, serverId: string) => void,
    private readonly onError: (error: unknown) => void,
  ) {
    this.select.addEventListener("change", () => {
      if (!this.edited) this.serverId.value = this.generate();
    });
    this.serverId.addEventListener("input", () => {
      this.edited = this.serverId.value.trim() !== "";
    });
    byId("connect-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const agent = this.select.value;
      if (!agent) return;
      let id = this.serverId.value.trim();
      if (!id || (!this.edited && this.used.has(id))) id = this.generate();
      this.serverId.value = id;
      this.used.add(id);
      this.onConnect(agent, id);
    });
    byId("agents-refresh").addEventListener("click", () => void this.refresh());
  }

  /** The id the next connection will use unless the user edits it. */
  private generate(): string {
    return `inspector-${this.select.value || "agent"}-${randomHex(8)}`;
  }

  async refresh(): Promise<boolean> {
    let agents: AgentInfo[];
    try {
      agents = await api().listAgents();
    } catch (error) {
      this.onError(error);
      return false;
    }
    const previous = this.select.value;
    this.select.replaceChildren(
      ...agents.map((a) => h("option", { value: a.id }, `${a.id}${a.installed ? "" : " (not installed)"}`)),
    );
    const pick = agents.some((a) => a.id === previous) ? previous : agents.some((a) => a.id === "mock") ? "mock" : (agents[0]?.id ?? "");
    this.select.value = pick;
    if (!this.edited && (!this.serverId.value || this.used.has(this.serverId.value) || !this.serverId.value.includes(`-${pick}-`))) {
      this.serverId.value = this.generate();
    }
    this.body.replaceChildren(...agents.map((a) => this.row(a)));
    byId<HTMLButtonElement>("connect").disabled = agents.length === 0;
    return true;
  }

  private row(a: AgentInfo): HTMLTableRowElement {
    const cred = a.credentialsAvailable === true ? "found" : a.credentialsAvailable === false ? "missing" : "–";
    const action = h("td", {});
    const tr = h(
      "tr",
      { "data-agent": a.id, "data-installed": String(a.installed) },
      h("th", { scope: "row" }, a.id),
      h("td", { title: a.path ?? "" }, a.installed ? (a.version ?? "yes") : "no"),
      h("td", {}, a.source ?? "–"),
      h("td", { class: `cred-${cred}`, title: cred === "missing" ? credentialsHint(a) : "" }, cred),
      action,
    );
    if (a.source === "builtin") {
      // Part of the daemon's own binary: nothing to install or reinstall.
      action.append(h("span", { class: "muted", "data-field": "builtin" }, "built in"));
      return tr;
    }
    const button = h("button", { type: "button", class: "small", "data-testid": `install-${a.id}` }, a.installed ? "Reinstall" : "Install");
    button.addEventListener("click", () => void this.install(a.id));
    action.append(button);
    const started = this.installing.get(a.id);
    if (started !== undefined) {
      button.disabled = true;
      // The install endpoint answers once, when done: the progress is indeterminate, with the time.
      action.append(
        h("progress", { "aria-label": `installing ${a.id}` }),
        h("span", { class: "muted", "data-install-started": started }, elapsed(started)),
      );
    }
    const outcome = this.outcomes.get(a.id);
    if (outcome) action.append(h("div", { class: outcome.ok ? "ok" : "bad", "data-field": "install-outcome" }, outcome.text));
    return tr;
  }

  private async install(id: string) {
    this.installing.set(id, Date.now());
    const timer = setInterval(() => {
      for (const el of this.body.querySelectorAll<HTMLElement>("[data-install-started]")) {
        el.textContent = elapsed(Number(el.dataset.installStarted));
      }
    }, 500);
    void this.refresh();
    try {
      const res = await api().installAgent(id);
      const art = res.artifacts[0];
      const text = res.alreadyInstalled
        ? "already installed"
        : `installed${art?.version ? ` ${art.version}` : ""}${art?.source ? ` (${art.source})` : ""}`;
      this.outcomes.set(id, { ok: true, text });
    } catch (error) {
      this.outcomes.set(id, { ok: false, text: "install failed" });
      this.onError(error);
    } finally {
      clearInterval(timer);
      this.installing.delete(id);
    }
    await this.refresh();
  }
}

function elapsed(started: number): string {
  return `${Math.round((Date.now() - started) / 1000)} s`;
}

/**
 * What the daemon knows about where an agent looks for credentials, in words: the variables (any
 * one, in the daemon's environment or `--agent-env`) and the files (any one, `~` being the
 * agent's HOME). Empty when the daemon knows of none.
 */
export function credentialsHint(a: Pick<AgentInfo, "id" | "credentialsEnv" | "credentialsFiles">): string {
  const env = a.credentialsEnv ?? [];
  const files = a.credentialsFiles ?? [];
  const ways: string[] = [];
  if (env.length) ways.push(`set ${env.length > 1 ? "one of " : ""}${env.join(", ")} in the daemon's environment (or pass it with --agent-env)`);
  if (files.length) ways.push(`create ${files.length > 1 ? "one of " : ""}${files.join(", ")} (~ is the agent's HOME), e.g. by logging in with the agent's own CLI`);
  if (!ways.length) return "";
  return `The daemon finds no credentials for ${a.id}: ${ways.join(", or ")}.`;
}
