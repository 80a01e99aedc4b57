/**
 * A Server-Sent Events parser over a web `ReadableStream<Uint8Array>` (WHATWG "event stream
 * interpretation"), with no Node-only API so it runs in browsers too.
 *
 * Invariant: memory is bounded — one event (its data plus the partial line being read) may not exceed
 * `maxEventBytes`; a longer one throws {@link SseEventTooLargeError} instead of growing without end.
 */

export interface SseEvent {
  /** `event:` field, `"message"` when absent. */
  event: string;
  /** `id:` field of this event, `undefined` when the event carried none. */
  id?: string;
  data: string;
}

export class SseEventTooLargeError extends Error {
  constructor(limit: number) {
    super(`SSE event larger than ${limit} bytes`);
    this.name = "SseEventTooLargeError";
  }
}

/**
 * Yields each dispatched event. `onActivity` is called for every chunk received (comments included),
 * which lets the caller detect a silent, half-open connection.
 */
export async function* parseSse(
  body: ReadableStream<Uint8Array>,
  maxEventBytes: number,
  onActivity?: () => void,
): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  let eventType = "";
  let id: string | undefined;
  let data: string[] = [];
  let dataSize = 0;
  let skipLeadingLf = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      onActivity?.();
      pending += decoder.decode(value, { stream: true });
      let start = 0;
      for (;;) {
        if (skipLeadingLf && start < pending.length) {
          if (pending.charCodeAt(start) === 10) start++;
          skipLeadingLf = false;
        }
        const cr = pending.indexOf("\r", start);
        const lf = pending.indexOf("\n", start);
        let end: number;
        if (cr === -1 && lf === -1) break;
        if (cr === -1 || (lf !== -1 && lf < cr)) {
          end = lf;
        } else {
          end = cr;
          // A CR at the very end may be the first half of CRLF: skip the LF when it comes.
          if (cr + 1 === pending.length) skipLeadingLf = true;
          else if (pending.charCodeAt(cr + 1) === 10) {
            const line = pending.slice(start, cr);
            start = cr + 2;
            const ev = handleLine(line);
            if (ev) yield ev;
            continue;
          }
        }
        const line = pending.slice(start, end);
        start = end + 1;
        const ev = handleLine(line);
        if (ev) yield ev;
      }
      pending = pending.slice(start);
      if (pending.length + dataSize > maxEventBytes) throw new SseEventTooLargeError(maxEventBytes);
    }
  } finally {
    reader.releaseLock();
    void body.cancel().catch(() => {});
  }

  function handleLine(line: string): SseEvent | undefined {
    if (line === "") {
      if (data.length === 0) {
        eventType = "";
        id = undefined;
        return undefined;
      }
      const ev: SseEvent = { event: eventType || "message", data: data.join("\n") };
      if (id !== undefined) ev.id = id;
      eventType = "";
      id = undefined;
      data = [];
      dataSize = 0;
      return ev;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        eventType = value;
        break;
      case "data":
        data.push(value);
        dataSize += value.length + 1;
        if (dataSize > maxEventBytes) throw new SseEventTooLargeError(maxEventBytes);
        break;
      case "id":
        if (!value.includes("\0")) id = value;
        break;
      default:
        // `retry` and unknown fields: the transport has its own backoff.
        break;
    }
    return undefined;
  }
}
