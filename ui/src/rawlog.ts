// The raw envelope log: every JSON-RPC envelope in both directions exactly as it crossed the
// wire, with its SSE id, direction, time and size, plus the stream's `gap` events, reconnects and
// HTTP problem answers. It is fed by `tapFetch`, a `fetch` wrapper handed to the ACP client, so it
// shows what was sent and received rather than what the client made of it.
// Invariants: one `<li>` per envelope with `data-direction="in"|"out"` and `data-method`; other
// rows carry `data-kind` (`gap`, `reconnect`, `problem`, `note`) and no `data-direction`; at most
// MAX_ROWS rows are kept (the oldest go first), so a long session cannot exhaust the page.

import { parseSse } from "acp-http-client";
import { byId, bytes, clock, h, pretty } from "./dom";

const MAX_ROWS = 5000;
/** Requests remembered to label their responses, per direction. */
const MAX_PENDING = 10_000;
/** The client's own limit for one event (its default); a larger one ends our copy of the stream. */
const MAX_EVENT_BYTES = 64 * 1024 * 1024;
const encoder = new TextEncoder();

type Direction = "in" | "out";
type JsonRpcId = string | number;

export class RawLog {
  private readonly list = byId<HTMLOListElement>("raw-log");
  private readonly filter = byId<HTMLInputElement>("raw-filter");
  /** Method of each request in flight, by direction of the request and id, to label responses. */
  private readonly requests = { in: new Map<string, string>(), out: new Map<string, string>() };

  constructor() {
    this.filter.addEventListener("input", () => this.applyFilter());
    byId("raw-clear").addEventListener("click", () => this.list.replaceChildren());
  }

  /** A fetch that records the ACP traffic it carries (POST bodies and answers, the SSE stream). */
  tapFetch(): typeof fetch {
    let streams = 0;
    return async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
      const method = (init?.method ?? "GET").toUpperCase();
      let sent: Record<string, unknown> | null = null;
      if (method === "POST" && typeof init?.body === "string") {
        sent = this.envelope("out", init.body, undefined);
      } else if (method === "GET") {
        streams++;
        const last = headerOf(init?.headers, "Last-Event-ID");
        if (streams > 1) {
          this.row({ kind: "reconnect", text: `event stream reopened${last ? ` after id ${last}` : ""} (#${streams - 1})` });
        }
      }
      let res: Response;
      try {
        res = await fetch(input, init);
      } catch (error) {
        if (!init?.signal?.aborted) this.row({ kind: "note", text: `${method} failed: ${String(error)}` });
        throw error;
      }
      if (method === "POST") {
        void this.recordAnswer(res.clone(), sent);
      } else if (method === "GET" && res.ok && res.body) {
        const [mine, theirs] = res.body.tee();
        void this.readStream(mine);
        return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
      } else if (method === "GET" && !res.ok) {
        void this.recordProblem(res.clone(), "event stream");
      }
      return res;
    };
  }

  /** Marks the start of a connection in the log. */
  note(text: string): void {
    this.row({ kind: "note", text });
  }

  private async recordAnswer(res: Response, sent: Record<string, unknown> | null) {
    const label = typeof sent?.method === "string" ? sent.method : "response";
    if (!res.ok) return this.recordProblem(res, label);
    if (res.status !== 200) return; // 202: accepted, no body
    const text = await res.text().catch(() => "");
    if (text.trim()) this.envelope("in", text, undefined);
  }

  private async recordProblem(res: Response, what: string) {
    const text = await res.text().catch(() => "");
    this.row({ kind: "problem", text: `${what}: HTTP ${res.status}`, raw: text, status: res.status });
  }

  /** Reads our branch of the SSE stream (with the SDK's bounded parser) and logs each event. */
  private async readStream(body: ReadableStream<Uint8Array>) {
    try {
      for await (const ev of parseSse(body, MAX_EVENT_BYTES)) this.sseEvent(ev.event, ev.id, ev.data);
      this.row({ kind: "note", text: "event stream ended" });
    } catch {
      // Aborted by the client (disconnect) or dropped; the client reconnects and we log that.
    }
  }

  private sseEvent(event: string, id: string | undefined, data: string) {
    if (event === "gap") {
      let gap = data;
      try {
        const g = JSON.parse(data) as { from: number; to: number };
        gap = `events ${g.from}–${g.to} were evicted before they were read`;
      } catch {
        // keep the raw text
      }
      this.row({ kind: "gap", text: `gap: ${gap}`, raw: data, sseId: id });
      return;
    }
    if (event === "message") this.envelope("in", data, id);
  }

  /** Logs one envelope and returns it parsed (or null when it is not a JSON object). */
  private envelope(dir: Direction, text: string, sseId: string | undefined): Record<string, unknown> | null {
    let msg: Record<string, unknown> | null = null;
    try {
      const v: unknown = JSON.parse(text);
      if (v && typeof v === "object" && !Array.isArray(v)) msg = v as Record<string, unknown>;
    } catch {
      // shown raw below
    }
    let method = "";
    let id: JsonRpcId | undefined;
    let kind = "invalid";
    if (msg) {
      const hasId = typeof msg.id === "string" || typeof msg.id === "number";
      if (hasId) id = msg.id as JsonRpcId;
      if (typeof msg.method === "string") {
        method = msg.method;
        kind = hasId ? "request" : "notification";
        if (hasId) {
          const pending = this.requests[dir];
          pending.set(key(id!), method);
          // Requests never answered (the agent died) must not accumulate without end.
          if (pending.size > MAX_PENDING) pending.delete(pending.keys().next().value!);
        }
      } else if (hasId) {
        // A response answers a request that went the other way.
        const other = dir === "in" ? "out" : "in";
        method = this.requests[other].get(key(id!)) ?? "";
        this.requests[other].delete(key(id!));
        kind = "error" in msg ? "error" : "response";
      }
    }
    this.row({ kind: "envelope", dir, method, id, rpc: kind, raw: text, sseId });
    return msg;
  }

  private row(r: {
    kind: string;
    dir?: Direction;
    method?: string;
    id?: JsonRpcId;
    rpc?: string;
    text?: string;
    raw?: string;
    sseId?: string;
    status?: number;
  }) {
    const now = Date.now();
    const size = r.raw !== undefined ? encoder.encode(r.raw).length : undefined;
    const li = h("li", {
      class: `raw-row kind-${r.kind}${r.dir ? ` dir-${r.dir}` : ""}${r.rpc ? ` rpc-${r.rpc}` : ""}`,
      "data-kind": r.kind,
      "data-direction": r.dir,
      "data-method": r.kind === "envelope" ? (r.method ?? "") : undefined,
      "data-sse-id": r.sseId,
      "data-rpc": r.rpc,
    });
    const arrow = r.dir === "out" ? "→" : r.dir === "in" ? "←" : "•";
    const summary = h(
      "summary",
      {},
      h("span", { class: "arrow", title: r.dir === "out" ? "sent to the agent" : r.dir === "in" ? "from the agent" : "" }, arrow),
      h("span", { class: "sse-id", title: "SSE event id" }, r.sseId ? `#${r.sseId}` : ""),
      h("time", { datetime: new Date(now).toISOString() }, clock(now)),
      h("span", { class: "size" }, size !== undefined ? bytes(size) : ""),
      h("span", { class: "method" }, r.kind === "envelope" ? r.method || (r.rpc ?? "") : (r.text ?? "")),
      r.kind === "envelope" && r.id !== undefined ? h("span", { class: "rpc-id" }, `id ${String(r.id)}`) : null,
      r.kind === "envelope" && r.rpc !== "request" && r.rpc !== "notification" ? h("span", { class: "tag" }, r.rpc) : null,
    );
    if (r.raw !== undefined) {
      const details = h("details", {}, summary);
      const pre = h("pre", {});
      details.append(pre);
      // Pretty-printing every envelope up front would cost time on long streams; do it on open.
      details.addEventListener("toggle", () => {
        if (details.open && !pre.textContent) pre.textContent = prettyText(r.raw!);
      });
      li.append(details);
    } else {
      li.append(h("div", { class: "plain" }, ...summary.childNodes));
    }
    if (!this.matches(li)) li.hidden = true;
    const atBottom = this.list.scrollTop + this.list.clientHeight >= this.list.scrollHeight - 8;
    this.list.append(li);
    while (this.list.childElementCount > MAX_ROWS) this.list.firstElementChild?.remove();
    if (atBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  private matches(li: HTMLElement): boolean {
    const f = this.filter.value.trim().toLowerCase();
    if (!f) return true;
    const m = li.dataset.method;
    return m === undefined || m.toLowerCase().includes(f);
  }

  private applyFilter() {
    for (const li of Array.from(this.list.children) as HTMLElement[]) li.hidden = !this.matches(li);
  }
}

function key(id: JsonRpcId): string {
  return `${typeof id}:${String(id)}`;
}

function prettyText(raw: string): string {
  try {
    return pretty(JSON.parse(raw));
  } catch {
    return raw;
  }
}

function headerOf(headers: HeadersInit | undefined, name: string): string | null {
  if (!headers) return null;
  return new Headers(headers).get(name);
}
