// The conversation: the user's prompts and the agent's `session/update`s rendered as messages
// (consecutive chunks of one kind join one message, each chunk its own span, in arrival order),
// thoughts, tool calls whose status and content are updated in place, plans and diffs, and the
// end of each turn with its stop reason. Updates of kinds it does not know are shown as JSON
// rather than dropped. Invariants: agent text is only ever inserted as text (see dom.ts); at most
// MAX_ITEMS items are kept (the oldest go first, and the transcript says how many went).

import { byId, h, pretty } from "./dom";
import { lineDiff } from "./diff";

type Json = Record<string, unknown>;

const MAX_ITEMS = 2000;

export class Transcript {
  private readonly list = byId<HTMLOListElement>("transcript");
  /** The message the next chunk of the same role joins, if nothing came in between. */
  private open: { role: string; el: HTMLElement } | null = null;
  private readonly tools = new Map<string, HTMLElement>();
  private plan: HTMLElement | null = null;
  private dropped = 0;

  clear(): void {
    this.dropped = 0;
    this.list.replaceChildren();
    this.open = null;
    this.tools.clear();
    this.plan = null;
  }

  user(text: string): void {
    this.push(h("li", { class: "msg user", "data-role": "user" }, h("span", { class: "chunk" }, text)));
  }

  info(text: string, kind = "info", role = kind): void {
    this.push(h("li", { class: `note ${kind}`, "data-role": role }, text));
  }

  error(title: string, detail?: string, stderr?: string | null): void {
    const li = h("li", { class: "note error", "data-role": "error", role: "alert" }, h("strong", {}, title));
    if (detail) li.append(h("div", {}, detail));
    if (stderr) li.append(h("pre", { class: "stderr" }, stderr));
    this.push(li);
  }

  turnEnd(stopReason: string): void {
    this.push(
      h("li", { class: `turn-end stop-${stopReason}`, "data-role": "turn-end", "data-stop-reason": stopReason }, `turn ended: ${stopReason}`),
    );
  }

  /** One `session/update` notification's `params`. */
  update(params: Json): void {
    const u = (params.update ?? {}) as Json;
    switch (u.sessionUpdate) {
      case "agent_message_chunk":
        return this.chunk("agent", u.content);
      case "agent_thought_chunk":
        return this.chunk("thought", u.content);
      case "user_message_chunk":
        return this.chunk("user", u.content);
      case "tool_call":
      case "tool_call_update":
        return this.tool(u);
      case "plan":
        return this.showPlan(u);
      case "current_mode_update":
        return this.info(`mode: ${String(u.currentModeId ?? u.modeId ?? "?")}`, "meta");
      case "available_commands_update": {
        const cmds = Array.isArray(u.availableCommands) ? (u.availableCommands as Json[]) : [];
        return this.info(`commands: ${cmds.map((c) => `/${String(c.name)}`).join(" ") || "none"}`, "meta");
      }
      default:
        this.push(
          h(
            "li",
            { class: "note meta", "data-role": "update" },
            h("details", {}, h("summary", {}, `update: ${String(u.sessionUpdate ?? "?")}`), h("pre", {}, pretty(u))),
          ),
        );
    }
  }

  private chunk(role: string, content: unknown) {
    const span = h("span", { class: "chunk" }, contentText(content));
    if (this.open?.role === role && this.open.el === this.list.lastElementChild) {
      this.open.el.append(span);
      this.scroll();
      return;
    }
    const el = h("li", { class: `msg ${role}`, "data-role": role }, span);
    this.push(el);
    this.open = { role, el };
  }

  private tool(u: Json) {
    const id = String(u.toolCallId ?? "");
    let el = this.tools.get(id);
    if (!el) {
      el = h("li", { class: "tool", "data-role": "tool-call", "data-tool-call-id": id });
      el.append(
        h("div", { class: "tool-head" }, h("span", { class: "badge" }, ""), h("span", { class: "tool-title" }, ""), h("span", { class: "tool-kind muted" }, "")),
        h("div", { class: "tool-body" }),
      );
      this.tools.set(id, el);
      this.push(el);
    }
    const status = typeof u.status === "string" ? u.status : el.dataset.status || "pending";
    el.dataset.status = status;
    el.querySelector(".badge")!.textContent = status.replace("_", " ");
    if (typeof u.title === "string") el.querySelector(".tool-title")!.textContent = u.title;
    else if (!el.querySelector(".tool-title")!.textContent) el.querySelector(".tool-title")!.textContent = `tool call ${id}`;
    if (typeof u.kind === "string") el.querySelector(".tool-kind")!.textContent = u.kind;
    if (Array.isArray(u.content) || Array.isArray(u.locations)) {
      const body = el.querySelector(".tool-body")!;
      if (Array.isArray(u.content)) {
        body.replaceChildren();
        for (const c of u.content as Json[]) body.append(toolContent(c));
      }
      if (Array.isArray(u.locations) && u.locations.length) {
        const locs = (u.locations as Json[]).map((l) => `${String(l.path)}${l.line != null ? `:${String(l.line)}` : ""}`);
        body.append(h("div", { class: "muted" }, `at ${locs.join(", ")}`));
      }
    }
    this.scroll();
  }

  private showPlan(u: Json) {
    const entries = Array.isArray(u.entries) ? (u.entries as Json[]) : [];
    const el = h(
      "li",
      { class: "plan", "data-role": "plan" },
      h("div", { class: "plan-head" }, "plan"),
      h(
        "ol",
        {},
        ...entries.map((e) =>
          h(
            "li",
            { "data-status": String(e.status ?? "pending"), class: `plan-entry status-${String(e.status ?? "pending")}` },
            h("span", { class: "badge" }, String(e.status ?? "pending").replace("_", " ")),
            " ",
            String(e.content ?? ""),
            e.priority ? h("span", { class: "muted" }, ` (${String(e.priority)})`) : null,
          ),
        ),
      ),
    );
    // The agent sends the whole plan each time: the latest replaces the one shown.
    if (this.plan && this.plan.isConnected) this.plan.replaceWith(el);
    else this.push(el);
    this.plan = el;
  }

  private push(el: HTMLElement) {
    this.list.append(el);
    this.open = null;
    this.trim();
    this.scroll();
  }

  private trim() {
    let marker = this.list.firstElementChild as HTMLElement | null;
    if (marker?.dataset.role !== "dropped") marker = null;
    const limit = MAX_ITEMS + (marker ? 1 : 0);
    if (this.list.childElementCount <= limit) return;
    while (this.list.childElementCount > limit) {
      const first = (marker ? marker.nextElementSibling : this.list.firstElementChild) as HTMLElement | null;
      if (!first) break;
      if (first.dataset.toolCallId) this.tools.delete(first.dataset.toolCallId);
      first.remove();
      this.dropped++;
    }
    if (!marker) {
      marker = h("li", { class: "note meta", "data-role": "dropped" });
      this.list.prepend(marker);
    }
    marker.textContent = `${this.dropped} earlier items were removed (the transcript keeps the last ${MAX_ITEMS})`;
  }

  private scroll() {
    this.list.scrollTop = this.list.scrollHeight;
  }
}

/** The text of an ACP content block (text, or a placeholder for the other kinds). */
export function contentText(content: unknown): string {
  const c = (content ?? {}) as Json;
  switch (c.type) {
    case "text":
      return String(c.text ?? "");
    case "image":
      return `[image ${String(c.mimeType ?? "")}]`;
    case "audio":
      return `[audio ${String(c.mimeType ?? "")}]`;
    case "resource_link":
      return `[${String(c.name ?? "link")}: ${String(c.uri ?? "")}]`;
    case "resource": {
      const r = (c.resource ?? {}) as Json;
      return typeof r.text === "string" ? r.text : `[resource ${String(r.uri ?? "")}]`;
    }
    default:
      return pretty(content);
  }
}

function toolContent(c: Json): HTMLElement {
  if (c.type === "diff") {
    const path = String(c.path ?? "");
    const oldText = typeof c.oldText === "string" ? c.oldText : null;
    const newText = String(c.newText ?? "");
    const pre = h("pre", { class: "diff", "data-role": "diff" });
    for (const line of lineDiff(oldText ?? "", newText)) {
      pre.append(h("span", { class: `d-${line.op}` }, `${line.op === "add" ? "+" : line.op === "del" ? "-" : " "} ${line.text}\n`));
    }
    return h("div", { class: "diff-block" }, h("div", { class: "muted" }, `${oldText === null ? "new file" : "diff"} ${path}`), pre);
  }
  if (c.type === "terminal") return h("div", { class: "muted" }, `terminal ${String(c.terminalId ?? "")}`);
  if (c.type === "content") return h("div", { class: "tool-text" }, contentText(c.content));
  return h("pre", {}, pretty(c));
}
