#!/usr/bin/env python3
"""A deterministic fake model server for the real-agent matrix (tests/it/real_agents.rs).

It speaks just enough of three streaming model APIs for real agents to run whole turns offline:
Anthropic Messages (Claude), OpenAI Responses (Codex) and Gemini streamGenerateContent (Gemini).
What it answers is scripted by markers in the newest user text of the conversation:

  [[text]]              a streamed text answer of three chunks ("fake says: one two three")
  [[write NAME TEXT]]   a tool call that writes TEXT to the file NAME in the agent's cwd, then a
                        text answer once the tool's result comes back
  [[slow]]              text drip-fed one chunk every 200 ms for up to 60 s (for cancel tests)

Anything else gets the [[text]] answer. Matching is on markers and on the request's shape
(whether a tool result is present, which tools are offered), never on whole bodies, so new agent
versions that change models, headers or tool lists keep working.

Every request is appended as one JSON line to the file named by --record (path, query, whether
it asked for a stream, the marker seen, the tool names offered, the conversation as JSON text), and a request whose stream was
cut by the client is recorded with "aborted": true, so tests can check that a cancel aborted the
model request. Listens on 127.0.0.1 (port 0 = any); prints "port N" on stdout once listening.
"""

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARKER = re.compile(r"\[\[(text|slow|write)(?:\s+(\S+)\s+([^\]]*))?\]\]")
LOCK = threading.Lock()
RECORD = None
COUNTER = [0]


def next_id(prefix):
    with LOCK:
        COUNTER[0] += 1
        return f"{prefix}_{COUNTER[0]}"


def record(entry):
    if RECORD is None:
        return
    with LOCK:
        with open(RECORD, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def texts(value):
    """Every string under the keys 'text' (or a string 'content') in a JSON value, in order
    (iteratively: conversations can be deep)."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k in reversed(list(v.keys())):
                if k in ("text", "content") and isinstance(v[k], str):
                    out.append(v[k])
                else:
                    stack.append(v[k])
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return out


def find_marker(messages):
    """The newest marker in the conversation, searching from its last message backwards."""
    for message in reversed(messages):
        for text in reversed(texts(message)):
            found = MARKER.findall(text)
            if found:
                kind, name, body = found[-1]
                return kind, name, body.strip()
    return "text", None, None


class Cut(Exception):
    """The client went away mid-stream."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    # ---- plumbing -------------------------------------------------------------------------
    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    def start_sse(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def send_sse(self, data, event=None):
        chunk = ""
        if event:
            chunk += f"event: {event}\n"
        chunk += f"data: {json.dumps(data)}\n\n"
        try:
            self.wfile.write(chunk.encode())
            self.wfile.flush()
        except OSError as e:
            raise Cut() from e

    def send_json(self, status, value):
        raw = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        # Model listings some agents ask for at start.
        self.send_json(200, {"data": [], "models": [], "object": "list"})

    def do_POST(self):
        path = self.path.split("?")[0]
        req = self.body()
        entry = {"path": path, "query": self.path.partition("?")[2], "aborted": False}
        try:
            if path.endswith("/messages"):
                self.anthropic(req, entry)
            elif path.endswith("/responses"):
                self.openai(req, entry)
            elif ":streamGenerateContent" in path or ":generateContent" in path:
                self.gemini(req, entry, stream=":streamGenerateContent" in path)
            elif path.endswith(":countTokens"):
                self.send_json(200, {"totalTokens": 10})
                entry["marker"] = None
            else:
                self.send_json(404, {"error": {"message": f"no fake for {path}"}})
                entry["marker"] = None
        except Cut:
            entry["aborted"] = True
            self.close_connection = True
        record(entry)

    # ---- script -------------------------------------------------------------------------
    @staticmethod
    def script(kind, has_tool_result):
        """What to say: ('text', chunks) or ('slow', None) or ('tool', None)."""
        if has_tool_result:
            return "text", ["the file ", "is written"]
        if kind == "slow":
            return "slow", None
        if kind == "write":
            return "tool", None
        return "text", ["fake says: ", "one two ", "three"]

    def drip(self, emit):
        """Emits a chunk every 200 ms for up to 60 s; raises Cut when the client goes away."""
        deadline = time.time() + 60
        n = 0
        while time.time() < deadline:
            n += 1
            emit(f"drip {n} ")
            time.sleep(0.2)

    # ---- Anthropic Messages -------------------------------------------------------------
    def anthropic(self, req, entry):
        messages = req.get("messages") or []
        tools = [t.get("name") for t in req.get("tools") or [] if isinstance(t, dict)]
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else {}
        has_result = any(
            isinstance(c, dict) and c.get("type") == "tool_result"
            for c in (last.get("content") if isinstance(last.get("content"), list) else [])
        )
        kind, name, text = find_marker([last] if not has_result else messages)
        entry.update(marker=kind, stream=bool(req.get("stream")), tools=tools,
                     tool_result=has_result, last=[t[:200] for t in texts(last)][-4:],
                     roles=[m.get("role") for m in messages],
                     conversation=json.dumps(messages))
        what, chunks = self.script(kind, has_result)
        if what == "tool" and "Write" not in tools:
            what, chunks = "text", ["no Write tool offered"]
        if not req.get("stream"):
            content = [{"type": "text", "text": "".join(chunks or ["ok"])}]
            self.send_json(200, {"id": next_id("msg"), "type": "message", "role": "assistant",
                                 "model": req.get("model", "fake"), "content": content,
                                 "stop_reason": "end_turn", "stop_sequence": None,
                                 "usage": {"input_tokens": 10, "output_tokens": 5}})
            return
        self.start_sse()
        usage = {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        self.send_sse({"type": "message_start", "message": {
            "id": next_id("msg"), "type": "message", "role": "assistant",
            "model": req.get("model", "fake"), "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": usage}}, "message_start")
        stop = "end_turn"
        if what == "tool":
            cwd = entry.get("cwd")
            path = name
            self.send_sse({"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": next_id("toolu"), "name": "Write", "input": {}}},
                "content_block_start")
            args = json.dumps({"file_path": path, "content": text})
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                self.send_sse({"type": "content_block_delta", "index": 0, "delta": {
                    "type": "input_json_delta", "partial_json": part}}, "content_block_delta")
            self.send_sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
            stop = "tool_use"
        else:
            self.send_sse({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}}, "content_block_start")

            def emit(piece):
                self.send_sse({"type": "content_block_delta", "index": 0,
                               "delta": {"type": "text_delta", "text": piece}},
                              "content_block_delta")
            if what == "slow":
                self.drip(emit)
            else:
                for piece in chunks:
                    emit(piece)
            self.send_sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self.send_sse({"type": "message_delta", "delta": {"stop_reason": stop,
                       "stop_sequence": None}, "usage": {"output_tokens": 5}}, "message_delta")
        self.send_sse({"type": "message_stop"}, "message_stop")

    # ---- OpenAI Responses ---------------------------------------------------------------
    def openai(self, req, entry):
        items = req.get("input") or []
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        tools = []
        for t in req.get("tools") or []:
            if isinstance(t, dict):
                tools.append(t.get("name") or t.get("type"))
        has_result = bool(items) and isinstance(items[-1], dict) and \
            items[-1].get("type") == "function_call_output"
        user = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
        kind, name, text = find_marker(user[-1:] if user else [])
        entry.update(marker=kind, stream=bool(req.get("stream")), tools=tools,
                     tool_result=has_result, conversation=json.dumps(items))
        what, chunks = self.script(kind, has_result)
        tool = next((t for t in ("exec_command", "shell", "local_shell") if t in tools), None)
        if what == "tool" and tool is None:
            what, chunks = "text", ["no shell tool offered"]
        self.start_sse()
        rid = next_id("resp")
        base = {"id": rid, "object": "response", "created_at": int(time.time()),
                "model": req.get("model", "fake"), "status": "in_progress", "output": []}
        self.send_sse({"type": "response.created", "response": base}, "response.created")
        if what == "tool":
            call_id = next_id("call")
            script = f"printf %s {json.dumps(text)} > {name}"
            if tool == "exec_command":
                # Escalation is what makes Codex ask the client in workspace-write mode (a plain
                # write inside the workspace would run without asking).
                args = {"cmd": script, "sandbox_permissions": "require_escalated",
                        "justification": "the test asks for a file"}
            else:
                args = {"command": ["bash", "-lc", script]}
            item = {"type": "function_call", "id": next_id("fc"), "call_id": call_id,
                    "name": tool, "arguments": json.dumps(args), "status": "completed"}
            self.send_sse({"type": "response.output_item.added", "output_index": 0,
                           "item": dict(item, arguments="")}, "response.output_item.added")
            self.send_sse({"type": "response.output_item.done", "output_index": 0,
                           "item": item}, "response.output_item.done")
            output = [item]
        else:
            mid = next_id("msg")
            self.send_sse({"type": "response.output_item.added", "output_index": 0,
                           "item": {"type": "message", "id": mid, "role": "assistant",
                                    "status": "in_progress", "content": []}},
                          "response.output_item.added")
            said = []

            def emit(piece):
                said.append(piece)
                self.send_sse({"type": "response.output_text.delta", "item_id": mid,
                               "output_index": 0, "content_index": 0, "delta": piece},
                              "response.output_text.delta")
            if what == "slow":
                self.drip(emit)
            else:
                for piece in chunks:
                    emit(piece)
            item = {"type": "message", "id": mid, "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "".join(said),
                                 "annotations": []}]}
            self.send_sse({"type": "response.output_item.done", "output_index": 0,
                           "item": item}, "response.output_item.done")
            output = [item]
        done = dict(base, status="completed", output=output, usage={
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15})
        self.send_sse({"type": "response.completed", "response": done}, "response.completed")

    # ---- Gemini -------------------------------------------------------------------------
    def gemini(self, req, entry, stream):
        contents = req.get("contents") or []
        tools = []
        for t in req.get("tools") or []:
            for f in (t.get("functionDeclarations") or []) if isinstance(t, dict) else []:
                tools.append(f.get("name"))
        last = contents[-1] if contents else {}
        has_result = any("functionResponse" in p for p in last.get("parts") or []
                         if isinstance(p, dict))
        kind, name, text = find_marker([last] if not has_result else contents)
        entry.update(marker=kind, stream=stream, tools=tools, tool_result=has_result,
                     conversation=json.dumps(contents))
        what, chunks = self.script(kind, has_result)
        if what == "tool" and "run_shell_command" not in tools:
            what, chunks = "text", ["no shell tool offered"]
        usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}

        def candidate(parts, finish=None):
            c = {"content": {"role": "model", "parts": parts}, "index": 0}
            if finish:
                c["finishReason"] = finish
            out = {"candidates": [c], "modelVersion": "fake"}
            if finish:
                out["usageMetadata"] = usage
            return out
        if not stream:
            self.send_json(200, candidate([{"text": "".join(chunks or ["ok"])}], "STOP"))
            return
        self.start_sse()
        if what == "tool":
            script = f"printf %s {json.dumps(text)} > {name}"
            self.send_sse(candidate([{"functionCall": {"name": "run_shell_command",
                                                       "args": {"command": script}}}], "STOP"))
            return
        if what == "slow":
            self.drip(lambda piece: self.send_sse(candidate([{"text": piece}])))
            self.send_sse(candidate([{"text": "."}], "STOP"))
            return
        for piece in chunks[:-1]:
            self.send_sse(candidate([{"text": piece}]))
        self.send_sse(candidate([{"text": chunks[-1]}], "STOP"))


def main():
    global RECORD
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--record", default=None)
    args = ap.parse_args()
    RECORD = args.record
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"port {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
