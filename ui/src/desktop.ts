// The Desktop tab: start/stop the daemon's desktop, its live view (`/v1/desktop/stream/frames`
// through the SDK's `connectLiveView`) drawn on a canvas, clicks and keys on the canvas sent back
// over the same socket, a screenshot and recordings (start, stop, download). Frames are decoded
// with createImageBitmap (no blob: image URLs, which the page's CSP does not allow); a frame that
// arrives while one is being drawn replaces the waiting one, so a slow page never queues frames.

import type { DesktopLiveView } from "sandbox-agent";
import { api } from "./api";
import { byId, bytes, h } from "./dom";

/** Browser key names (`KeyboardEvent.key`) that are not text, as X keysym names. */
const KEYS: Record<string, string> = {
  Enter: "Return",
  Backspace: "BackSpace",
  Tab: "Tab",
  Escape: "Escape",
  Delete: "Delete",
  Home: "Home",
  End: "End",
  PageUp: "Prior",
  PageDown: "Next",
  ArrowLeft: "Left",
  ArrowRight: "Right",
  ArrowUp: "Up",
  ArrowDown: "Down",
  Insert: "Insert",
};

const BUTTONS = ["left", "middle", "right"] as const;

export class DesktopPanel {
  private readonly canvas = byId<HTMLCanvasElement>("desktop-view");
  private readonly state = byId("desktop-state");
  private readonly displayInput = byId<HTMLInputElement>("desktop-display");
  private readonly recordButton = byId<HTMLButtonElement>("desktop-record");
  private readonly recordings = byId("desktop-recordings");
  private view: DesktopLiveView | null = null;
  private pending: Uint8Array | null = null;
  private drawing = false;
  private recording = false;

  constructor(private readonly onError: (error: unknown) => void) {
    byId("desktop-start").addEventListener("click", () => void this.start());
    byId("desktop-stop").addEventListener("click", () => void this.stop());
    byId("desktop-screenshot").addEventListener("click", () => void this.screenshot());
    this.recordButton.addEventListener("click", () => void this.toggleRecording());
    this.canvas.addEventListener("mousedown", (e) => {
      e.preventDefault();
      this.canvas.focus();
      const [x, y] = this.point(e);
      this.view?.click(x, y, BUTTONS[e.button] ?? "left");
    });
    this.canvas.addEventListener("contextmenu", (e) => e.preventDefault());
    this.canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [x, y] = this.point(e);
      this.view?.scroll(x, y, Math.sign(e.deltaY), Math.sign(e.deltaX));
    });
    this.canvas.addEventListener("keydown", (e) => {
      if (!this.view) return;
      const named = KEYS[e.key];
      if (e.key.length === 1 && !e.ctrlKey && !e.metaKey && !e.altKey) this.view.typeText(e.key);
      else if (named) this.view.key(named);
      else return;
      e.preventDefault();
    });
  }

  /** Reads the status; connects the live view when the desktop runs (the tab was opened). */
  async show(): Promise<void> {
    try {
      const s = await api().desktop.status();
      this.setState(s.state, s.display ?? null);
      if (s.state === "active") this.connect();
      await this.listRecordings();
    } catch (error) {
      this.onError(error);
    }
  }

  /** The tab was left: the live view is closed (it costs a screen grab per frame). */
  hide(): void {
    this.view?.close();
    this.view = null;
  }

  private setState(state: string, display: string | null): void {
    this.state.textContent = display ? `${state} (${display})` : state;
    this.state.dataset.state = state;
  }

  private async start(): Promise<void> {
    try {
      const n = this.displayInput.value.trim();
      const s = await api().desktop.start(n ? { displayNum: Number(n) } : {});
      this.setState(s.state, s.display ?? null);
      this.connect();
    } catch (error) {
      this.onError(error);
    }
  }

  private async stop(): Promise<void> {
    try {
      this.hide();
      const s = await api().desktop.stop();
      this.setState(s.state, s.display ?? null);
      this.recording = false;
      this.recordButton.textContent = "Record";
      await this.listRecordings();
    } catch (error) {
      this.onError(error);
    }
  }

  private connect(): void {
    this.hide();
    const view = api().desktop.connectLiveView({ fps: 5, quality: 70 });
    this.view = view;
    this.canvas.dataset.frames = "0";
    view.ready.then(
      (r) => {
        this.canvas.width = r.width;
        this.canvas.height = r.height;
        this.canvas.dataset.ready = "true";
      },
      () => {},
    );
    view.onFrame((jpeg) => {
      this.pending = jpeg;
      void this.draw();
    });
    view.onEnd((message) => this.setState("ended", message));
    view.onError((message) => this.onError(new Error(`live view: ${message}`)));
  }

  private async draw(): Promise<void> {
    if (this.drawing) return;
    this.drawing = true;
    try {
      while (this.pending) {
        const jpeg = this.pending;
        this.pending = null;
        const bitmap = await createImageBitmap(new Blob([jpeg as BlobPart], { type: "image/jpeg" }));
        this.canvas.getContext("2d")?.drawImage(bitmap, 0, 0, this.canvas.width, this.canvas.height);
        bitmap.close();
        this.canvas.dataset.frames = String(Number(this.canvas.dataset.frames ?? "0") + 1);
      }
    } finally {
      this.drawing = false;
    }
  }

  /** Screen pixels from a mouse event on the (CSS-scaled) canvas: offsetX/Y are inside its border. */
  private point(e: MouseEvent): [number, number] {
    const x = Math.floor((e.offsetX * this.canvas.width) / Math.max(this.canvas.clientWidth, 1));
    const y = Math.floor((e.offsetY * this.canvas.height) / Math.max(this.canvas.clientHeight, 1));
    return [Math.min(Math.max(x, 0), this.canvas.width - 1), Math.min(Math.max(y, 0), this.canvas.height - 1)];
  }

  private async screenshot(): Promise<void> {
    try {
      save(await api().desktop.screenshot(), "image/png", "desktop.png");
    } catch (error) {
      this.onError(error);
    }
  }

  private async toggleRecording(): Promise<void> {
    try {
      if (this.recording) {
        await api().desktop.stopRecording();
        this.recording = false;
        this.recordButton.textContent = "Record";
      } else {
        await api().desktop.startRecording({});
        this.recording = true;
        this.recordButton.textContent = "Stop recording";
      }
      await this.listRecordings();
    } catch (error) {
      this.onError(error);
    }
  }

  private async listRecordings(): Promise<void> {
    const list = await api().desktop.listRecordings();
    this.recordings.replaceChildren(
      ...list.map((r) => {
        const download = h("button", { type: "button", "data-testid": "desktop-download", disabled: r.status === "recording" }, "Download");
        download.addEventListener("click", () => void this.download(r.id, r.fileName));
        return h("li", { "data-status": r.status }, `${r.fileName} · ${r.status} · ${bytes(r.bytes)} `, download);
      }),
    );
    if (!list.length) this.recordings.append(h("li", { class: "muted" }, "no recordings"));
  }

  private async download(id: string, name: string): Promise<void> {
    try {
      save(await api().desktop.downloadRecording(id), "video/mp4", name);
    } catch (error) {
      this.onError(error);
    }
  }
}

/** Offers `data` as a file download. */
function save(data: Uint8Array, type: string, name: string): void {
  const url = URL.createObjectURL(new Blob([data as BlobPart], { type }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
