#!/usr/bin/env python3
"""Drives OpenCode's TUI (`opencode attach URL -p PASSWORD`) in a pseudo-terminal, for
tests/it/opencode_tui.rs.

It starts the CLI in a pty of 120x40 columns (as a session leader), answers the terminal queries
a real terminal would (cursor position, device attributes), waits for the TUI to draw its prompt
box, types PROMPT and Enter, and waits until the screen has drawn the agent's reply or the time
runs out (the reply is drawn once the screen, after Enter, shows the prompt's text and the
footer of a completed assistant message, "▣ Build · Mock · 52ms"). Then it ends the TUI with
SIGTERM (SIGKILL after 5 s), reaps it, and kills whatever else of its session is left
(reported). Everything is bounded by --seconds.

Prints one JSON line: {"drawn": bool, "replied": bool, "exit": status or null,
"killed": bool, "leftovers": [pids], "screen": the last 4000 characters of the screen text}.
"""

import argparse
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import termios
import time

ESCAPES = re.compile(rb"\x1b\[[0-9;?<>=$]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[PX^_][^\x1b]*\x1b\\|\x1b.")

# The footer the TUI draws under a completed assistant message: agent, model, duration.
COMPLETED = re.compile(r"▣ \w+ · [^·]+ · [0-9.]+m?s")


def text_of(raw):
    """The screen's characters without escape sequences, runs of blanks squeezed."""
    s = ESCAPES.sub(b"", raw).decode("utf-8", "replace")
    return re.sub(r"\s{2,}", "  ", s)


def session_members(sid):
    """Every live process whose session is `sid` (the TUI and whatever it started)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        # fields: state ppid pgrp session ...
        if fields and fields[0] != b"Z" and int(fields[3]) == sid:
            out.append(int(entry))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--opencode", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--home", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()

    home = os.path.abspath(args.home)
    opencode = os.path.abspath(args.opencode)
    env = dict(os.environ, HOME=home, TERM="xterm-256color", COLORTERM="truecolor",
               XDG_CONFIG_HOME=f"{home}/.config", XDG_DATA_HOME=f"{home}/.data",
               XDG_CACHE_HOME=f"{home}/.cache", XDG_STATE_HOME=f"{home}/.state")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(home)
        os.execve(opencode, [opencode, "attach", args.url, "-p", args.password], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))

    raw = b""
    drawn = replied = False
    typed_at = None
    deadline = time.time() + args.seconds
    prompt = args.prompt.encode()
    while time.time() < deadline and not replied:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            raw += data
            if b"\x1b[6n" in data:
                os.write(fd, b"\x1b[1;1R")
            if b"\x1b[c" in data:
                os.write(fd, b"\x1b[?62;c")
        screen = text_of(raw)
        if not drawn and "Ask anything" in screen and "commands" in screen:
            drawn = True
            drawn_at = time.time()
        # The input box takes keys once drawn; a short pause lets it focus.
        if drawn and typed_at is None and time.time() - drawn_at > 1.0:
            os.write(fd, prompt)
            time.sleep(0.3)
            typed_at = len(raw)
            os.write(fd, b"\r")
        if typed_at is not None:
            after = text_of(raw[typed_at:])
            replied = args.prompt in after and COMPLETED.search(after) is not None

    exit_status, killed = None, False
    os.kill(pid, signal.SIGTERM)
    end = time.time() + 5
    while time.time() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            exit_status = status
            break
        # Keep the pty drained so the TUI is never blocked writing its last frame.
        if select.select([fd], [], [], 0.1)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                pass
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        killed = True
    leftovers = session_members(pid)
    for p in leftovers:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    os.close(fd)
    print(json.dumps({"drawn": drawn, "replied": replied, "exit": exit_status, "killed": killed,
                      "leftovers": leftovers, "screen": text_of(raw)[-4000:]}))


if __name__ == "__main__":
    main()
