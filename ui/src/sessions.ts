// The session inventory (`GET /v1/sessions`): every ACP session the daemon knows, across all
// serverIds — live, exited, closed and restored after a restart — with agent, state, cwd, the
// agent's title and the last activity. Paged by the daemon's opaque cursor ("More" loads the next
// page); refreshed when the tab is shown or on Refresh, never polled.

import { api } from "./api";
import { byId, clear, h } from "./dom";
import type { SessionItem } from "sandbox-agent";

/** Sessions per page the panel asks for. */
const PAGE = 100;

export class SessionsPanel {
  private readonly body = byId("sessions").querySelector("tbody")!;
  private readonly more = byId<HTMLButtonElement>("sessions-more");
  private cursor: string | undefined;
  private busy = false;

  constructor(private readonly onError: (error: unknown) => void) {
    byId("sessions-refresh").addEventListener("click", () => void this.refresh());
    this.more.addEventListener("click", () => void this.load(false));
  }

  /** The first page again. */
  refresh(): Promise<void> {
    return this.load(true);
  }

  private async load(first: boolean): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const page = await api().listAllSessions({ limit: PAGE, cursor: first ? undefined : this.cursor });
      if (first) clear(this.body);
      for (const s of page.sessions) this.body.append(row(s));
      if (first && !page.sessions.length) {
        this.body.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "no sessions")));
      }
      this.cursor = page.nextCursor ?? undefined;
      this.more.hidden = !this.cursor;
    } catch (error) {
      this.onError(error);
    } finally {
      this.busy = false;
    }
  }
}

function row(s: SessionItem): HTMLElement {
  const when = new Date(s.lastActivityAtMs).toLocaleString();
  return h(
    "tr",
    { "data-testid": "session-row", "data-server-id": s.serverId, "data-session-id": s.sessionId, "data-state": s.state },
    h("td", {}, s.serverId),
    h("td", {}, h("code", {}, s.sessionId)),
    h("td", {}, s.agent),
    h("td", { "data-testid": "session-state" }, s.state),
    h("td", { "data-testid": "session-title" }, s.title ?? "—"),
    h("td", {}, h("div", {}, s.cwd ?? "—"), h("div", { class: "muted" }, when)),
  );
}
