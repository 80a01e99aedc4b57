/**
 * `/v1/desktop/*` as methods ({@link DesktopApi}, reached as `host.desktop`) and the live view
 * WebSocket `/v1/desktop/stream/frames` ({@link DesktopLiveView}): JPEG frames in, pointer and
 * keyboard input out.
 *
 * Invariants: browser-safe (fetch and the WHATWG `WebSocket`); every non-2xx answer is an
 * `HttpError` carrying the problem body (409 before `start`, 400 naming the field, 503 naming a
 * missing package); images and recordings come back as bytes.
 */
import {
  openSocket,
  type ProcessContext,
  type ProcessTerminalConnectOptions,
} from "./processes.js";
import type {
  DesktopActionResponse,
  DesktopClipboard,
  DesktopClipboardQuery,
  DesktopClipboardWriteRequest,
  DesktopDisplayInfo,
  DesktopKeyboardKeyRequest,
  DesktopKeyboardPressRequest,
  DesktopKeyboardTypeRequest,
  DesktopLaunchRequest,
  DesktopLaunchResponse,
  DesktopLiveViewQuery,
  DesktopMouseButtonRequest,
  DesktopMouseClickRequest,
  DesktopMouseDragRequest,
  DesktopMouseMoveRequest,
  DesktopMousePosition,
  DesktopMouseScrollRequest,
  DesktopOpenRequest,
  DesktopOpenResponse,
  DesktopRecordingInfo,
  DesktopRecordingStartRequest,
  DesktopScreenshotQuery,
  DesktopScreenshotRegionQuery,
  DesktopStartRequest,
  DesktopStatus,
  DesktopStreamStatus,
  DesktopWindowInfo,
  DesktopWindowMoveRequest,
  DesktopWindowResizeRequest,
} from "./types.js";

type Query = Record<string, string | number | boolean | undefined>;

/** What the desktop client needs of a `HostApi`: its request helpers and socket context. */
export interface DesktopTransport {
  json<T>(method: string, path: string, init?: { query?: Query; body?: unknown }): Promise<T>;
  send(method: string, path: string, init?: { query?: Query; body?: unknown }): Promise<Response>;
  context: ProcessContext;
}

const P = "/v1/desktop";

function win(id: number | string): string {
  return `${P}/windows/${encodeURIComponent(String(id))}`;
}

function rec(id: string): string {
  return `${P}/recordings/${encodeURIComponent(id)}`;
}

async function bytes(res: Response): Promise<Uint8Array> {
  return new Uint8Array(await res.arrayBuffer());
}

/** The desktop routes, one method each. */
export class DesktopApi {
  constructor(private readonly t: DesktopTransport) {}

  status(): Promise<DesktopStatus> {
    return this.t.json("GET", `${P}/status`);
  }
  /** Starts Xvfb and the window manager; 200 with the status once the display answers. */
  start(request: DesktopStartRequest = {}): Promise<DesktopStatus> {
    return this.t.json("POST", `${P}/start`, { body: request });
  }
  stop(): Promise<DesktopStatus> {
    return this.t.json("POST", `${P}/stop`);
  }
  displayInfo(): Promise<DesktopDisplayInfo> {
    return this.t.json("GET", `${P}/display/info`);
  }
  /** The whole screen as image bytes (PNG unless `format` says `jpeg` or `webp`). */
  async screenshot(query: DesktopScreenshotQuery = {}): Promise<Uint8Array> {
    return bytes(await this.t.send("GET", `${P}/screenshot`, { query: query as Query }));
  }
  /** A region wholly on the screen (else 400). */
  async screenshotRegion(query: DesktopScreenshotRegionQuery): Promise<Uint8Array> {
    return bytes(await this.t.send("GET", `${P}/screenshot/region`, { query: query as Query }));
  }
  mousePosition(): Promise<DesktopMousePosition> {
    return this.t.json("GET", `${P}/mouse/position`);
  }
  mouseMove(request: DesktopMouseMoveRequest): Promise<DesktopMousePosition> {
    return this.t.json("POST", `${P}/mouse/move`, { body: request });
  }
  mouseClick(request: DesktopMouseClickRequest): Promise<DesktopMousePosition> {
    return this.t.json("POST", `${P}/mouse/click`, { body: request });
  }
  mouseDown(request: DesktopMouseButtonRequest = {}): Promise<DesktopMousePosition> {
    return this.t.json("POST", `${P}/mouse/down`, { body: request });
  }
  mouseUp(request: DesktopMouseButtonRequest = {}): Promise<DesktopMousePosition> {
    return this.t.json("POST", `${P}/mouse/up`, { body: request });
  }
  mouseDrag(request: DesktopMouseDragRequest): Promise<DesktopMousePosition> {
    return this.t.json("POST", `${P}/mouse/drag`, { body: request });
  }
  mouseScroll(request: DesktopMouseScrollRequest): Promise<DesktopMousePosition> {
    return this.t.json("POST", `${P}/mouse/scroll`, { body: request });
  }
  /** Types any Unicode text (at most 64 KiB). */
  typeText(request: DesktopKeyboardTypeRequest): Promise<DesktopActionResponse> {
    return this.t.json("POST", `${P}/keyboard/type`, { body: request });
  }
  /** Presses a key (an X keysym name, e.g. `Return`) with optional modifiers; 400 for an unknown name. */
  pressKey(request: DesktopKeyboardPressRequest): Promise<DesktopActionResponse> {
    return this.t.json("POST", `${P}/keyboard/press`, { body: request });
  }
  keyDown(request: DesktopKeyboardKeyRequest): Promise<DesktopActionResponse> {
    return this.t.json("POST", `${P}/keyboard/down`, { body: request });
  }
  keyUp(request: DesktopKeyboardKeyRequest): Promise<DesktopActionResponse> {
    return this.t.json("POST", `${P}/keyboard/up`, { body: request });
  }
  async listWindows(): Promise<DesktopWindowInfo[]> {
    return (await this.t.json<{ windows: DesktopWindowInfo[] }>("GET", `${P}/windows`)).windows;
  }
  /** The focused window (404 when none). */
  focusedWindow(): Promise<DesktopWindowInfo> {
    return this.t.json("GET", `${P}/windows/focused`);
  }
  focusWindow(id: number | string): Promise<DesktopWindowInfo> {
    return this.t.json("POST", `${win(id)}/focus`);
  }
  moveWindow(id: number | string, request: DesktopWindowMoveRequest): Promise<DesktopWindowInfo> {
    return this.t.json("POST", `${win(id)}/move`, { body: request });
  }
  resizeWindow(id: number | string, request: DesktopWindowResizeRequest): Promise<DesktopWindowInfo> {
    return this.t.json("POST", `${win(id)}/resize`, { body: request });
  }
  getClipboard(query: DesktopClipboardQuery = {}): Promise<DesktopClipboard> {
    return this.t.json("GET", `${P}/clipboard`, { query: query as Query });
  }
  setClipboard(request: DesktopClipboardWriteRequest): Promise<DesktopActionResponse> {
    return this.t.json("POST", `${P}/clipboard`, { body: request });
  }
  /** Starts a program on the desktop (a name in PATH or an absolute path). */
  launch(request: DesktopLaunchRequest): Promise<DesktopLaunchResponse> {
    return this.t.json("POST", `${P}/launch`, { body: request });
  }
  open(request: DesktopOpenRequest): Promise<DesktopOpenResponse> {
    return this.t.json("POST", `${P}/open`, { body: request });
  }
  startRecording(request: DesktopRecordingStartRequest = {}): Promise<DesktopRecordingInfo> {
    return this.t.json("POST", `${P}/recording/start`, { body: request });
  }
  stopRecording(): Promise<DesktopRecordingInfo> {
    return this.t.json("POST", `${P}/recording/stop`);
  }
  async listRecordings(): Promise<DesktopRecordingInfo[]> {
    return (await this.t.json<{ recordings: DesktopRecordingInfo[] }>("GET", `${P}/recordings`)).recordings;
  }
  getRecording(id: string): Promise<DesktopRecordingInfo> {
    return this.t.json("GET", rec(id));
  }
  /** The MP4's bytes (409 while it is still recording). */
  async downloadRecording(id: string): Promise<Uint8Array> {
    return bytes(await this.t.send("GET", `${rec(id)}/download`));
  }
  async deleteRecording(id: string): Promise<void> {
    await this.t.send("DELETE", rec(id));
  }
  /** The reference's WebRTC stream status: always inactive here (use {@link connectLiveView}). */
  streamStatus(): Promise<DesktopStreamStatus> {
    return this.t.json("GET", `${P}/stream/status`);
  }
  /** The live view's URL (`ws:`/`wss:`), with the token as `access_token` when given. */
  liveViewUrl(query: DesktopLiveViewQuery = {}, accessToken?: string): string {
    const url = this.t.context.url(`${P}/stream/frames`, { ...(query as Query), access_token: accessToken });
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    return url.toString();
  }
  /** Opens the live view: JPEG frames of the screen, input sent back over the same socket. */
  connectLiveView(query: DesktopLiveViewQuery = {}, options: ProcessTerminalConnectOptions = {}): DesktopLiveView {
    const socket = openSocket(this.t.context, (token) => this.liveViewUrl(query, token), options);
    return new DesktopLiveView(socket);
  }
}

/** `{type:"ready"}`: the screen size the frames show. */
export interface DesktopLiveViewReady {
  type: "ready";
  width: number;
  height: number;
}

/** What the client sends on the live view (the same coordinates and rules as the HTTP routes). */
export type DesktopLiveViewInput =
  | { type: "move"; x: number; y: number }
  | { type: "click"; x: number; y: number; button?: "left" | "middle" | "right" }
  | { type: "down" | "up"; x: number; y: number; button?: "left" | "middle" | "right" }
  | { type: "scroll"; x: number; y: number; deltaX?: number; deltaY?: number }
  | { type: "type"; text: string }
  | { type: "key"; key: string };

/**
 * The live view socket: `onFrame` gets each JPEG (a whole image per binary message), `ready` the
 * screen size, `onEnd` the daemon's reason when the desktop stops; input methods send JSON.
 */
export class DesktopLiveView {
  readonly socket: WebSocket;
  /** Resolves with the `ready` message; rejects if the socket closes first. */
  readonly ready: Promise<DesktopLiveViewReady>;
  /** Resolves when the socket has closed. */
  readonly closed: Promise<void>;
  /** Frames received so far. */
  frames = 0;
  private readonly frameListeners = new Set<(jpeg: Uint8Array) => void>();
  private readonly endListeners = new Set<(message: string) => void>();
  private readonly errorListeners = new Set<(message: string) => void>();

  constructor(socket: WebSocket) {
    this.socket = socket;
    socket.binaryType = "arraybuffer";
    let resolveReady!: (r: DesktopLiveViewReady) => void;
    let rejectReady!: (e: Error) => void;
    this.ready = new Promise((res, rej) => {
      resolveReady = res;
      rejectReady = rej;
    });
    this.ready.catch(() => {});
    this.closed = new Promise((res) => {
      socket.addEventListener("close", () => {
        rejectReady(new Error("the live view closed before it was ready"));
        res();
      });
    });
    socket.addEventListener("message", (ev: MessageEvent) => {
      if (typeof ev.data === "string") {
        let msg: { type?: string; message?: string; width?: number; height?: number };
        try {
          msg = JSON.parse(ev.data);
        } catch {
          return;
        }
        if (msg.type === "ready") resolveReady(msg as DesktopLiveViewReady);
        else if (msg.type === "end") for (const l of this.endListeners) l(msg.message ?? "");
        else if (msg.type === "error") for (const l of this.errorListeners) l(msg.message ?? "");
        return;
      }
      const data = ev.data instanceof ArrayBuffer ? new Uint8Array(ev.data) : new Uint8Array(ev.data as ArrayBufferLike);
      this.frames += 1;
      for (const l of this.frameListeners) l(data);
    });
  }

  /** Each frame, a whole JPEG. Returns the unsubscribe function. */
  onFrame(listener: (jpeg: Uint8Array) => void): () => void {
    this.frameListeners.add(listener);
    return () => this.frameListeners.delete(listener);
  }
  /** The desktop stopped or failed (the socket closes next). */
  onEnd(listener: (message: string) => void): () => void {
    this.endListeners.add(listener);
    return () => this.endListeners.delete(listener);
  }
  /** An input message was refused (the session goes on). */
  onError(listener: (message: string) => void): () => void {
    this.errorListeners.add(listener);
    return () => this.errorListeners.delete(listener);
  }
  send(input: DesktopLiveViewInput): void {
    this.socket.send(JSON.stringify(input));
  }
  move(x: number, y: number): void {
    this.send({ type: "move", x, y });
  }
  click(x: number, y: number, button?: "left" | "middle" | "right"): void {
    this.send({ type: "click", x, y, button });
  }
  scroll(x: number, y: number, deltaY: number, deltaX = 0): void {
    this.send({ type: "scroll", x, y, deltaX, deltaY });
  }
  typeText(text: string): void {
    this.send({ type: "type", text });
  }
  key(key: string): void {
    this.send({ type: "key", key });
  }
  close(): void {
    this.socket.close();
  }
}
