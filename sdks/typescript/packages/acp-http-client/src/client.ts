/**
 * `AcpHttpClient`: the official ACP client connection (`ClientSideConnection` of
 * `@agentclientprotocol/sdk` 1.x) running over {@link AcpHttpTransport}.
 *
 * We write no JSON-RPC framing or lifecycle here: ids, pending calls, dispatch of the agent's
 * requests and notifications all belong to the official connection. This layer only maps a failed
 * HTTP answer (carried as a JSON-RPC error whose `data` is the problem body — by our transport, or
 * by a server running with `jsonrpc-errors`) back into a typed {@link AcpHttpError}.
 */
import {
  ClientSideConnection,
  PROTOCOL_VERSION,
  RequestError,
  type Agent,
  type Client,
  type InitializeRequest,
  type InitializeResponse,
  type NewSessionRequest,
  type NewSessionResponse,
  type LoadSessionRequest,
  type LoadSessionResponse,
  type PromptRequest,
  type PromptResponse,
  type CancelNotification,
  type SetSessionModeRequest,
  type SetSessionModeResponse,
  type SetSessionConfigOptionRequest,
  type SetSessionConfigOptionResponse,
  type ListSessionsRequest,
  type ListSessionsResponse,
  type ForkSessionRequest,
  type ForkSessionResponse,
  type ResumeSessionRequest,
  type ResumeSessionResponse,
  type RequestPermissionResponse,
} from "@agentclientprotocol/sdk";
import { toAcpError } from "./errors.js";
import { AcpHttpTransport, type AcpStreamTransport } from "./transport.js";
import { AcpWebSocketTransport, type AcpWebSocketTransportOptions } from "./ws-transport.js";

export interface AcpHttpClientOptions extends AcpWebSocketTransportOptions {
  /**
   * `sse` (default): POST per envelope plus one event stream. `websocket`: one socket for both
   * directions (the daemon's WebSocket face of the same path; needs a daemon that has it).
   */
  transport?: "sse" | "websocket";
  /**
   * Handlers for what the agent sends (`sessionUpdate`, `requestPermission`, …). Missing
   * `requestPermission` answers `cancelled`, so an agent never waits forever.
   */
  client?: Partial<Client>;
}

/** A JSON-RPC error answered by the agent (not an HTTP problem). */
export { RequestError };

export class AcpHttpClient {
  readonly transport: AcpStreamTransport;
  readonly connection: ClientSideConnection;

  constructor(options: AcpHttpClientOptions) {
    this.transport =
      options.transport === "websocket" ? new AcpWebSocketTransport(options) : new AcpHttpTransport(options);
    const handlers = withDefaults(options.client ?? {});
    this.connection = new ClientSideConnection(() => handlers, {
      readable: this.transport.readable,
      writable: this.transport.writable,
    });
  }

  initialize(request: Partial<InitializeRequest> = {}): Promise<InitializeResponse> {
    return call(() =>
      this.connection.initialize({
        protocolVersion: PROTOCOL_VERSION,
        clientCapabilities: {},
        clientInfo: { name: "acp-http-client", version: "0.5.0" },
        ...request,
      } as InitializeRequest),
    );
  }
  newSession(request: NewSessionRequest): Promise<NewSessionResponse> {
    return call(() => this.connection.newSession(request));
  }
  loadSession(request: LoadSessionRequest): Promise<LoadSessionResponse> {
    return call(() => this.connection.loadSession(request));
  }
  prompt(request: PromptRequest): Promise<PromptResponse> {
    return call(() => this.connection.prompt(request));
  }
  cancel(notification: CancelNotification): Promise<void> {
    return call(() => this.connection.cancel(notification));
  }
  setSessionMode(request: SetSessionModeRequest): Promise<SetSessionModeResponse> {
    return call(() => this.connection.setSessionMode(request));
  }
  setSessionConfigOption(request: SetSessionConfigOptionRequest): Promise<SetSessionConfigOptionResponse> {
    return call(() => this.connection.setSessionConfigOption(request));
  }
  listSessions(request: ListSessionsRequest = {}): Promise<ListSessionsResponse> {
    return call(() => this.connection.listSessions(request));
  }
  forkSession(request: ForkSessionRequest): Promise<ForkSessionResponse> {
    return call(() => this.connection.unstable_forkSession(request));
  }
  resumeSession(request: ResumeSessionRequest): Promise<ResumeSessionResponse> {
    return call(() => this.connection.resumeSession(request));
  }
  /** `session/set_model` (not in the stable schema yet; sent as a plain request). */
  setSessionModel(request: { sessionId: string; modelId: string }): Promise<Record<string, unknown>> {
    return this.request("session/set_model", request);
  }
  /** Any other request, by method name (extension methods start with `_`). */
  request(method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    return call(() => (this.connection as unknown as Requester).request(method, params));
  }
  /** Any other notification, by method name. */
  notify(method: string, params: Record<string, unknown>): Promise<void> {
    return call(() => (this.connection as unknown as Requester).notify(method, params));
  }

  /** Closes the connection: the stream stops, calls in flight fail, the serverId is DELETEd. */
  async close(): Promise<void> {
    await this.transport.close();
  }

  /** Resolves when the connection is closed (by `close()` or because the agent ended). */
  get closed(): Promise<void> {
    return this.connection.closed;
  }

  get signal(): AbortSignal {
    return this.connection.signal;
  }
}

interface Requester {
  request(method: string, params: unknown): Promise<Record<string, unknown>>;
  notify(method: string, params: unknown): Promise<void>;
}

function withDefaults(client: Partial<Client>): Client {
  return {
    ...client,
    sessionUpdate: async (n) => {
      await client.sessionUpdate?.(n);
    },
    requestPermission: async (req): Promise<RequestPermissionResponse> => {
      if (client.requestPermission) return client.requestPermission(req);
      return { outcome: { outcome: "cancelled" } };
    },
  };
}

async function call<T>(f: () => Promise<T>): Promise<T> {
  try {
    return await f();
  } catch (error) {
    throw toAcpError(error);
  }
}

export type { Agent };
