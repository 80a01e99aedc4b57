//! The table of the daemon's settings: each entry declares one setting once — its name (which
//! is also its flag `--name-with-dashes`, its variable `SANDBOX_AGENT_NAME` and its file key
//! `name`), the parsed type, the command-line type, the parser with its checks, the default,
//! the `--help` line (the doc comment) and the docs/config.md text. `declare.rs` makes from it
//! `ServerArgs`, `Config`, the resolution and the docs table (which a test keeps equal to
//! docs/config.md). To add a setting, add an entry here; nothing else lists settings.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::DEFAULT_ACP_REGISTRY_URL;
use super::declare::*;
use super::parse::*;
use super::types::{AgentCgroups, LogFormat, StateSync, SystemdEnv, TraceSampler};

settings! {
    settings {
        /// Address to listen on
        host: IpAddr, Option<String> =
            text("ADDR", parse_host).default("127.0.0.1").docs(
                "IP address to listen on; a host name whose every address is loopback \
                 (`localhost`) is accepted and becomes its IPv4 address; other names are refused \
                 (give the address)",
            );
        /// TCP port; 0 picks a free one
        port: u16, Option<u16> =
            text("PORT", parse_port).default("2468").docs(
                "TCP port; `0` picks a free one (the address is in the log, in systemd's \
                 `STATUS=` and on `--ready-fd`)",
            );
        /// Bearer token required on every /v1 route
        token: Option<String>, Option<String> =
            text("TOKEN", non_empty_token)
                .unset("none")
                .clap(|a| a.hide_env_values(true))
                .docs("bearer token required on every `/v1/*` route");
        /// Serve without a token (needed to bind a non-loopback address without --token)
        no_token: bool, bool =
            switch()
                .clap(|a| a.conflicts_with_all(["token", "token_file"]))
                .docs(
                    "serve without a token; required to bind a non-loopback address without \
                     `--token`",
                );
        /// Where installed agents and state live
        data_dir: PathBuf, Option<PathBuf> =
            path("DIR", beneath_cwd)
                .default_from(
                    "`$STATE_DIRECTORY`, else `~/.local/share/sandbox-agent`, else \
                     `/var/lib/sandbox-agent`",
                    default_data_dir,
                )
                .docs("installed agents and daemon state");
        /// Root against which relative filesystem paths resolve
        work_dir: PathBuf, Option<PathBuf> =
            path("DIR", work_dir)
                .default_from("the current directory", |cx| cx.cwd.clone())
                .docs("root for relative filesystem paths and agents' working directory");
        /// Confine every /v1/fs and /v1/config path beneath this directory (symlinks included)
        fs_root: Option<PathBuf>, Option<PathBuf> =
            path("DIR", fs_root).unset("none").docs(
                "confine every `/v1/fs` and `/v1/config` path beneath DIR (symlinks included); \
                 outside is 403",
            );
        /// How long a POSTed request waits for the agent's answer before 504
        request_timeout: Duration, Option<String> =
            text("DURATION", parse_duration).default("10m").docs(
                "how long a POSTed ACP request waits for its answer before 504 (the late answer \
                 still reaches SSE)",
            );
        /// How long shutdown waits for requests and agents before killing
        shutdown_grace: Duration, Option<String> =
            text("DURATION", parse_duration)
                .default("10s")
                .docs("on SIGTERM: time to finish requests and stop agents before they are killed");
        /// How long a stopped agent gets between SIGTERM and SIGKILL
        agent_grace: Duration, Option<String> =
            text("DURATION", parse_duration)
                .default("5s")
                .docs("time a stopped agent gets between SIGTERM and SIGKILL");
        /// Events kept per serverId for SSE replay
        event_buffer: usize, Option<usize> =
            text("COUNT", positive_count)
                .default("4096")
                .docs("events kept per serverId for SSE replay");
        /// Bytes of events kept per serverId for SSE replay
        event_buffer_bytes: u64, Option<String> =
            text("SIZE", size_required).default("16M").docs("bytes of events kept per serverId");
        /// Keep every serverId's events (and sessions, processes) on disk here, so that they
        /// survive a daemon restart; empty: off
        state_dir: Option<PathBuf>, Option<std::ffi::OsString> =
            path("DIR", state_dir)
                .unset("none (the packaged unit: `/var/lib/sandbox-agent/state`)")
                .docs(
                    "keep every serverId's event log and sessions, and the process records, on \
                     disk, so that they survive a restart (docs/durable-state.md); empty: memory \
                     only",
            );
        /// Keep the OpenCode bridge's sessions here when there is no --state-dir
        opencode_store: Option<PathBuf>, Option<std::ffi::OsString> =
            path("DIR", state_dir)
                .default_from(
                    "`$OPENCODE_COMPAT_DB_PATH` (the reference implementation's variable), else \
                     none",
                    |cx| {
                        cx.var("OPENCODE_COMPAT_DB_PATH")
                            .filter(|v| !v.is_empty())
                            .map(|v| cx.cwd.join(v))
                    },
                )
                .docs(
                    "keep the OpenCode bridge's sessions (`/opencode/*`) in DIR when there is no \
                     `--state-dir` (with one they live in `<state-dir>/opencode`); empty: not kept",
                );
        /// When the state dir's writes reach the disk: every, batch:<ms> or os
        state_sync: StateSync, Option<String> =
            text("POLICY", StateSync::parse).default("batch:100").docs(
                "when the state dir's appends are made durable: `every` (each batch the writer \
                 takes is `fdatasync`ed), `batch:<ms>` (1–60000: at most that long after an \
                 append), `os` (never by us: the kernel's writeback); what each loses on a power \
                 failure is in docs/durable-state.md",
            );
        /// Most bytes of one serverId's event log on disk
        state_max_bytes: u64, Option<String> =
            text("SIZE", size_required).default("64M").docs(
                "most bytes of one serverId's (or process's) log on disk: past it (or past twice \
                 `--event-buffer-bytes`, or twice `--event-buffer` records) the log is rewritten \
                 with the retained window",
            );
        /// Most bytes of the whole state dir
        state_total_bytes: u64, Option<String> =
            text("SIZE", size_required).default("1G").docs(
                "most bytes of the whole state dir; over it the daemon keeps state in memory only \
                 (WARN, `\"durable\": false` in `/v1/health`)",
            );
        /// Interval of SSE keepalive comments
        keepalive: Duration, Option<String> =
            text("DURATION", parse_duration)
                .default("15s")
                .docs("interval of SSE keepalive comments (and of WebSocket pings)");
        /// How long an ACP RFD transport connection (/v1/agents/{agent}/acp) may have no open
        /// stream or socket before its agent is stopped
        acp_connection_idle: Duration, Option<String> =
            text("DURATION", parse_duration).default("30s").docs(
                "an ACP RFD transport connection (`/v1/agents/{agent}/acp`) with no open stream \
                 or WebSocket and no POST in progress for this long is deleted (its agent \
                 stopped); clients that close a WebSocket send no DELETE",
            );
        /// Largest JSON request body (ACP envelopes, config entries)
        body_limit: u64, Option<String> =
            text("SIZE", size_required)
                .default("32M")
                .docs("largest JSON request body (ACP envelopes, config entries); larger is 413");
        /// Largest session bundle imported (POST /v1/acp/{serverId}/bundle), compressed and unpacked
        bundle_max_bytes: u64, Option<String> =
            text("SIZE", size_required)
                .default("1G")
                .docs("largest session bundle an import takes, both as sent (gzip) and unpacked; \
                       larger is 413 and nothing is written (docs/acp.md, \"Session bundles\")");
        /// Largest file upload body (PUT /v1/fs/file, upload-batch); `max` for none
        upload_limit: Option<u64>, Option<String> =
            text("SIZE", parse_size)
                .default("64G")
                .docs("largest file upload (`PUT /v1/fs/file`, upload-batch); `max` for none");
        /// Most entries one upload-batch may extract
        upload_max_entries: u64, Option<u64> =
            text("COUNT", whole_number)
                .default("1000000")
                .docs("most entries one upload-batch may extract");
        /// Longest stdout line accepted from an agent; longer lines are dropped
        max_line: u64, Option<String> =
            text("SIZE", size_required)
                .default("16M")
                .docs(
                    "longest stdout line accepted from an agent; longer lines are dropped and \
                     counted",
                );
        /// Memory limit of each agent's cgroup; `max` for none
        agent_memory_max: Option<u64>, Option<String> =
            text("SIZE", parse_size)
                .default("4G")
                .docs("memory limit of each agent (cgroup); `max` for none");
        /// Process (task) limit of each agent's cgroup; `max` for none
        agent_pids_max: Option<u64>, Option<String> =
            text("COUNT", parse_count_or_max)
                .default("1024")
                .docs("process/thread limit of each agent (cgroup); `max` for none");
        /// CPU limit of each agent in cores, e.g. 1.5; `max` for none
        agent_cpu_max: Option<f64>, Option<String> =
            text("CORES", parse_cpu)
                .default("max")
                .docs("CPU limit of each agent in cores (e.g. `1.5`)");
        /// Agent cgroups: auto (v1 controllers if mounted, else v2), v1, v2, or off (rlimits only)
        agent_cgroups: AgentCgroups, Option<String> =
            text("MODE", AgentCgroups::parse).default("auto").docs(
                "where agent cgroups live: `auto` (v1 controllers if mounted, else v2), `v1`, \
                 `v2`, or `off` (rlimits only); see docs/supervision.md",
            );
        /// Children kept started ahead, each in its own cgroup with its limits, waiting to exec the
        /// next agent or process; 0 turns it off
        warm_spawns: usize, Option<String> =
            text("COUNT", warm_spawns).default("4").docs(
                "children kept started ahead, each in its own cgroup with its limits, waiting to \
                 exec the next agent or process (hides the cgroup join's wait); 0 to 64, 0 turns \
                 it off; only with cgroups; see docs/supervision.md",
            );
        /// Run agents as this user (name or uid) when the daemon runs as root
        agent_user: Option<String>, Option<String> =
            text("USER", |s| Ok(Some(s.to_string()))).unset("none").docs(
                "run agents as this user (name or uid) when the daemon runs as root; it gets its \
                 own `HOME` (its home directory when that exists and is its own, else \
                 `<data-dir>/home/<uid>`), and enters working directories as itself",
            );
        /// Environment variables passed to agents: names, or prefixes ending in `*`; `*` for all
        /// (daemon secrets and systemd variables are never passed)
        agent_env_pass: Vec<String>, Option<Vec<String>> =
            list("NAMES", |s| Ok(s.to_string())).default("*").docs(
                "which of the daemon's variables agents inherit: names, or prefixes ending in \
                 `*`, comma-separated (a list in TOML)",
            );
        /// Extra environment for agents, KEY=VALUE (repeatable; comma-separated in the env var)
        agent_env: Vec<(String, String)>, Option<Vec<String>> =
            list("KEY=VALUE", key_value).unset("none").docs(
                "extra variables for agents (repeatable flag; comma-separated in the env var; a \
                 list in TOML)",
            );
        /// TOML file declaring in-house agents (id, command, args, env)
        agents_file: Option<PathBuf>, Option<PathBuf> =
            path("FILE", |p, cx| Ok(Some(cx.cwd.join(p))))
                .unset("none")
                .docs("TOML file declaring in-house agents (see docs/agents.md)");
        /// Never install agents at run time; the first POST for a missing agent fails with 4xx
        require_preinstall: bool, bool =
            switch().docs(
                "never install agents at run time; a POST for a missing agent fails with 409 \
                 naming the install command (the reference implementation answers 404; why \
                 409: docs/agents.md)",
            );
        /// Answer agent failures and timeouts on requests as 200 + JSON-RPC error instead of
        /// 502/504
        jsonrpc_errors: bool, bool =
            switch().docs(
                "answer agent failures and timeouts of ACP requests as 200 + JSON-RPC error \
                 instead of 502/504",
            );
        /// ACP registry URL
        acp_registry_url: String, Option<String> =
            text("URL", registry_url)
                .default(DEFAULT_ACP_REGISTRY_URL)
                .docs("where agent distributions are looked up (`http(s)://` or `file://`)");
        /// Log format: auto (journald when stderr is the journal, else text), journald, text, json
        log_format: LogFormat, Option<String> =
            text("FORMAT", LogFormat::parse).default("auto").docs(
                "`auto` (journald when stderr is the journal, else text), `journald`, `text`, \
                 `json`",
            );
        /// Log filter, e.g. `info` or `sandbox_agent=debug`
        log_level: String, Option<String> =
            text("FILTER", normalise_log_filter).default("info").docs(
                "a level (`error`, `warn`, `info`, `debug`, `trace`; any case; `warning`, `err`, \
                 `verbose` and the like are accepted) or a tracing filter, e.g. \
                 `info,sandbox_agent::acp=debug`",
            );
        /// Log every request at INFO (method, path, status, latency); without it only errors,
        /// refusals and slow requests are logged, the rest at DEBUG
        access_log: bool, bool =
            switch().docs(
                "log every request at INFO; off, only 5xx (WARN), 4xx and slow requests (INFO) \
                 are logged, the rest at DEBUG (docs/observability.md, \"Logs\")",
            );
        /// A request whose answer head takes longer than this is logged at INFO even without
        /// --access-log
        slow_request: Duration, Option<String> =
            text("DURATION", parse_duration).default("1s").docs(
                "a request whose answer head takes longer is logged at INFO even without \
                 `--access-log`",
            );
        /// Act as init: reap every orphan and forward signals (automatic when running as PID 1)
        init: bool, bool =
            switch().docs(
                "act as init (reap orphans, forward signals) even when not PID 1; automatic as \
                 PID 1",
            );
        /// Most agent instances (serverIds) at once; more are refused 503
        max_agents: usize, Option<String> =
            text("COUNT", positive_count).default("64").docs(
                "most agent instances (serverIds) at once, exited ones included until DELETE; \
                 more are 503",
            );
        /// Most SSE subscribers of one serverId
        max_subscribers: usize, Option<String> =
            text("COUNT", positive_count)
                .default("64")
                .docs("most SSE subscribers of one serverId; more are 503");
        /// Most SSE subscribers of all serverIds together
        max_subscribers_total: usize, Option<String> =
            text("COUNT", positive_count)
                .default("1024")
                .docs("most SSE subscribers of all serverIds together");
        /// Bytes queued for one agent's stdin (it reads slower than clients POST)
        stdin_queue: u64, Option<String> =
            text("SIZE", size_required)
                .default("64M")
                .docs(
                    "bytes waiting for one agent to read its stdin; a POST that does not fit is \
                     503",
                );
        /// Bytes queued for every agent's stdin together
        stdin_queue_total: u64, Option<String> =
            text("SIZE", size_required).default("256M").docs("the same for every agent together");
        /// Request body bytes of ACP POSTs being received at once, all together
        acp_inflight_bytes: u64, Option<String> =
            text("SIZE", size_required).default("256M").docs(
                "ACP request body bytes being received at once, all POSTs together, and the bytes \
                 of WebSocket messages still being assembled beyond 64 KiB per socket; more is \
                 503 (a WebSocket: closed with 1013)",
            );
        /// Memory limit of all agents together (a parent cgroup); `max` for none
        agents_memory_max: Option<u64>, Option<String> =
            text("SIZE", parse_size)
                .default("max")
                .docs("memory limit of all agents together (their parent cgroup)");
        /// Process (task) limit of all agents together (a parent cgroup); `max` for none
        agents_pids_max: Option<u64>, Option<String> =
            text("COUNT", parse_count_or_max)
                .default("max")
                .docs("process/thread limit of all agents together (their parent cgroup)");
        /// Bytes of log records waiting for the log writer; more are dropped and counted
        log_queue: u64, Option<String> =
            text("SIZE", size_required)
                .default("8M")
                .docs("log records waiting for the writer thread; more are dropped and counted");
        /// journald's native socket, for --log-format journald
        journal_socket: PathBuf, Option<PathBuf> =
            path("PATH", |p, _| Ok(p))
                .default("/run/systemd/journal/socket")
                .docs("journald's native socket (for `--log-format journald`)");
        /// Send traces over OTLP/HTTP (protobuf) to this collector base URL (`/v1/traces` is
        /// appended); also OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as
        /// the full URL. Without any of them no trace is made
        otlp_endpoint: Option<String>, Option<String> =
            text("URL", |s| Ok((!s.is_empty()).then(|| s.to_string()))).unset("none (off)").docs(
                "send traces over OTLP/HTTP (protobuf) to this collector base URL (`/v1/traces` \
                 is appended). Without it the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the \
                 full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL) is used; with none of \
                 them no trace is made. `OTEL_SERVICE_NAME` (default `sandbox-agent`), \
                 `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (default \
                 `parentbased_always_on`) are read as well; see docs/observability.md, \"Traces\"",
            );
        /// Lines per second of one agent's stderr that reach the log; the rest are counted
        agent_stderr_lines: u64, Option<String> =
            text("COUNT", |s| positive_count(s).map(|n| n as u64))
                .default("100")
                .docs("lines per second of one agent's stderr that reach the log");
        /// Bytes per second of one agent's stderr that reach the log
        agent_stderr_bytes: u64, Option<String> =
            text("SIZE", size_required)
                .default("64K")
                .docs("bytes per second of one agent's stderr that reach the log");
        /// Read the bearer token from this file (once, at start; surrounding whitespace ignored)
        token_file: Option<PathBuf>, Option<PathBuf> =
            path("FILE", |p, _| Ok(Some(p))).unset("none").clap(|a| a.conflicts_with("token")).docs(
                "read the bearer token from FILE once at start (surrounding whitespace ignored; \
                 empty is refused); excludes `--token`",
            );
        /// Extra Host names (or name:port) accepted besides loopback and --host; `*` accepts any
        /// (comma-separated)
        allowed_hosts: Vec<String>, Option<Vec<String>> =
            list("HOSTS", |s| Ok(s.trim().to_ascii_lowercase())).unset("none").docs(
                "without a token, `Host` names served besides loopback and the address the \
                 connection arrived on: `name` (any port) or `name:port`, comma-separated (a list \
                 in TOML); `*` for any. See docs/security.md, \"Browsers\"",
            );
        /// Browser origins (scheme://host[:port]) allowed besides the daemon's own; `*` allows any
        /// (comma-separated)
        allowed_origins: Vec<String>, Option<Vec<String>> =
            list("ORIGINS", normalise_origin).unset("none").docs(
                "browser origins (`scheme://host[:port]`) allowed besides the daemon's own; they \
                 get CORS answers (preflights included); `*` for any",
            );
        /// How long a client may take to send a request head, from its first byte
        header_read_timeout: Duration, Option<String> =
            text("DURATION", positive_duration).default("10s").docs(
                "time a client has to send a complete request head, from its first byte (on a new \
                 or a kept-alive connection); then the connection is closed",
            );
        /// How long a connection with no request in flight (or a new one that sent nothing) may
        /// stay silent
        idle_timeout: Duration, Option<String> =
            text("DURATION", positive_duration).default("60s").docs(
                "a connection with no request in flight and no bytes moving for this long is \
                 closed, a new connection that never sent anything included (never a request in \
                 flight: SSE streams and long prompts are not cut); also how long an ACP POST \
                 body may pause and how long a WebSocket message may take from its first frame to \
                 its last (closed with 1008)",
            );
        /// Open connections held at once; more are answered 503 and closed
        max_connections: usize, Option<String> =
            text("COUNT", positive_count)
                .default_from(
                    "half the open-file soft limit (raised to the hard limit at start), between \
                     16 and 4096",
                    |_| default_max_connections(),
                )
                .docs(
                    "open connections held at once (upgraded ones too); at the cap the quietest \
                     connection with no request in flight is closed to admit a new one; only \
                     when all have a request in flight is a new connection answered 503 and \
                     closed",
                );
        /// Threads of the async runtime; `auto` picks from the CPU count (see docs/config.md)
        worker_threads: usize, Option<String> =
            text("COUNT", worker_threads).default("auto").docs(
                "threads of the async runtime; `auto` = 1 up to 7 CPUs, then one per 4 CPUs, at \
                 most 4 (rule and measurement: docs/performance.md). 1 is tokio's current-thread \
                 runtime",
            );
        /// A file transfer (PUT/GET /v1/fs/file, upload-batch) whose client sends or takes nothing
        /// for this long is ended
        transfer_timeout: Duration, Option<String> =
            text("DURATION", positive_duration).default("30s").docs(
                "a file transfer (`PUT`/`GET /v1/fs/file`, upload-batch) whose client sends or \
                 takes nothing for this long is ended (upload: 408)",
            );
        /// Most watch streams (GET /v1/fs/watch) at once; more are answered 503
        max_watches: usize, Option<String> =
            text("COUNT", positive_count).default("64").docs(
                "most watch streams (`GET /v1/fs/watch`) at once; the next is 503 with \
                 `Retry-After`",
            );
        /// Most directories (kernel inotify watches) all watch streams hold together; a stream that
        /// needs more fails
        watch_max_dirs: usize, Option<String> =
            text("COUNT", positive_count).default("65536").docs(
                "most directories (kernel inotify watches) all watch streams hold together; a \
                 tree needing more is 503 (or an `error` event when it grows later)",
            );
        /// Bytes of changes queued for one watch stream's reader; beyond, changes are dropped and
        /// an `overflow` event says so
        watch_queue: usize, Option<String> =
            text("SIZE", size_required_usize).default("1M").docs(
                "bytes of changes queued for one watch stream's reader; beyond, changes are \
                 dropped and `event: overflow` is sent. A reader taking nothing for \
                 `--transfer-timeout` while its queue is full is cut off",
            );
        /// Most blocking disk steps (one write or read of about 1 MiB) of file transfers running at
        /// once; more wait for a free one. A transfer waiting on its client holds none
        transfer_max: usize, Option<String> =
            text("COUNT", positive_count).default("256").docs(
                "most blocking disk steps of file transfers at once (one ~1 MiB write or read, an \
                 open, an fsync, an extraction); more wait for a free slot. A transfer waiting on \
                 its client holds none",
            );
        /// Bytes per second a request body must average once its grace has passed (uploads: PUT
        /// /v1/fs/file and upload-batch after --transfer-timeout; POST /v1/acp after
        /// --idle-timeout); a slower body is ended with 408. 0 turns it off
        body_min_rate: u64, Option<String> =
            text("SIZE", min_rate).default("1K").docs(
                "bytes per second a request body must average once its grace has passed: an \
                 upload (PUT `/v1/fs/file`, upload-batch) after `--transfer-timeout`, every other \
                 request body (`POST /v1/acp/{serverId}`, the RFD transport's POST, config \
                 entries, processes, moves, installs) after `--idle-timeout`; a slower one is \
                 ended with 408 (`minRate`). `0` turns it off",
            );
        /// Largest ACP registry document read
        registry_max_bytes: u64, Option<String> =
            text("SIZE", size_required).default("16M").docs(
                "largest ACP registry document read (streamed; a larger one is refused and the \
                 fallback used)",
            );
        /// Refuse registry binaries that come without a sha256
        require_checksums: bool, bool =
            switch().docs(
                "refuse to install a downloaded binary that comes without a sha256 (otherwise it \
                 is installed, logged and marked `verified: false`)",
            );
        /// Processes (background and `run`) that may run at once; more are refused with 429
        process_max_concurrent: usize, Option<usize> =
            text("COUNT", positive_count).default("64").docs(
                "processes (`/v1/processes`, background and `run`) running at once; more are 429 \
                 (docs/processes.md)",
            );
        /// Output kept per background process; older output is dropped (readers see a gap)
        process_max_log_bytes: u64, Option<String> =
            text("SIZE", size_required).default("4M").docs(
                "output kept per background process; older output is dropped and readers see a \
                 gap",
            );
        /// Output kept over all process records; a create that does not fit is refused with 503
        process_max_total_log_bytes: u64, Option<String> =
            text("SIZE", size_required).default("256M").docs(
                "output kept over all process records; a create that does not fit is 503; not \
                 changeable over the API",
            );
        /// Output a `run` captures per stream before truncating
        process_max_output_bytes: u64, Option<String> =
            text("SIZE", size_required).default("1M").docs("output a `run` keeps per stream");
        /// Timeout of a `run` that names none
        process_run_timeout: Duration, Option<String> =
            text("DURATION", parse_duration)
                .default("30s")
                .docs("timeout of a `run` that names none");
        /// Longest timeout a `run` may ask for
        process_max_run_timeout: Duration, Option<String> =
            text("DURATION", parse_duration)
                .default("5m")
                .docs("longest timeout a `run` may ask for (longer is clamped)");
        /// Largest decoded input one request may write to a process
        process_max_input_bytes: u64, Option<String> =
            text("SIZE", size_required)
                .default("64K")
                .docs("largest decoded input one request writes to a process; larger is 413");
    }
    derived {
        /// The daemon's own binary, by the path it was started from (resolved once, at start):
        /// the built-in mock agent and a reload execute it. Not `/proc/self/exe`, which names a
        /// deleted file once a package upgrade has replaced the binary.
        exe: PathBuf,
        /// The daemon's environment at start-up, minus everything an agent must never see.
        agent_base_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
        systemd: SystemdEnv,
        /// Where traces go (the full OTLP/HTTP traces URL); `None`: tracing is off.
        otlp_traces_endpoint: Option<String>,
        /// `OTEL_SERVICE_NAME` (default `sandbox-agent`).
        otel_service_name: String,
        /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
        otel_sampler: TraceSampler,
    }
}
