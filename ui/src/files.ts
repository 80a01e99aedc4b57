// The files panel: browse the daemon's work dir (or any directory the fs API allows), view the
// start of a text file, upload a file into the directory shown. Views are bounded (VIEW_LIMIT
// bytes), so opening a huge file cannot exhaust the page.

import { api, type FsEntry } from "./api";
import { byId, bytes, h } from "./dom";

const VIEW_LIMIT = 256 * 1024;

export class FilesPanel {
  private readonly pathInput = byId<HTMLInputElement>("files-path");
  private readonly list = byId("files-list");
  private readonly view = byId("file-view");
  private readonly title = byId("file-title");
  private dir = "";

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

  /** Lists `path` (empty: the work dir, whose absolute path is then shown). */
  async open(path: string): Promise<void> {
    try {
      const abs = (await api().stat(path || ".")).path;
      const entries = await api().listEntries(abs);
      this.dir = abs;
      this.pathInput.value = abs;
      entries.sort((a, b) => Number(b.entryType === "directory") - Number(a.entryType === "directory") || a.name.localeCompare(b.name));
      this.list.replaceChildren(...entries.map((e) => this.item(e)));
      if (!entries.length) this.list.append(h("li", { class: "muted" }, "empty directory"));
    } catch (error) {
      this.onError(error);
    }
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
