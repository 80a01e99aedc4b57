// The SDK's trace context: with @opentelemetry/api installed and a span active, a request's POST
// carries its traceparent, and the daemon (tracing on) continues that trace down to the agent,
// whose echoed `_meta.traceparent` has the caller's trace id. Without an active span nothing is
// sent.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { AsyncLocalStorage } from "node:async_hooks";
import { context, trace, ROOT_CONTEXT, TraceFlags } from "@opentelemetry/api";
import { AcpHttpClient } from "acp-http-client";
import { startDaemon, startProxy, binaryExists, BIN } from "./support.mjs";

before(() => {
  if (!binaryExists()) throw new Error(`daemon binary not found at ${BIN}; run cargo build or set SANDBOX_AGENT_BIN`);
});

// The smallest context manager (what @opentelemetry/context-async-hooks provides to applications).
class AlsContextManager {
  als = new AsyncLocalStorage();
  active() {
    return this.als.getStore() ?? ROOT_CONTEXT;
  }
  with(ctx, fn, thisArg, ...args) {
    return this.als.run(ctx, () => fn.call(thisArg, ...args));
  }
  bind(_ctx, target) {
    return target;
  }
  enable() {
    return this;
  }
  disable() {
    this.als.disable();
    return this;
  }
}

let collector;
let collectorUrl;
before(async () => {
  assert.ok(context.setGlobalContextManager(new AlsContextManager()));
  // The daemon's OTLP export goes here; only accepted, not read.
  collector = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/x-protobuf" }).end());
  });
  await new Promise((r) => collector.listen(0, "127.0.0.1", r));
  collectorUrl = `http://127.0.0.1:${collector.address().port}`;
});
after(() => collector.close());

const TRACE_ID = "5b8efff798038103d269b633813fc60c";
const SPAN_ID = "eee19b7ec3c1b174";

test("a request sent inside an active span carries its traceparent, down to the agent", async () => {
  const d = await startDaemon({ args: ["--otlp-endpoint", collectorUrl] });
  const proxy = await startProxy(d.url, {});
  try {
    const c = new AcpHttpClient({ baseUrl: proxy.url, serverId: "traced", agent: "mock", client: {} });
    // Outside any span: no traceparent.
    await c.initialize();
    const { sessionId } = await c.newSession({ cwd: "/", mcpServers: [] });
    const untraced = proxy.postRequests.length;
    assert.ok(untraced >= 2);
    assert.ok(proxy.postRequests.every((h) => !/traceparent/i.test(h)), "no traceparent without a span");

    const span = trace.wrapSpanContext({ traceId: TRACE_ID, spanId: SPAN_ID, traceFlags: TraceFlags.SAMPLED });
    const res = await context.with(trace.setSpan(ROOT_CONTEXT, span), () =>
      c.prompt({ sessionId, prompt: [{ type: "text", text: "hi" }] }),
    );
    const sent = proxy.postRequests.slice(untraced).join("\n");
    assert.match(sent, new RegExp(`traceparent: 00-${TRACE_ID}-${SPAN_ID}-01`, "i"));
    // The agent got the daemon's span in the same trace.
    const received = res._meta?.received?.traceparent ?? "";
    const [, traceId, parent] = received.split("-");
    assert.equal(traceId, TRACE_ID, `the agent's traceparent ${received}`);
    assert.notEqual(parent, SPAN_ID);
    await c.close();
  } finally {
    await proxy.close();
    await d.stop();
  }
});
