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
  private readonly installing = new Set<string>();

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
      h("td", { class: `cred-${cred}` }, cred),
      action,
    );
    const button = h("button", { type: "button", class: "small", "data-testid": `install-${a.id}` }, a.installed ? "Reinstall" : "Install");
    if (this.installing.has(a.id)) button.disabled = true;
    button.addEventListener("click", () => void this.install(a.id, action, button));
    action.append(button);
    return tr;
  }

  private async install(id: string, cell: HTMLElement, button: HTMLButtonElement) {
    this.installing.add(id);
    button.disabled = true;
    // The install endpoint answers once, when done: the progress is indeterminate, with the time.
    const progress = h("progress", { "aria-label": `installing ${id}` });
    const elapsed = h("span", { class: "muted" }, "0 s");
    cell.append(progress, elapsed);
    const started = Date.now();
    const timer = setInterval(() => {
      elapsed.textContent = `${Math.round((Date.now() - started) / 1000)} s`;
    }, 500);
    try {
      const res = await api().installAgent(id);
      const art = res.artifacts[0];
      cell.replaceChildren(
        h("span", { class: "ok" }, res.alreadyInstalled ? "already installed" : `installed${art?.version ? ` ${art.version}` : ""}${art?.source ? ` (${art.source})` : ""}`),
      );
      await this.refresh();
    } catch (error) {
      cell.replaceChildren(h("span", { class: "bad" }, "install failed"), button);
      button.disabled = false;
      this.onError(error);
    } finally {
      clearInterval(timer);
      this.installing.delete(id);
    }
  }
}
