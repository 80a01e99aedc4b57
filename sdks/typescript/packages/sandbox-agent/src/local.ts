/**
 * Local mode (Node only; import `sandbox-agent/local`): `SandboxAgent.start()` runs a daemon from a
 * binary on this machine, waits until it answers, and returns a connected client that stops the
 * daemon on `dispose()`. Given `{ sandbox: provider }` instead, `start()` is the root package's
 * `SandboxAgent.start()` (a sandbox from a provider).
 *
 * Invariants: the start is bounded (`startTimeoutMs`); a daemon that fails to start is killed and
 * its stderr tail is in the error; `dispose()` always ends the child (TERM, then KILL after
 * `stopTimeoutMs`).
 */
import { spawn, type ChildProcess } from "node:child_process";
import type { SandboxAgentClientOptions } from "./client.js";
import { SandboxAgent as SandboxAgentBase, type SandboxStartOptions } from "./sandbox.js";

export interface StartOptions extends Omit<SandboxAgentClientOptions, "baseUrl" | "token" | "agent"> {
  /** The `sandbox-agent` binary; default: `sandbox-agent` on PATH. */
  binaryPath?: string;
  /** Port on 127.0.0.1; default: a free one chosen by the daemon. */
  port?: number;
  /** Token the daemon requires (default: none, loopback only). */
  token?: string;
  /** Agent for the returned client (default `mock`). */
  agent?: string;
  /** More daemon flags, e.g. `["--work-dir", "/src"]`. */
  args?: string[];
  /** Environment of the daemon (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** How long to wait for the daemon to answer (default 30 s). */
  startTimeoutMs?: number;
  /** How long `dispose()` waits after SIGTERM before SIGKILL (default 15 s). */
  stopTimeoutMs?: number;
}

export class SandboxAgent extends SandboxAgentBase {
  private child: ChildProcess | null = null;
  private stopTimeoutMs = 15_000;
  private exited: Promise<void> = Promise.resolve();

  /** Starts a daemon and returns a client connected to it (or, with `sandbox`, uses the provider). */
  static override start(options: SandboxStartOptions): Promise<SandboxAgentBase>;
  static override start(options?: StartOptions): Promise<SandboxAgent>;
  static override async start(options: StartOptions | SandboxStartOptions = {}): Promise<SandboxAgentBase> {
    if ("sandbox" in options && options.sandbox) return SandboxAgentBase.start(options);
    return SandboxAgent.startLocal(options as StartOptions);
  }

  private static async startLocal(options: StartOptions): Promise<SandboxAgent> {
    const bin = options.binaryPath ?? "sandbox-agent";
    const args = ["server", "--host", "127.0.0.1", "--port", String(options.port ?? 0), "--log-format", "text"];
    if (options.token) args.push("--token", options.token);
    args.push(...(options.args ?? []));
    const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: options.env ?? process.env });
    // A binary that cannot be spawned emits "error" and never "exit".
    const exited = new Promise<void>((r) => {
      child.once("exit", () => r());
      child.once("error", () => r());
    });
    let stderr = "";
    try {
      const baseUrl = await waitForListening(child, options.startTimeoutMs ?? 30_000, (s) => (stderr = s));
      await waitForHealth(baseUrl, options.token, options.startTimeoutMs ?? 30_000);
      const agent = new SandboxAgent({ ...options, baseUrl, token: options.token, agent: options.agent ?? "mock" });
      agent.child = child;
      agent.exited = exited;
      agent.stopTimeoutMs = options.stopTimeoutMs ?? 15_000;
      child.stderr?.resume(); // keep draining, so the daemon never blocks on a full pipe
      try {
        await agent.ready;
      } catch (error) {
        await agent.dispose();
        throw error;
      }
      return agent;
    } catch (error) {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
      const tail = stderr.slice(-4096);
      throw new Error(`sandbox-agent did not start: ${(error as Error).message}${tail ? `\n${tail}` : ""}`);
    }
  }

  /** The daemon's process id. */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Disconnects and stops the daemon (SIGTERM, then SIGKILL after `stopTimeoutMs`). */
  override async dispose(): Promise<void> {
    await this.disconnect().catch(() => {});
    const child = this.child;
    if (!child) return;
    this.child = null;
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
    const killer = setTimeout(() => child.kill("SIGKILL"), this.stopTimeoutMs);
    await this.exited;
    clearTimeout(killer);
  }

  override async [Symbol.asyncDispose](): Promise<void> {
    await this.dispose();
  }
}

/** Reads the daemon's stderr until it says where it listens. */
function waitForListening(child: ChildProcess, timeoutMs: number, seen: (s: string) => void): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(() => done(new Error(`no "listening on" line within ${timeoutMs} ms`)), timeoutMs);
    const onData = (chunk: Buffer) => {
      if (buf.length < 1 << 20) buf += chunk.toString("utf8");
      seen(buf);
      const m = /listening on (http:\/\/[^\s"]+)/.exec(buf);
      if (m) done(null, m[1]);
    };
    const onExit = (code: number | null, signal: string | null) =>
      done(new Error(`daemon exited (code ${code}, signal ${signal})`));
    const onError = (e: Error) => done(e);
    child.stderr?.on("data", onData);
    child.once("exit", onExit);
    child.once("error", onError);
    function done(err: Error | null, url?: string) {
      clearTimeout(timer);
      child.stderr?.off("data", onData);
      child.off("exit", onExit);
      child.off("error", onError);
      if (err) reject(err);
      else resolve(url!);
    }
  });
}

async function waitForHealth(baseUrl: string, token: string | undefined, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const res = await fetch(`${baseUrl}/v1/health`, {
        headers: token ? { Authorization: `Bearer ${token}` } : {},
        signal: AbortSignal.timeout(2000),
      });
      await res.body?.cancel();
      if (res.ok) return;
      last = new Error(`health answered ${res.status}`);
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`daemon did not answer within ${timeoutMs} ms: ${String(last)}`);
}
