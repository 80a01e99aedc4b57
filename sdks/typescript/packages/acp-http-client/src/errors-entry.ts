/**
 * `acp-http-client/errors`: the error types and problem helpers alone, without the ACP SDK, for
 * code that only talks plain HTTP (it loads in a fraction of the memory and bundle size).
 */
export {
  AcpHttpError,
  AcpTransportClosedError,
  NETWORK_ERROR_TYPE,
  isProblemDetails,
  networkProblem,
  problemFromResponse,
  toAcpError,
  type ProblemDetails,
} from "./errors.js";
