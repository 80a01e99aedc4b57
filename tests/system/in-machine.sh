#!/bin/sh
# Runs INSIDE the booted machine (systemd-nspawn --boot, real systemd as PID 1), entered by
# nspawn-systemd.sh. Installs our .deb from /ci-out and checks the packaged units the way an
# administrator would see them. Every check prints `ok: <name>` or `FAIL: <name>: <why>`; each
# property has a negative control (a unit deliberately missing that property) that the same
# predicate must reject, so a check that cannot fail is itself a failure. Exit status: failures.
set -u
failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1: $2"; failures=$((failures + 1)); }
prop() { systemctl show -P "$2" "$1"; }
TOKEN=test-token-123
API=http://127.0.0.1:2468

# --- Controls: units missing one property each, built on the same binary. ---
mkdir -p /etc/systemd/system
cat >/etc/systemd/system/ctl-noready.service <<'UNIT'
[Service]
Type=notify
TimeoutStartSec=3s
# NOTIFY_SOCKET removed: the daemon runs but can never say READY=1.
ExecStart=/usr/bin/env -u NOTIFY_SOCKET /usr/bin/sandbox-agent server --port 2470
UNIT
cat >/etc/systemd/system/ctl-watchdog.service <<'UNIT'
[Service]
Type=notify
WatchdogSec=2s
# WATCHDOG_USEC removed: READY=1 is sent, watchdog pings never are.
ExecStart=/usr/bin/env -u WATCHDOG_USEC /usr/bin/sandbox-agent server --port 2471
UNIT
cat >/etc/systemd/system/ctl-textlog.service <<'UNIT'
[Service]
Type=notify
# Plain text on stderr: the journal gets lines without our fields, all at one priority.
ExecStart=/usr/bin/sandbox-agent server --port 2472 --token t --log-format text
UNIT
cat >/etc/systemd/system/ctl-leftover.service <<'UNIT'
[Service]
KillMode=mixed
# A main process that leaves a child behind when it stops.
ExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1001'
UNIT
cat >/etc/systemd/system/ctl-sock.socket <<'UNIT'
[Socket]
ListenStream=127.0.0.1:2473
UNIT
cat >/etc/systemd/system/ctl-sock.service <<'UNIT'
[Service]
Type=notify
# LISTEN_FDS removed: the daemon binds the port itself, which the socket unit already holds.
ExecStart=/usr/bin/env -u LISTEN_FDS -u LISTEN_PID /usr/bin/sandbox-agent server --port 2473
UNIT

# --- Install: the documented path, and nothing starts before it is asked to. ---
if dpkg -i /ci-out/sandbox-agent.deb >/tmp/dpkg.log 2>&1; then ok "dpkg -i"; else
  fail "dpkg -i" "$(tail -5 /tmp/dpkg.log)"; fi
en=$(systemctl is-enabled sandbox-agent.service 2>&1)
ac=$(systemctl is-active sandbox-agent.service sandbox-agent.socket 2>&1 | tr '\n' ' ')
if [ "$en" = disabled ] && [ "$ac" = "inactive inactive " ]; then ok "install starts nothing"
else fail "install starts nothing" "is-enabled=$en is-active=$ac"; fi
if getent passwd sandbox-agent >/dev/null && [ "$(stat -c %U /var/lib/sandbox-agent)" = sandbox-agent ]
then ok "system user and state dir"; else fail "system user and state dir" "$(getent passwd sandbox-agent; ls -ld /var/lib/sandbox-agent)"; fi

# A short watchdog so the test outlives several periods; the token via the environment file.
mkdir -p /etc/systemd/system/sandbox-agent.service.d
printf '[Service]\nWatchdogSec=2s\n' >/etc/systemd/system/sandbox-agent.service.d/test.conf
echo "SANDBOX_AGENT_TOKEN=$TOKEN" >>/etc/default/sandbox-agent
systemctl daemon-reload

# --- start returns only after READY ---
# The watchdog and text-log controls run while we work on the real unit.
systemctl start ctl-watchdog.service ctl-textlog.service
if systemctl enable --now sandbox-agent.service >/tmp/enable.log 2>&1; then
  # No retry: the API must answer the moment `systemctl start` has returned.
  if curl -sf --max-time 2 "$API/" >/dev/null; then ok "start returns only after READY"
  else fail "start returns only after READY" "GET / failed right after start"; fi
else fail "enable --now" "$(cat /tmp/enable.log)"; fi
if systemctl start ctl-noready.service 2>/dev/null; then
  fail "control: never-READY start fails" "systemctl start succeeded"
elif [ "$(prop ctl-noready.service Result)" = timeout ]; then ok "control: never-READY start fails"
else fail "control: never-READY start fails" "Result=$(prop ctl-noready.service Result)"; fi

state=$(prop sandbox-agent.service ActiveState)/$(prop sandbox-agent.service SubState)
[ "$state" = active/running ] && ok "ActiveState=active" || fail "ActiveState=active" "$state"
status=$(prop sandbox-agent.service StatusText)
case "$status" in "listening on http://127.0.0.1:2468") ok "StatusText";;
  *) fail "StatusText" "'$status'";; esac

# --- auth from the environment file; a 401 and a 200 for the journal ---
code=$(curl -s -o /dev/null -w '%{http_code}' "$API/v1/health")
code2=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOKEN" "$API/v1/health")
[ "$code/$code2" = 401/200 ] && ok "token from EnvironmentFile" || fail "token from EnvironmentFile" "$code/$code2"
# --- agents through the proxy ---
# post BASE_URL TOKEN PATH BODY: one JSON-RPC POST, the answer's body on stdout.
post() { curl -s --max-time 20 -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
  -d "$4" "$1/v1/acp/$3"; }
prompt() { post "$1" "$2" "$3" "{\"jsonrpc\":\"2.0\",\"id\":$4,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"$5\",\"prompt\":[{\"type\":\"text\",\"text\":\"$6\"}]}}"; }
INIT='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
NEW='{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}'
# crash_flow BASE_URL TOKEN: an agent that crashes mid-prompt; prints the status of the next POST
# (502, logged as a warning).
crash_flow() {
  post "$1" "$2" 'pkg-crash?agent=mock' "$INIT" >/dev/null
  s=$(post "$1" "$2" pkg-crash "$NEW" | sed -n 's/.*"sessionId":"\([^"]*\)".*/\1/p')
  prompt "$1" "$2" pkg-crash 3 "$s" "/crash 3" >/dev/null
  curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
    -d '{"jsonrpc":"2.0","id":4,"method":"_mock/echo","params":{}}' "$1/v1/acp/pkg-crash"
}
init=$(post "$API" "$TOKEN" 'pkg-test-1?agent=mock' "$INIT")
case "$init" in *'"protocolVersion"'*) ok "POST /v1/acp/x?agent=mock";;
  *) fail "POST /v1/acp/x?agent=mock" "$init";; esac
sid=$(post "$API" "$TOKEN" pkg-test-1 "$NEW" | sed -n 's/.*"sessionId":"\([^"]*\)".*/\1/p')
prompt "$API" "$TOKEN" pkg-test-1 3 "$sid" "/stderr hello-from-the-agent" >/dev/null
code=$(crash_flow "$API" "$TOKEN")
[ "$code" = 502 ] && ok "a crashed agent answers 502" || fail "a crashed agent answers 502" "$code"
crash_flow http://127.0.0.1:2472 t >/dev/null # the same events for the text-log control
agents=$(pgrep -u sandbox-agent -f mock-agent | tr '\n' ' ')
[ -n "$agents" ] && ok "agent process runs as the service user" || fail "agent process runs as the service user" "none found"

# --- durable state (the unit sets SANDBOX_AGENT_STATE_DIR): a session goes on across a restart ---
# pkg-test-1 keeps its mock session; pkg-crash, deleted first, is the control that must be gone.
prompt "$API" "$TOKEN" pkg-test-1 5 "$sid" "remember-me" >/dev/null
curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $TOKEN" "$API/v1/acp/pkg-crash"
systemctl restart sandbox-agent.service
list=$(curl -s -H "Authorization: Bearer $TOKEN" "$API/v1/acp")
turn=$(prompt "$API" "$TOKEN" pkg-test-1 6 "$sid" "/history")
stream=$(curl -s -N --max-time 3 -H "Authorization: Bearer $TOKEN" -H 'Accept: text/event-stream' \
  "$API/v1/acp/pkg-test-1" || true)
case "$list" in *'"serverId":"pkg-test-1"'*'"exitReason":"daemon_restart"'*) listed=yes;; *) listed=no;; esac
case "$list" in *'"serverId":"pkg-crash"'*) control=listed;; *) control=gone;; esac
case "$turn/$stream" in *'"stopReason":"end_turn"'*'/'*'history: '*'remember-me'*'_sandboxagent/restored'*|\
  *'"stopReason":"end_turn"'*'/'*'_sandboxagent/restored'*'history: '*'remember-me'*) went_on=yes;; *) went_on=no;; esac
if [ "$listed/$went_on/$control" = yes/yes/gone ]; then ok "systemctl restart: the session goes on"
else fail "systemctl restart: the session goes on" "listed=$listed went_on=$went_on control=$control; $list; $turn"; fi

# --- the watchdog: survives several WatchdogSec periods; the silent control is killed ---
pid=$(prop sandbox-agent.service MainPID)
sleep 7
if [ "$(prop sandbox-agent.service ActiveState)" = active ] && [ "$(prop sandbox-agent.service MainPID)" = "$pid" ] \
  && [ "$(prop sandbox-agent.service NRestarts)" = 0 ]; then ok "survives past WatchdogSec"
else fail "survives past WatchdogSec" "$(prop sandbox-agent.service ActiveState) pid $pid->$(prop sandbox-agent.service MainPID) restarts $(prop sandbox-agent.service NRestarts)"; fi
r=$(prop ctl-watchdog.service Result)
[ "$r" = watchdog ] && ok "control: silent watchdog is killed" || fail "control: silent watchdog is killed" "Result=$r"

# --- systemctl reload: the same daemon and the same agent, a new image ---
# agent_pid SERVER_ID: the pid GET /v1/acp lists for it.
agent_pid() {
  curl -s -H "Authorization: Bearer $TOKEN" "$API/v1/acp" |
    sed -n "s/.*\"serverId\":\"$1\"[^}]*\"pid\":\([0-9]*\).*/\1/p"
}
# reloads: how many times the journal says the daemon came back from a reload.
reloads() { journalctl -u sandbox-agent --no-pager -o cat | grep -c '^reloaded; listening on' || true; }
# wait_for CMD...: polls (10 s) until CMD succeeds.
wait_for() { i=0; while [ "$i" -lt 50 ]; do "$@" && return 0; sleep 0.2; i=$((i + 1)); done; return 1; }
pid=$(prop sandbox-agent.service MainPID)
apid=$(agent_pid pkg-test-1)
n=$(reloads)
# `systemctl reload` returns once the new image serves: active at once, not `reloading`.
systemctl reload sandbox-agent.service; rc=$?
state_after=$(prop sandbox-agent.service ActiveState)
more_reloads() { [ "$(reloads)" -gt "$n" ] && [ "$(prop sandbox-agent.service ActiveState)" = active ]; }
if [ "$rc" = 0 ] && [ "$state_after" = active ] && wait_for more_reloads && [ -n "$apid" ] && [ "$(prop sandbox-agent.service MainPID)" = "$pid" ] &&
  [ "$(agent_pid pkg-test-1)" = "$apid" ] &&
  [ "$(prop sandbox-agent.service StatusText)" = "listening on http://127.0.0.1:2468" ]; then
  ok "systemctl reload keeps the daemon and its agents"
else fail "systemctl reload keeps the daemon and its agents" "reload exit $rc, then $state_after; reloads $n -> $(reloads); MainPID $pid -> $(prop sandbox-agent.service MainPID); agent $apid -> $(agent_pid pkg-test-1); $(prop sandbox-agent.service ActiveState) '$(prop sandbox-agent.service StatusText)'"; fi
# Control: a broken config is refused; the daemon serves on and says why in its status.
cp /etc/sandbox-agent/config.toml /tmp/config.toml.good
echo 'no_such_setting = 1' >>/etc/sandbox-agent/config.toml
# ... and `systemctl reload` fails, the reason in the journal.
systemctl reload sandbox-agent.service 2>/dev/null; rc=$?
refused() { case "$(prop sandbox-agent.service StatusText)" in "reload failed"*) return 0;; esac; return 1; }
if [ "$rc" != 0 ] && wait_for refused && [ "$(prop sandbox-agent.service ActiveState)" = active ] &&
  journalctl -u sandbox-agent --no-pager -o cat | grep -q 'refused: the configuration is not valid' &&
  [ "$(prop sandbox-agent.service MainPID)" = "$pid" ] && [ "$(agent_pid pkg-test-1)" = "$apid" ]; then
  ok "control: a broken config is refused on reload"
else fail "control: a broken config is refused on reload" "reload exit $rc; $(prop sandbox-agent.service ActiveState) '$(prop sandbox-agent.service StatusText)'"; fi
cp /tmp/config.toml.good /etc/sandbox-agent/config.toml

# --- journald: our structured fields at the right priorities ---
# journal_ok UNIT: the 'listening' entry at info (tracing's INFO is journald's 5, notice) with the
# ADDR field, and a request answered 502 at warning (4) with the STATUS field, tagged sandbox-agent.
journal_ok() {
  j=$(journalctl -u "$1" -o json --no-pager)
  echo "$j" | grep '"MESSAGE":"listening on http://' | grep '"PRIORITY":"5"' | grep -q '"ADDR":"' &&
    echo "$j" | grep '"STATUS":"502"' | grep '"PRIORITY":"4"' | grep -q '"SYSLOG_IDENTIFIER":"sandbox-agent"'
}
journalctl --sync 2>/dev/null || true
journal_ok sandbox-agent.service && ok "journal fields and priorities" ||
  fail "journal fields and priorities" "$(journalctl -u sandbox-agent -o json --no-pager | tail -5)"
journal_ok ctl-textlog.service && fail "control: text logs lack fields" "predicate accepted plain text" ||
  ok "control: text logs lack fields"
# The agent's stderr line, tagged with the serverId it belongs to.
if journalctl -u sandbox-agent -o json --no-pager | grep '"SERVER_ID":"pkg-test-1"' |
  grep '"MESSAGE":"hello-from-the-agent"' | grep -q '"PRIORITY":"5"'; then
  ok "journal carries the agent's serverId"
else fail "journal carries the agent's serverId" "$(journalctl -u sandbox-agent -o json --no-pager | grep -i server | tail -3)"; fi

# --- stop: Result=success, exit 0, no agent left for systemd to kill ---
# leftovers_ok UNIT: stopped cleanly, and systemd never had to kill a left-over process.
leftovers_ok() {
  ! journalctl -u "$1" --no-pager -o cat | grep -q 'Killing process'
}
systemctl start ctl-leftover.service
# `start` returns once the shell is forked: wait for its background child, or the control has
# nothing left over to detect.
for _ in $(seq 100); do
  [ "$(pgrep -c -f '^sleep 100[01]$')" -ge 2 ] && break
  sleep 0.1
done
systemctl stop sandbox-agent.service ctl-leftover.service
journalctl --sync 2>/dev/null || true
r=$(prop sandbox-agent.service Result)/$(prop sandbox-agent.service ExecMainStatus)
[ "$r" = success/0 ] && ok "stop: Result=success, exit 0" || fail "stop: Result=success, exit 0" "$r"
left=$(pgrep -u sandbox-agent | tr '\n' ' ')
# The daemon itself stopped the agent (logged), systemd had nothing left to kill.
stopped=$(journalctl -u sandbox-agent -o json --no-pager | grep '"MESSAGE":"agent ended"' |
  grep -c '"SERVER_ID":"pkg-test-1"')
if [ -z "$left" ] && [ "$stopped" -ge 1 ] && leftovers_ok sandbox-agent.service; then ok "stop leaves no agent process"
else fail "stop leaves no agent process" "left: '$left'; agent ended logged: $stopped; $(journalctl -u sandbox-agent --no-pager -o cat | grep 'Killing' | head -3)"; fi
leftovers_ok ctl-leftover.service && fail "control: left-over process is detected" "not detected" ||
  ok "control: left-over process is detected"

# --- socket activation ---
systemctl start sandbox-agent.socket ctl-sock.socket
before=$(prop sandbox-agent.service ActiveState)
code=$(curl -s -o /dev/null --max-time 10 -w '%{http_code}' "$API/")
after=$(prop sandbox-agent.service ActiveState)
trig=$(prop sandbox-agent.service TriggeredBy)
if [ "$before/$code/$after" = inactive/200/active ]; then ok "socket activation answers"
else fail "socket activation answers" "service $before -> $after, GET / -> $code, triggered by $trig"; fi
code=$(curl -s -o /dev/null --max-time 3 -w '%{http_code}' http://127.0.0.1:2473/)
[ "$code" = 200 ] && fail "control: socket ignored" "answered" || ok "control: socket ignored"
systemctl stop sandbox-agent.socket sandbox-agent.service
r=$(prop sandbox-agent.service Result)
[ "$r" = success ] && ok "stop after socket activation" || fail "stop after socket activation" "Result=$r"

# --- upgrade reloads a running service in place (agents kept); purge stops it and removes its state ---
systemctl start sandbox-agent.service
post "$API" "$TOKEN" 'pkg-up?agent=mock' "$INIT" >/dev/null
before=$(prop sandbox-agent.service MainPID)
apid=$(agent_pid pkg-up)
dpkg -i /ci-out/sandbox-agent.deb >/tmp/dpkg2.log 2>&1
after=$(prop sandbox-agent.service MainPID)
exe=$(readlink "/proc/$after/exe")
if [ "$(prop sandbox-agent.service ActiveState)" = active ] && [ "$after" = "$before" ] &&
  [ "$exe" = /usr/bin/sandbox-agent ] && [ -n "$apid" ] && [ "$(agent_pid pkg-up)" = "$apid" ]
then ok "upgrade reloads the running service onto the new binary"
else fail "upgrade reloads the running service onto the new binary" "MainPID $before -> $after, exe '$exe', agent $apid -> $(agent_pid pkg-up); $(tail -3 /tmp/dpkg2.log)"; fi
# The operator's choice: with restart-on-upgrade present, an upgrade restarts instead.
touch /etc/sandbox-agent/restart-on-upgrade
dpkg -i /ci-out/sandbox-agent.deb >/tmp/dpkg2b.log 2>&1
after2=$(prop sandbox-agent.service MainPID)
if [ "$(prop sandbox-agent.service ActiveState)" = active ] && [ "$after2" != "$after" ] && [ "$after2" != 0 ]
then ok "upgrade with restart-on-upgrade restarts"
else fail "upgrade with restart-on-upgrade restarts" "MainPID $after -> $after2; $(tail -3 /tmp/dpkg2b.log)"; fi
rm -f /etc/sandbox-agent/restart-on-upgrade
dpkg --purge sandbox-agent >/tmp/dpkg3.log 2>&1
left=$(pgrep -u sandbox-agent | tr '\n' ' ')
if [ ! -e /var/lib/sandbox-agent ] && [ ! -e /usr/bin/sandbox-agent ] && [ -z "$left" ] &&
  [ ! -e /etc/systemd/system/multi-user.target.wants/sandbox-agent.service ]; then ok "purge stops and removes"
else fail "purge stops and removes" "left: '$left'; $(ls -d /var/lib/sandbox-agent /etc/systemd/system/*.wants/sandbox-agent* 2>&1 | tr '\n' ' ')"; fi

journalctl --no-pager -o short-monotonic >/ci-out/journal.txt 2>&1 || true
journalctl -u sandbox-agent --no-pager -o json >/ci-out/sandbox-agent.json 2>&1 || true
if [ "$failures" -gt 0 ]; then
  echo "--- journal of the machine (last 60 lines)"
  tail -60 /ci-out/journal.txt
fi
echo "failures: $failures"
exit "$failures"
