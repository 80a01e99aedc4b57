/**
 * `/v1/browser/*` as methods ({@link BrowserApi}, reached as `host.browser`): the daemon's one
 * supervised Chromium (start, stop, status), its tabs, navigation, screenshots, the page as text
 * or markdown, the accessibility snapshot, and the URLs of the token-checked DevTools proxy that
 * Playwright's `connectOverCDP` or Puppeteer's `connect` take.
 *
 * Invariants: browser-safe (fetch only); every non-2xx answer is an `HttpError` carrying the
 * problem body (409 before `start`, 400 naming the field, 404 for an unknown tab, 503 naming a
 * missing package); screenshots come back as bytes.
 */
import type { ProcessContext } from "./processes.js";
import type {
  BrowserAccessibility,
  BrowserAccessibilityQuery,
  BrowserContent,
  BrowserContentQuery,
  BrowserNavigateRequest,
  BrowserOpenTabRequest,
  BrowserScreenshotQuery,
  BrowserStartRequest,
  BrowserStatus,
  BrowserTab,
} from "./types.js";

type Query = Record<string, string | number | boolean | undefined>;

/** What the browser client needs of a `HostApi`: its request helpers and URL context. */
export interface BrowserTransport {
  json<T>(method: string, path: string, init?: { query?: Query; body?: unknown }): Promise<T>;
  send(method: string, path: string, init?: { query?: Query; body?: unknown }): Promise<Response>;
  context: ProcessContext;
}

const P = "/v1/browser";

function tab(id: string): string {
  return `${P}/tabs/${encodeURIComponent(id)}`;
}

/** The browser routes, one method each. */
export class BrowserApi {
  constructor(private readonly t: BrowserTransport) {}

  /** `state`: inactive, starting, active, stopping or failed; `missingPackage` when Chromium is not installed. */
  status(): Promise<BrowserStatus> {
    return this.t.json("GET", `${P}/status`);
  }
  /** Starts Chromium (headless unless `headless: false`, which needs a running desktop). */
  start(request: BrowserStartRequest = {}): Promise<BrowserStatus> {
    return this.t.json("POST", `${P}/start`, { body: request });
  }
  /** Ends Chromium and everything it started; removes its profile. */
  stop(): Promise<BrowserStatus> {
    return this.t.json("POST", `${P}/stop`);
  }
  /** The open tabs, most recently active first. */
  async listTabs(): Promise<BrowserTab[]> {
    return (await this.t.json<{ tabs: BrowserTab[] }>("GET", `${P}/tabs`)).tabs;
  }
  /** Opens a tab (http, https, about or data URL; default `about:blank`); at most 32 (409 beyond). */
  openTab(request: BrowserOpenTabRequest = {}): Promise<BrowserTab> {
    return this.t.json("POST", `${P}/tabs`, { body: request });
  }
  async closeTab(id: string): Promise<void> {
    await this.t.send("DELETE", tab(id));
  }
  async activateTab(id: string): Promise<void> {
    await this.t.send("POST", `${tab(id)}/activate`);
  }
  /** Navigates (the active tab unless `tabId`) and waits for `waitUntil` (default `load`). */
  navigate(request: BrowserNavigateRequest): Promise<BrowserTab> {
    return this.t.json("POST", `${P}/navigate`, { body: request });
  }
  /** The viewport (or the whole page with `fullPage: true`) as PNG or JPEG bytes. */
  async screenshot(query: BrowserScreenshotQuery = {}): Promise<Uint8Array> {
    const res = await this.t.send("GET", `${P}/screenshot`, { query: query as Query });
    return new Uint8Array(await res.arrayBuffer());
  }
  /** The page's text (`innerText`) or markdown, at most 2,000,000 characters (`truncated`). */
  content(query: BrowserContentQuery = {}): Promise<BrowserContent> {
    return this.t.json("GET", `${P}/content`, { query: query as Query });
  }
  /** The accessibility tree in preorder, each node with its `depth`. */
  accessibility(query: BrowserAccessibilityQuery = {}): Promise<BrowserAccessibility> {
    return this.t.json("GET", `${P}/accessibility`, { query: query as Query });
  }
  /**
   * The DevTools proxy's HTTP endpoint, for `chromium.connectOverCDP(url, { headers })` with the
   * daemon's `Authorization` header (Playwright reads `json/version` under it).
   */
  cdpEndpoint(): string {
    return this.t.context.url(`${P}/cdp`).toString();
  }
  /**
   * The DevTools proxy's WebSocket URL (`ws:`/`wss:`), with the token as `access_token` when
   * given (a WebSocket upgrade is the only request that takes the token in the query).
   */
  cdpUrl(accessToken?: string): string {
    const url = this.t.context.url(`${P}/cdp`, { access_token: accessToken });
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    return url.toString();
  }
  /** Chromium's discovery document, its `webSocketDebuggerUrl` pointing back at the proxy. */
  cdpVersion(): Promise<Record<string, string>> {
    return this.t.json("GET", `${P}/cdp/json/version`);
  }
}
