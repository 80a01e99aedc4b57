// One ACP connection at a time, through the SDK's `AcpHttpClient`: connect (the first POST,
// `initialize`, creates the agent instance, or attaches to an existing one), `session/new`,
// prompts, cancel, disconnect (DELETE for an instance the page started, a detach otherwise).
// What the agent streams goes to the transcript; its permission requests to the dialog; every
// envelope to the raw log (through the tapped fetch). Invariant: the prompt controls are enabled
// only while a session exists on a live connection, and each prompt's outcome (stop reason or
// error) is shown exactly once.

import { AcpHttpClient, AcpHttpError } from "acp-http-client";
import { credentialsHint } from "./agents";
import { api, baseUrl, token } from "./api";
import { byId, clear, h, pretty } from "./dom";
import type { PermissionDialog } from "./permission";
import type { RawLog } from "./rawlog";
import type { Transcript } from "./transcript";

type Json = Record<string, unknown>;
export type ConnectionState = "disconnected" | "connecting" | "connected" | "closed" | "error";

export class SessionView {
  private client: AcpHttpClient | null = null;
  private serverId = "";
  /** Whether this page started the instance (then Disconnect stops it) or attached to it. */
  private owned = false;
  private sessionId: string | null = null;
  private running = 0;
  private readonly status = byId("status");
  private readonly prompt = byId<HTMLTextAreaElement>("prompt");
  private readonly send = byId<HTMLButtonElement>("send");
  private readonly cancelBtn = byId<HTMLButtonElement>("cancel");
  private readonly newBtn = byId<HTMLButtonElement>("session-new");
  private readonly connectBtn = byId<HTMLButtonElement>("connect");
  private readonly disconnectBtn = byId<HTMLButtonElement>("disconnect");
  private readonly cwd = byId<HTMLInputElement>("cwd");

  constructor(
    private readonly transcript: Transcript,
    private readonly raw: RawLog,
    private readonly permission: PermissionDialog,
    /** Called when an instance may have changed (created, ended, stopped). */
    private readonly onChange: () => void,
    /** Called with the problem body when the daemon reports that this connection's agent ended. */
    private readonly onExit: (serverId: string, problem: Record<string, unknown>) => void = () => {},
  ) {
    byId("session-form").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.newSession();
    });
    byId("prompt-form").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.sendPrompt();
    });
    this.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        void this.sendPrompt();
      } else if (e.key === "Escape" && this.running > 0) {
        // Escape in the prompt cancels the running turn, so the keyboard never has to leave it.
        e.preventDefault();
        void this.cancel();
      }
    });
    this.cancelBtn.addEventListener("click", () => void this.cancel());
    this.disconnectBtn.addEventListener("click", () => void this.disconnect());
    this.setState("disconnected", "not connected");
  }

  get connectedServerId(): string | null {
    return this.client ? this.serverId : null;
  }

  /**
   * Connects to `serverId`: an instance that already exists is attached to as it is (no
   * `?agent=`, so it works whatever agent runs there); otherwise `agent` is started.
   */
  async connect(agent: string, serverId: string): Promise<void> {
    if (this.client) await this.disconnect();
    let existing: string | undefined;
    try {
      existing = (await api().listInstances()).find((s) => s.serverId === serverId)?.agent;
    } catch {
      // Not knowing only means the first POST names the agent; the daemon checks it.
    }
    if (existing) agent = existing;
    this.agent = agent;
    this.owned = !existing;
    this.serverId = serverId;
    this.sessionId = null;
    this.transcript.clear();
    this.showInit(null);
    this.raw.note(existing ? `attaching to ${serverId} (${agent})` : `connecting to ${agent} as ${serverId}`);
    this.setState("connecting", `connecting to ${agent} as ${serverId}…`);
    const client = new AcpHttpClient({
      baseUrl,
      serverId,
      agent: existing ? undefined : agent,
      token: token() || undefined,
      fetch: this.raw.tapFetch(),
      // Agent failures on a request come back as a JSON-RPC error (HTTP 200) carrying the problem,
      // rather than a 502 the browser would also report as a failed resource load.
      headers: { Prefer: "jsonrpc-errors" },
      onGap: (gap) => this.transcript.info(`events ${gap.from}–${gap.to} were lost (gap)`, "warn"),
      onError: (error) => this.transcript.error("connection error", error.message),
      client: {
        sessionUpdate: async (n) => this.transcript.update(n as unknown as Json),
        requestPermission: (req) => this.permission.ask(req),
      },
    });
    this.client = client;
    void client.closed.then(() => this.closed(client));
    this.updateControls();
    try {
      const init = await client.initialize({ clientInfo: { name: "sandbox-agent-inspector", version: "1" } });
      if (this.client !== client) return;
      this.showInit(init as unknown as Json);
      const name = (init.agentInfo as Json | undefined)?.name ?? agent;
      this.setState("connected", `connected to ${String(name)} (${serverId})`);
    } catch (error) {
      if (this.client !== client) return;
      this.fail("initialize failed", error);
      await this.disconnect("error");
    } finally {
      this.updateControls();
      this.onChange();
    }
  }

  async disconnect(state: ConnectionState = "disconnected"): Promise<void> {
    const client = this.client;
    if (!client) return;
    this.client = null;
    this.sessionId = null;
    this.permission.dismiss();
    // An instance this page started is stopped (DELETE); one it attached to keeps running for
    // whoever started it.
    if (this.owned) await client.close();
    else await client.transport.detach();
    const what = this.owned ? "disconnected from" : "detached from (still running)";
    if (state === "disconnected") this.setState("disconnected", `${what} ${this.serverId}`);
    this.raw.note(`${what} ${this.serverId}`);
    this.updateControls();
    this.onChange();
  }

  private closed(client: AcpHttpClient) {
    if (this.client !== client) return; // closed by us
    this.client = null;
    this.sessionId = null;
    this.permission.dismiss();
    const end = client.transport.endReason;
    const why = end ? ` — ${end.detail ?? end.title}` : "";
    this.setState("closed", `connection to ${this.serverId} ended${why}`);
    this.transcript.info(`the connection ended${why}`, "warn");
    this.updateControls();
    this.onChange();
  }

  private async newSession() {
    const client = this.client;
    if (!client) return;
    const cwd = this.cwd.value.trim() || "/";
    this.newBtn.disabled = true;
    try {
      const res = await client.newSession({ cwd, mcpServers: [] });
      if (this.client !== client) return;
      this.sessionId = res.sessionId;
      byId("session-id").textContent = `session ${res.sessionId} in ${cwd}`;
      this.transcript.info(`session ${res.sessionId} created in ${cwd}`, "meta");
      this.prompt.focus();
    } catch (error) {
      this.fail("session/new failed", error);
    } finally {
      this.updateControls();
    }
  }

  private async sendPrompt() {
    const client = this.client;
    const sessionId = this.sessionId;
    const text = this.prompt.value;
    if (!client || !sessionId || !text.trim()) return;
    this.prompt.value = "";
    this.transcript.user(text);
    this.running++;
    this.updateControls();
    try {
      const res = await client.prompt({ sessionId, prompt: [{ type: "text", text }] });
      await this.drain(client);
      this.transcript.turnEnd(String(res.stopReason));
    } catch (error) {
      this.fail("the prompt failed", error);
      this.onChange();
    } finally {
      this.running--;
      this.updateControls();
    }
  }

  /**
   * Waits (at most 5 s) until the event stream has delivered everything the agent wrote before
   * its answer. The daemon queues those events before it answers the POST, but the POST and the
   * stream are two connections: over a slow link the answer can arrive first, and the turn's end
   * would be drawn above its last chunks. The instance's `lastEventId` says how far to read.
   */
  private async drain(client: AcpHttpClient) {
    try {
      const me = (await api().listInstances()).find((s) => s.serverId === this.serverId);
      if (me && me.lastEventId > 0) await client.transport.waitForEventId(me.lastEventId, 5000);
      // The connection dispatches what it read on a later tick.
      await new Promise((r) => setTimeout(r, 0));
    } catch {
      // Best effort: the answer is shown either way.
    }
  }

  private async cancel() {
    const client = this.client;
    if (!client || !this.sessionId) return;
    try {
      await client.cancel({ sessionId: this.sessionId });
      this.transcript.info("cancel sent", "meta");
    } catch (error) {
      this.fail("session/cancel failed", error);
    }
  }

  /** Shows an error in the transcript, with the agent's exit and stderr when the daemon gave them. */
  private fail(what: string, error: unknown) {
    if (error instanceof AcpHttpError) {
      if (error.exitCode != null || error.signal != null) this.onExit(this.serverId, error.problem);
      const exit =
        error.exitCode != null
          ? `the agent exited with code ${error.exitCode}`
          : error.signal != null
            ? `the agent was killed by signal ${String(error.signal)}`
            : null;
      const parts = [exit, error.exitReason ? `reason: ${error.exitReason}` : null, error.detail];
      // The daemon's detail often says the same as the exit fields; say it once.
      const detail = parts.filter((p, i) => p && !parts.slice(i + 1).some((q) => q && q.includes(p))).join("; ");
      this.transcript.error(`${what}: ${error.title} (HTTP ${error.status})`, detail, error.stderrTail);
      void this.credentialsHint(`${error.title} ${error.detail ?? ""} ${error.stderrTail ?? ""}`);
      if (error.status === 401) this.setState("error", "the token was refused (401)");
      return;
    }
    const e = error as { message?: unknown; code?: unknown; data?: unknown };
    const msg = typeof e?.message === "string" ? e.message : String(error);
    const code = typeof e?.code === "number" ? ` (JSON-RPC ${e.code})` : "";
    this.transcript.error(`${what}${code}`, msg, e?.data !== undefined ? pretty(e.data) : undefined);
    void this.credentialsHint(`${msg} ${e?.data !== undefined ? JSON.stringify(e.data) : ""}`);
  }

  private showInit(init: Json | null) {
    const details = byId("init-details");
    clear(details);
    const summary = byId("init-info").querySelector("summary")!;
    if (!init) {
      summary.textContent = "Agent: not initialized";
      return;
    }
    const info = (init.agentInfo ?? {}) as Json;
    summary.textContent = `Agent: ${String(info.title ?? info.name ?? "?")} ${String(info.version ?? "")} — protocol ${String(init.protocolVersion)}`;
    const auth = Array.isArray(init.authMethods) ? (init.authMethods as Json[]) : [];
    const row = (k: string, v: Node | string) => details.append(h("dt", {}, k), h("dd", {}, v));
    row("protocol version", String(init.protocolVersion));
    row("auth methods", auth.length ? auth.map((a) => `${String(a.name ?? a.id)} (${String(a.id)})`).join(", ") : "none");
    row("capabilities", h("pre", {}, pretty(init.agentCapabilities ?? {})));
  }

  private setState(state: ConnectionState, text: string) {
    this.shown = { state, text };
    this.status.dataset.state = state;
    this.status.title = text;
    this.status.textContent = text;
    delete this.status.dataset.auth;
  }

  /** The agent of the current connection (for the credentials hint). */
  private agent = "";

  /**
   * After a failure that looks like missing credentials (the agent said so, or the call failed
   * while the daemon finds none), adds what the daemon knows the agent needs.
   */
  private async credentialsHint(message: string) {
    const agent = this.agent;
    if (!agent) return;
    try {
      const info = (await api().listAgents()).find((a) => a.id === agent);
      if (!info || info.credentialsAvailable !== false) return;
      if (!/auth|credential|api[ _-]?key|log ?in|unauthori[sz]ed|forbidden/i.test(message)) return;
      const hint = credentialsHint(info);
      if (hint) this.transcript.info(hint, "warn", "credentials-hint");
    } catch {
      // Only a hint: the error itself is shown already.
    }
  }

  /** The connection state last set, shown again once a token problem is over. */
  private shown: { state: ConnectionState; text: string } = { state: "disconnected", text: "not connected" };

  /** The status says what is wrong with the token (`token required` / `token refused`). */
  showAuthProblem(text: string) {
    this.status.dataset.state = "error";
    this.status.dataset.auth = text;
    this.status.title = text;
    this.status.textContent = text;
  }

  /** A request with the token succeeded: back to the connection's own state. */
  clearAuthProblem() {
    if (this.status.dataset.auth === undefined) return;
    this.setState(this.shown.state, this.shown.text);
  }

  private updateControls() {
    const live = this.client !== null;
    this.connectBtn.textContent = live ? "Reconnect" : "Connect";
    this.disconnectBtn.disabled = !live;
    this.newBtn.disabled = !live;
    const ready = live && this.sessionId !== null;
    this.prompt.disabled = !ready;
    this.send.disabled = !ready;
    this.cancelBtn.disabled = !ready || this.running === 0;
  }
}
