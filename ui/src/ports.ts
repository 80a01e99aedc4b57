// The Ports tab: the TCP listeners inside the sandbox (`GET /v1/ports`) with the process or agent
// instance each belongs to, re-read every 2 s while the tab is shown; *Preview* makes a signed
// link to that port (`POST /v1/ports/{port}/preview`, 1 h) that opens the app in a new tab
// without the token, and keeps it beside the row until it expires or the page reloads.

import { api } from "./api";
import { byId, clear, h } from "./dom";
import type { PortInfo, Preview } from "sandbox-agent";

const EVERY_MS = 2000;

export class PortsPanel {
  private readonly body = byId("ports").querySelector("tbody")!;
  private timer: ReturnType<typeof setInterval> | null = null;
  private readonly previews = new Map<number, Preview>();
  private busy = false;

  constructor(private readonly onError: (error: unknown) => void) {
    byId("ports-refresh").addEventListener("click", () => void this.refresh());
  }

  show(): void {
    void this.refresh();
    this.timer ??= setInterval(() => void this.refresh(), EVERY_MS);
  }

  hide(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  async refresh(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const ports = await api().listPorts();
      clear(this.body);
      for (const p of ports) this.body.append(this.row(p));
      if (!ports.length) this.body.append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "nothing listens")));
    } catch (error) {
      this.hide();
      this.onError(error);
    } finally {
      this.busy = false;
    }
  }

  private row(p: PortInfo): HTMLElement {
    const owner = p.processId ? `process ${p.processId}` : p.serverId ? `agent ${p.serverId}` : "";
    const cell = h("td", { "data-testid": "port-preview" });
    const shown = this.previews.get(p.port);
    if (shown && Date.parse(shown.expiresAt) > Date.now()) {
      cell.append(link(shown));
    } else {
      this.previews.delete(p.port);
      const b = h("button", { type: "button", class: "small", "data-testid": "port-preview-button" }, "Preview");
      b.addEventListener("click", () => void this.preview(p.port, cell));
      cell.append(b);
    }
    return h(
      "tr",
      { "data-testid": "port-row", "data-port": p.port },
      h("td", {}, h("strong", {}, String(p.port)), h("div", { class: "muted" }, p.address)),
      h("td", {}, p.pid === null || p.pid === undefined ? "—" : String(p.pid)),
      h("td", { "data-testid": "port-command" }, h("div", { class: "cmd" }, p.command ?? "—"), owner ? h("div", { class: "muted" }, owner) : null),
      cell,
    );
  }

  private async preview(port: number, cell: HTMLElement): Promise<void> {
    try {
      const p = await api().createPreview(port, { ttl: "1h" });
      this.previews.set(port, p);
      cell.replaceChildren(link(p));
    } catch (error) {
      this.onError(error);
    }
  }
}

function link(p: Preview): HTMLElement {
  const until = new Date(p.expiresAt).toLocaleTimeString();
  return h(
    "div",
    {},
    h("a", { href: p.url, target: "_blank", rel: "noopener noreferrer", "data-testid": "port-preview-link" }, "open"),
    h("span", { class: "muted" }, ` until ${until}`),
  );
}
