/**
 * `acp-http-client`: ACP (Agent Client Protocol) over HTTP — POST per envelope, SSE for the
 * agent's other messages — on top of the official `@agentclientprotocol/sdk` connection.
 * Protocol-pure: nothing here knows about a particular server product.
 */
export { AcpHttpClient, RequestError, type AcpHttpClientOptions } from "./client.js";
export {
  AcpHttpTransport,
  type AcpHttpTransportOptions,
  type AcpStreamTransport,
  type EnvelopeDirection,
  type GapEvent,
} from "./transport.js";
export {
  AcpWebSocketTransport,
  type AcpWebSocketTransportOptions,
  type WebSocketLike,
} from "./ws-transport.js";
export {
  AcpHttpError,
  AcpTransportClosedError,
  NETWORK_ERROR_TYPE,
  networkProblem,
  isProblemDetails,
  toAcpError,
  problemFromResponse,
  type ProblemDetails,
} from "./errors.js";
export { parseSse, SseEventTooLargeError, type SseEvent } from "./sse.js";
export type * as acp from "@agentclientprotocol/sdk";
