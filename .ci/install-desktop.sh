#!/usr/bin/env bash
# Installs what the desktop API (/v1/desktop/*, docs/desktop.md) and its tests use: the X server
# Xvfb, the openbox window manager, xdotool (input, windows), xclip (clipboard), ffmpeg
# (screenshots, recordings; ffprobe for the recording test), x11-utils (xprop: the window
# manager's client list) and xterm (the window the tests type into). Idempotent.
set -euo pipefail
missing=0
for tool in Xvfb openbox xdotool xclip ffmpeg ffprobe xprop xterm; do
  command -v "$tool" >/dev/null 2>&1 || missing=1
done
if [ "$missing" = 1 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends xvfb openbox xdotool xclip ffmpeg x11-utils xterm >/dev/null
fi
