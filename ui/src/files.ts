// The files panel: browse the daemon's work dir (or any directory the fs API allows), view the
// start of a text file, upload a file into the directory shown. Views are bounded (VIEW_LIMIT
// bytes), so opening a huge file cannot exhaust the page. The directory shown is watched
// (`GET /v1/fs/watch` through the SDK's `watch()`): a change in it re-lists it (coalesced over
// LIVE_DELAY ms), and so does every `rescan` item (the feed's start, an overflow, a reconnect), so
// the list follows the disk without a refresh and never silently drifts from it.

import { api, type FsEntry } from "./api";
import { byId, bytes, h } from "./dom";

const VIEW_LIMIT = 256 * 1024;
/** Changes within this many milliseconds are applied with one listing. */
const LIVE_DELAY = 100;

export class FilesPanel {
  private readonly pathInput = byId<HTMLInputElement>("files-path");
  private readonly list = byId("files-list");
  private readonly view = byId("file-view");
  private readonly title = byId("file-title");
  private readonly live = byId("files-live");
  private dir = "";
  /** Stops the watch of the directory shown. */
  private watching: AbortController | null = null;
  private relist: ReturnType<typeof setTimeout> | null = null;

  constructor(private readonly onError: (error: unknown) => void) {
    byId("files-form").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.open(this.pathInput.value.trim());
    });
    byId("files-up").addEventListener("click", () => void this.open(parent(this.dir)));
    byId("upload-form").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.upload();
    });
  }

  /** Lists `path` (empty: the work dir, whose absolute path is then shown) and follows it live. */
  async open(path: string): Promise<void> {
    try {
      const abs = (await api().stat(path || ".")).path;
      await this.render(abs);
      if (abs !== this.dir || !this.watching) this.follow(abs);
      this.dir = abs;
      this.pathInput.value = abs;
    } catch (error) {
      this.onError(error);
    }
  }

  private async render(abs: string): Promise<void> {
    const entries = await api().listEntries(abs);
    entries.sort((a, b) => Number(b.entryType === "directory") - Number(a.entryType === "directory") || a.name.localeCompare(b.name));
    this.list.replaceChildren(...entries.map((e) => this.item(e)));
    if (!entries.length) this.list.append(h("li", { class: "muted" }, "empty directory"));
  }

  /** Watches `abs` until another directory is shown; each change or rescan re-lists it. */
  private follow(abs: string): void {
    this.watching?.abort();
    const ac = new AbortController();
    this.watching = ac;
    this.live.textContent = "";
    this.live.removeAttribute("data-live");
    const again = () => {
      if (this.relist) return;
      this.relist = setTimeout(() => {
        this.relist = null;
        if (ac.signal.aborted) return;
        this.render(abs).catch((error) => this.onError(error));
      }, LIVE_DELAY);
    };
    void (async () => {
      try {
        for await (const item of api().watch(abs, { signal: ac.signal })) {
          if (item.kind === "rescan") {
            this.live.textContent = "live";
            this.live.setAttribute("data-live", "true");
          }
          again();
        }
        if (!ac.signal.aborted) this.live.textContent = "not live: the directory is gone";
      } catch (error) {
        if (ac.signal.aborted) return;
        this.live.textContent = "not live";
        this.live.removeAttribute("data-live");
        if (this.watching === ac) this.watching = null;
        this.onError(error);
      }
    })();
  }

  private item(e: FsEntry): HTMLElement {
    const dir = e.entryType === "directory";
    const b = h("button", { type: "button", class: "link", "data-entry-type": e.entryType }, `${e.name}${dir ? "/" : ""}`);
    b.addEventListener("click", () => void (dir ? this.open(e.path) : this.show(e.path)));
    return h("li", { "data-name": e.name }, b, dir ? null : h("span", { class: "muted" }, ` ${bytes(e.size)}`));
  }

  private async show(path: string) {
    this.title.textContent = path;
    try {
      const text = await api().readText(path, VIEW_LIMIT);
      this.view.textContent = text || "(empty file)";
    } catch (error) {
      this.view.textContent = "";
      this.onError(error);
    }
  }

  private async upload() {
    const input = byId<HTMLInputElement>("upload-file");
    const file = input.files?.[0];
    if (!file) return;
    if (!this.dir) await this.open("");
    const target = `${this.dir.replace(/\/+$/, "")}/${file.name}`;
    try {
      const res = await api().writeFile(target, file);
      input.value = "";
      this.title.textContent = `uploaded ${res.path} (${bytes(res.bytesWritten)})`;
      await this.open(this.dir);
    } catch (error) {
      this.onError(error);
    }
  }
}

function parent(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const i = trimmed.lastIndexOf("/");
  return i <= 0 ? "/" : trimmed.slice(0, i);
}
