// The OpenCode sessions (`GET /opencode/session`, docs/opencode.md): each is an ACP session on an
// instance of its own, so each row names the instance (serverId) and ACP session behind it —
// the other half of the link the Instances tab shows from the instance's side. Loaded with the
// Sessions tab (on show and on Refresh), never polled. A daemon without the bridge answers 404:
// the section stays hidden.

import { ApiError, api, type OpenCodeSession } from "./api";
import { byId, h } from "./dom";

export class OpenCodePanel {
  private readonly section = byId("opencode-sessions");
  private readonly body = byId("opencode-sessions-table").querySelector("tbody")!;
  private busy = false;

  constructor(
    private readonly onError: (error: unknown) => void,
    /** Shows an instance in the Instances tab. */
    private readonly showInstance: (serverId: string) => void,
  ) {}

  async refresh(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const sessions = await api().openCodeSessions();
      this.section.hidden = false;
      this.body.replaceChildren(
        ...(sessions.length
          ? sessions.map((s) => this.row(s))
          : [h("tr", {}, h("td", { colspan: 4, class: "muted" }, "no OpenCode sessions"))]),
      );
    } catch (error) {
      this.section.hidden = true;
      if (!(error instanceof ApiError && error.status === 404)) this.onError(error);
    } finally {
      this.busy = false;
    }
  }

  private row(s: OpenCodeSession): HTMLElement {
    const model = s.providerID ? `${s.providerID}/${s.modelID ?? "default"}` : "—";
    const show = h("button", { type: "button", class: "small link", "data-field": "acp-server-id", title: "Show this instance" }, s.acpServerId);
    show.addEventListener("click", () => this.showInstance(s.acpServerId));
    return h(
      "tr",
      { "data-testid": "opencode-session-row", "data-opencode-session": s.id },
      h("td", {}, h("div", { "data-field": "opencode-title" }, s.title), h("code", { class: "muted" }, s.id)),
      h("td", {}, model),
      h("td", {}, show, h("div", { class: "muted", "data-field": "acp-session-id" }, s.acpSessionId ?? "no ACP session yet")),
      h("td", {}, new Date(s.time.updated).toLocaleString()),
    );
  }
}
