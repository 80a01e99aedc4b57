// The running instances (`GET /v1/acp`): status, pid and process figures, subscribers, pending
// requests, and for an exited one its exit code or signal, exit reason and stderr tail; Stop
// sends DELETE; Attach connects the page to a running instance it did not start. Refreshed every 2 s while this tab is shown and auto-refresh is on, and whenever
// the page's own connection changes; a refresh never overlaps the previous one. An instance
// that backs an OpenCode session (`/opencode/*`) names it: title and OpenCode session id.
// The listing does not carry the stderr tail (the daemon puts it in the problem body of a request
// to an exited instance), so the tail shown is, in order: the listing's own `stderrTail` if a
// daemon sends one, the one this page's connection was told when its agent ended, or one fetched
// on demand ("Show stderr") with a request the exited instance answers with its exit details.

import { api, type Instance } from "./api";
import { byId, bytes, h } from "./dom";
import { Series, sparkline } from "./spark";

export class InstancesPanel {
  private readonly body = byId("instances").querySelector("tbody")!;
  private readonly auto = byId<HTMLInputElement>("instances-auto");
  private busy = false;
  private failing = false;
  /** Exit details learnt outside the listing, by serverId. */
  private readonly exits = new Map<string, { stderrTail?: unknown }>();
  /** Memory and CPU samples of each listed instance, one per refresh (for the sparklines). */
  private readonly series = new Map<string, Series>();

  constructor(
    private readonly current: () => string | null,
    private readonly onError: (error: unknown) => void,
    /** Attaches the page to a running instance. */
    private readonly onAttach: (agent: string, serverId: string) => void,
  ) {
    byId("instances-refresh").addEventListener("click", () => void this.refresh());
    // Polled only while the tab is shown (each poll is a line in the daemon's request log).
    const panel = byId("panel-instances");
    setInterval(() => {
      if (this.auto.checked && !panel.hidden && document.visibilityState === "visible" && !this.failing) void this.refresh();
    }, 2000);
  }

  /** The instance to scroll to and mark at the next render (from the OpenCode sessions list). */
  private revealing: string | null = null;

  /** Shows `serverId`'s row: marked and scrolled into view once the table has it. */
  reveal(serverId: string): void {
    this.revealing = serverId;
    void this.refresh().then(() => this.markRevealed());
  }

  private markRevealed(): void {
    if (!this.revealing) return;
    const row = this.body.querySelector<HTMLElement>(`tr[data-server-id="${CSS.escape(this.revealing)}"]`);
    if (!row) return;
    row.classList.add("revealed");
    row.scrollIntoView({ block: "nearest" });
  }

  /** Records what the daemon said about an instance's end (a problem body with `stderrTail`). */
  remember(serverId: string, problem: Record<string, unknown>): void {
    this.exits.set(serverId, problem);
  }

  /** Stops polling after an error until the next explicit refresh (e.g. a new token). */
  async refresh(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const servers = await api().listInstances();
      this.failing = false;
      this.render(servers);
    } catch (error) {
      this.failing = true;
      this.onError(error);
    } finally {
      this.busy = false;
    }
  }

  private render(servers: Instance[]) {
    const rows: HTMLElement[] = [];
    const now = Date.now();
    for (const id of [...this.series.keys()]) if (!servers.some((s) => s.serverId === id)) this.series.delete(id);
    for (const s of servers) {
      let series = this.series.get(s.serverId);
      if (!series) this.series.set(s.serverId, (series = new Series()));
      series.push(now, s.rssBytes, s.cpuMs);
      const status = s.status ?? "running";
      const exit =
        status === "exited"
          ? [s.exitCode != null ? `code ${s.exitCode}` : null, s.signal != null ? `signal ${String(s.signal)}` : null, s.exitReason]
              .filter(Boolean)
              .join(", ")
          : "";
      const stop = h("button", { type: "button", class: "small", "data-testid": "stop-button" }, status === "exited" ? "Remove" : "Stop");
      stop.addEventListener("click", async () => {
        stop.disabled = true;
        try {
          await api().stopInstance(s.serverId);
        } catch (error) {
          this.onError(error);
        }
        await this.refresh();
      });
      let attach: HTMLElement | null = null;
      if (status !== "exited" && s.serverId !== this.current()) {
        attach = h("button", { type: "button", class: "small", "data-testid": "attach-button" }, "Attach");
        attach.addEventListener("click", () => this.onAttach(s.agent, s.serverId));
      }
      const figures = h(
        "div",
        { class: "figures" },
        fig("pid", s.pid),
        fig("RSS", s.rssBytes != null ? bytes(s.rssBytes) : null),
        fig("CPU", s.cpuMs != null ? `${(s.cpuMs / 1000).toFixed(2)} s` : null),
        fig("procs", s.processes),
        fig("subs", s.subscribers),
        fig("pending", s.pendingRequests),
        fig("last id", s.lastEventId),
      );
      const mem = series.memory();
      const cpu = series.cpu();
      const trends =
        status === "exited"
          ? null
          : h(
              "div",
              { class: "trends" },
              h("span", { class: "trend" }, h("span", { class: "muted" }, "memory "), sparkline(mem, `memory over the last ${mem.length} samples`, "spark-memory")),
              h(
                "span",
                { class: "trend" },
                h("span", { class: "muted" }, "CPU "),
                sparkline(cpu, `CPU over the last ${cpu.length} intervals`, "spark-cpu", 0.05),
                cpu.length ? ` ${Math.round(cpu[cpu.length - 1] * 100)}%` : "",
              ),
            );
      rows.push(
        h(
          "tr",
          { "data-server-id": s.serverId, "data-status": status, class: s.serverId === this.current() ? "current" : "" },
          h(
            "th",
            { scope: "row" },
            h("div", { class: "sid", "data-field": "server-id" }, ...breakable(s.serverId)),
            h("div", { class: "muted" }, s.agent),
            s.opencode
              ? h(
                  "div",
                  { class: "oc-link", "data-field": "opencode-session", title: "The OpenCode session this instance backs" },
                  h("span", { class: "muted" }, "OpenCode "),
                  h("span", { "data-field": "opencode-title" }, s.opencode.title),
                  " ",
                  h("code", { "data-field": "opencode-session-id" }, s.opencode.sessionId),
                )
              : null,
            stop,
            attach,
          ),
          h(
            "td",
            {},
            h("span", { class: `badge st-${status}`, "data-field": "status" }, status),
            exit ? h("div", { "data-field": "exit" }, exit) : null,
            s.exitCode != null ? h("span", { hidden: true, "data-field": "exit-code" }, String(s.exitCode)) : null,
          ),
          h("td", {}, figures, trends),
        ),
      );
      const tail = s.stderrTail ?? (this.exits.get(s.serverId)?.stderrTail as string | undefined);
      if (status === "exited" && tail === undefined) {
        const show = h("button", { type: "button", class: "small", "data-testid": "stderr-button" }, "Show stderr");
        show.addEventListener("click", async () => {
          show.disabled = true;
          try {
            this.remember(s.serverId, await api().exitDetails(s.serverId));
          } catch (error) {
            this.onError(error);
          }
          await this.refresh();
        });
        rows.push(h("tr", { class: "stderr-row" }, h("td", { colspan: 3 }, show)));
      }
      if (status === "exited" && tail !== undefined) {
        rows.push(
          h(
            "tr",
            { class: "stderr-row", "data-stderr-of": s.serverId },
            h("td", { colspan: 3 }, h("details", { open: true }, h("summary", {}, "stderr (last lines)"), h("pre", { class: "stderr", "data-field": "stderr-tail" }, tail || "(nothing on stderr)"))),
          ),
        );
      }
    }
    if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "no instances")));
    // Keep open <details> state out of it: the table is small and rebuilt whole.
    this.body.replaceChildren(...rows);
    this.markRevealed();
  }
}

function fig(label: string, value: string | number | null | undefined): HTMLElement {
  return h("span", { class: "fig" }, h("span", { class: "muted" }, `${label} `), value == null ? "–" : String(value));
}

/** An id as text with a line-break opportunity after each `-`, `_` and `.`, and nowhere else. */
function breakable(id: string): (string | HTMLElement)[] {
  const out: (string | HTMLElement)[] = [];
  for (const part of id.split(/(?<=[-_.])/)) {
    if (out.length) out.push(h("wbr", {}));
    out.push(part);
  }
  return out;
}
