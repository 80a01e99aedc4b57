// The permission dialog: each `session/request_permission` from the agent is shown as a modal
// with one button per option the agent offered (`data-option-id`, `data-kind`); the choice is
// the response POSTed back. Escape, or the connection going away, answers `cancelled`.
// Invariant: every request gets exactly one answer; requests that arrive while one is shown wait
// their turn in order.

import type { RequestPermissionRequest, RequestPermissionResponse } from "@agentclientprotocol/sdk";
import { byId, h, pretty } from "./dom";

interface Pending {
  req: RequestPermissionRequest;
  resolve: (r: RequestPermissionResponse) => void;
}

export class PermissionDialog {
  private readonly dialog = byId<HTMLDialogElement>("permission");
  private readonly queue: Pending[] = [];
  private current: Pending | null = null;

  constructor() {
    // Escape closes a modal dialog with a `cancel` event: answer `cancelled` rather than nothing.
    this.dialog.addEventListener("cancel", (e) => {
      e.preventDefault();
      this.answer({ outcome: { outcome: "cancelled" } });
    });
  }

  ask(req: RequestPermissionRequest): Promise<RequestPermissionResponse> {
    return new Promise((resolve) => {
      this.queue.push({ req, resolve });
      if (!this.current) this.showNext();
    });
  }

  /** Answers every request shown or waiting with `cancelled` (the connection is going away). */
  dismiss(): void {
    while (this.current) this.answer({ outcome: { outcome: "cancelled" } });
  }

  private showNext() {
    const next = this.queue.shift();
    this.current = next ?? null;
    if (!next) {
      if (this.dialog.open) this.dialog.close();
      return;
    }
    const tool = (next.req.toolCall ?? {}) as { title?: string | null; toolCallId?: string; kind?: string | null; rawInput?: unknown };
    byId("permission-text").textContent = `The agent asks to run: ${tool.title ?? tool.toolCallId ?? "a tool call"}${tool.kind ? ` (${tool.kind})` : ""}`;
    byId("permission-detail").textContent = tool.rawInput !== undefined ? pretty(tool.rawInput) : `session ${next.req.sessionId}`;
    const options = byId("permission-options");
    options.replaceChildren(
      ...next.req.options.map((o) => {
        const b = h(
          "button",
          { type: "button", "data-option-id": o.optionId, "data-kind": o.kind, class: `opt kind-${o.kind}` },
          o.name,
        );
        b.addEventListener("click", () => this.answer({ outcome: { outcome: "selected", optionId: o.optionId } }));
        return b;
      }),
    );
    if (!this.dialog.open) this.dialog.showModal();
    (options.querySelector("button") as HTMLButtonElement | null)?.focus();
  }

  private answer(r: RequestPermissionResponse) {
    const cur = this.current;
    if (!cur) return;
    this.current = null;
    cur.resolve(r);
    this.showNext();
  }
}
