/**
 * Client-side session metadata (spec 002 §6: the daemon keeps none). A {@link SessionStore} keeps
 * one {@link SessionRecord} per (serverId, session id); the in-memory store is the default, the JSON
 * file store (`sandbox-agent/file-store`, Node only) survives restarts.
 *
 * Invariant: stores hand out copies, so a caller mutating a record never changes the store behind
 * its back.
 */

export interface SessionRecord {
  /** The agent's session id. */
  id: string;
  /** Agent id (e.g. `claude`, `mock`). */
  agent: string;
  /** The daemon instance (`serverId`) the session lives in. */
  serverId: string;
  title?: string;
  /** ISO 8601. */
  createdAt: string;
  /** ISO 8601; moves on every prompt and metadata change. */
  updatedAt: string;
  /** Id of the last event read for this instance (to resume the stream after a restart). */
  lastEventId: number | null;
  /** Anything else the program wants to keep with the session (JSON values). */
  metadata?: Record<string, unknown>;
}

export interface SessionStore {
  get(serverId: string, id: string): Promise<SessionRecord | undefined>;
  set(record: SessionRecord): Promise<void>;
  delete(serverId: string, id: string): Promise<void>;
  /** Every record, newest `updatedAt` first. */
  list(): Promise<SessionRecord[]>;
}

export function recordKey(serverId: string, id: string): string {
  return JSON.stringify([serverId, id]);
}

export function copyRecord(r: SessionRecord): SessionRecord {
  return structuredClone(r);
}

export function sortRecords(records: SessionRecord[]): SessionRecord[] {
  return records.sort((a, b) => (a.updatedAt < b.updatedAt ? 1 : a.updatedAt > b.updatedAt ? -1 : 0));
}

export class InMemorySessionStore implements SessionStore {
  private readonly records = new Map<string, SessionRecord>();

  async get(serverId: string, id: string): Promise<SessionRecord | undefined> {
    const r = this.records.get(recordKey(serverId, id));
    return r && copyRecord(r);
  }
  async set(record: SessionRecord): Promise<void> {
    this.records.set(recordKey(record.serverId, record.id), copyRecord(record));
  }
  async delete(serverId: string, id: string): Promise<void> {
    this.records.delete(recordKey(serverId, id));
  }
  async list(): Promise<SessionRecord[]> {
    return sortRecords([...this.records.values()].map(copyRecord));
  }
}
