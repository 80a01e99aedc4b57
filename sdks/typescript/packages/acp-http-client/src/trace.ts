/**
 * W3C trace context for the requests the transport sends: when the application uses OpenTelemetry
 * (the optional peer dependency `@opentelemetry/api`) and a span is active where a request is
 * sent, the POST carries its `traceparent` (and `tracestate`), so the daemon's spans, and the
 * agent's through the `_meta.traceparent` the daemon forwards, join the caller's trace.
 *
 * The package is loaded lazily by name and only if it is installed; without it, or without an
 * active span, nothing is added. No Node-only API.
 */

interface SpanContextLike {
  traceId: string;
  spanId: string;
  traceFlags: number;
}

interface OpenTelemetryApi {
  context: { active(): unknown };
  propagation: { inject(context: unknown, carrier: Record<string, string>): void };
  trace: {
    getSpanContext(context: unknown): SpanContextLike | undefined;
    isSpanContextValid(spanContext: SpanContextLike): boolean;
  };
}

let api: OpenTelemetryApi | null = null;
let loading: Promise<void> | null = null;

/** Loads `@opentelemetry/api` once, if it is installed. Never rejects. */
export function loadOpenTelemetry(): Promise<void> {
  if (!loading) {
    // A name in a variable: bundlers leave the import alone, so an application without the
    // package builds and runs unchanged.
    const name = "@opentelemetry/api";
    loading = import(/* @vite-ignore */ /* webpackIgnore: true */ name).then(
      (m: Partial<OpenTelemetryApi> & { default?: Partial<OpenTelemetryApi> }) => {
        const found = m.context && m.propagation && m.trace ? m : m.default;
        if (found?.context && found.propagation && found.trace) api = found as OpenTelemetryApi;
      },
      () => {},
    );
  }
  return loading;
}

/**
 * The trace headers of the caller's active span (`{}` without one). Uses the application's
 * registered propagator; when none is registered (the API's default injects nothing), writes the
 * W3C `traceparent` of the active span itself.
 */
export function activeTraceHeaders(): Record<string, string> {
  if (!api) return {};
  try {
    const active = api.context.active();
    const carrier: Record<string, string> = {};
    api.propagation.inject(active, carrier);
    if (carrier.traceparent) return carrier;
    const sc = api.trace.getSpanContext(active);
    if (!sc || !api.trace.isSpanContextValid(sc)) return {};
    const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
    return { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}` };
  } catch {
    return {};
  }
}
