/**
 * A {@link SessionStore} in one JSON file (Node only; import `sandbox-agent/file-store`).
 *
 * Invariant: the file is always a complete document — each change writes a temporary file beside it
 * and renames it over the old one, and changes are applied one at a time in call order.
 */
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import {
  copyRecord,
  recordKey,
  sortRecords,
  type SessionRecord,
  type SessionStore,
} from "./session-store.js";

interface FileShape {
  version: 1;
  sessions: SessionRecord[];
}

export class JsonFileSessionStore implements SessionStore {
  private readonly path: string;
  private records: Map<string, SessionRecord> | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private seq = 0;

  constructor(path: string) {
    this.path = path;
  }

  async get(serverId: string, id: string): Promise<SessionRecord | undefined> {
    const r = (await this.load()).get(recordKey(serverId, id));
    return r && copyRecord(r);
  }
  async list(): Promise<SessionRecord[]> {
    return sortRecords([...(await this.load()).values()].map(copyRecord));
  }
  set(record: SessionRecord): Promise<void> {
    return this.change((m) => m.set(recordKey(record.serverId, record.id), copyRecord(record)));
  }
  delete(serverId: string, id: string): Promise<void> {
    return this.change((m) => m.delete(recordKey(serverId, id)));
  }

  private change(apply: (m: Map<string, SessionRecord>) => void): Promise<void> {
    const next = this.queue.then(async () => {
      const m = await this.load();
      apply(m);
      const doc: FileShape = { version: 1, sessions: [...m.values()] };
      await mkdir(dirname(this.path), { recursive: true });
      const tmp = `${this.path}.tmp-${process.pid}-${this.seq++}`;
      await writeFile(tmp, JSON.stringify(doc, null, 2) + "\n", { mode: 0o600 });
      await rename(tmp, this.path);
    });
    // A failed write must not wedge every later one; the caller still sees its own failure.
    this.queue = next.catch(() => {});
    return next;
  }

  private async load(): Promise<Map<string, SessionRecord>> {
    if (this.records) return this.records;
    const m = new Map<string, SessionRecord>();
    let text: string | null = null;
    try {
      text = await readFile(this.path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
    }
    if (text !== null) {
      const doc = JSON.parse(text) as FileShape;
      if (!doc || !Array.isArray(doc.sessions)) throw new Error(`${this.path}: not a session store file`);
      for (const r of doc.sessions) m.set(recordKey(r.serverId, r.id), r);
    }
    this.records ??= m;
    return this.records;
  }
}
