//! Command-line surface (clap). Every daemon setting is a flag, an environment variable
//! `SANDBOX_AGENT_<NAME>` and a key of the optional TOML file; this module only declares them,
//! `config/` merges the three sources (flag > env > file > default) into one `Config`.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-agent",
    version,
    about = "Runs ACP coding agents inside a sandbox and serves them over HTTP",
    long_about = "Sandbox Agent supervises coding agents that speak the Agent Client Protocol \
(Claude Code, Codex, OpenCode, Gemini, ...) and lets programs outside the sandbox drive them over \
HTTP: POST JSON-RPC to /v1/acp/{serverId}, read what the agent says on GET /v1/acp/{serverId} (SSE).\n\n\
Run without a subcommand to start the daemon on 127.0.0.1:2468.",
    after_help = "Every server flag can also be set as an environment variable SANDBOX_AGENT_<NAME> \
(e.g. SANDBOX_AGENT_PORT=8080) or as a key in the --config TOML file (e.g. port = 8080).\n\
Precedence: flag > environment > config file > default. See docs/config.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (the default when no subcommand is given)
    #[command(alias = "serve")]
    Server(Box<ServerArgs>),
    /// List or install agents
    Agents {
        #[command(subcommand)]
        command: AgentsCommand,
    },
    /// Run the built-in deterministic ACP agent on stdin/stdout (used by `?agent=mock`)
    #[command(name = "mock-agent", after_help = MOCK_AGENT_COMMANDS)]
    MockAgent {
        /// Advertise `loadSession: false` and refuse session/load (an agent that cannot
        /// restore sessions)
        #[arg(long)]
        no_load_session: bool,
    },
    /// Print the OpenAPI 3.1 document of the HTTP API (the bytes `GET /v1/openapi.json` serves)
    Openapi,
    /// Ask a running daemon how it is: health, version, instance and process counts
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the agent instances of a running daemon (the `GET /v1/acp` table)
    Instances {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Talk to one agent instance of a running daemon: send, stream, stop
    Acp {
        #[command(subcommand)]
        command: AcpCommand,
    },
    /// Run, start, list, follow and stop programs through a running daemon
    Processes {
        #[command(subcommand)]
        command: ProcessesCommand,
    },
    /// List, download and upload files through a running daemon
    Fs {
        #[command(subcommand)]
        command: FsCommand,
    },
    /// Reload a running daemon in place and wait for the outcome (the unit's ExecReload=):
    /// sends SIGHUP to PID, then exits 0 once the new image serves, or 1 with the reason when
    /// the reload was refused (a broken config or binary: the old image serves on), failed, or
    /// did not answer within the timeout
    Reload {
        /// The daemon's pid (systemd: $MAINPID; in a container the init's pid, 1, works too)
        #[arg(long)]
        pid: u32,
        /// How long to wait for the outcome
        #[arg(long, default_value = "25s", value_name = "DURATION")]
        timeout: String,
    },
    /// Internal: a warm spawn waiting on the control socket `fd` for the program to exec
    #[command(name = "spawn-stub", hide = true)]
    SpawnStub { fd: i32 },
    /// Internal: run by a daemon before an in-place reload, with the daemon's own arguments
    /// after `--`: loads the configuration as the reloaded daemon would and says whether this
    /// binary accepts the hand-off state version (exit 0), or why not (65: state version,
    /// 78: configuration)
    #[command(name = "reload-check", hide = true)]
    ReloadCheck {
        #[arg(long)]
        state_version: u32,
        /// The daemon carries a token given by flag or environment (its value is not passed)
        #[arg(long)]
        with_token: bool,
        #[arg(last = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// The mock agent's prompt commands (also in docs/acp.md, "The mock agent").
const MOCK_AGENT_COMMANDS: &str = "\
It answers initialize, session/new, session/load, session/prompt, session/cancel,
session/set_config_option (its one option, `model`: mock or mock-fast) and _mock/echo
(which returns its params as its result). Its sessions are kept in .mock-agent-sessions/ under
its working directory, so that session/load works in a later process. A prompt's text is echoed
back as one agent_message_chunk, unless it starts with one of these commands:

  /stream N        send N chunks (\"chunk i of N\"), then end the turn
  /sleep MS        wait MS milliseconds (a session/cancel ends it: stopReason cancelled)
  /hang            never end the turn until cancelled
  /permission      ask session/request_permission; the chunk \"permission: OPTION\" reports the answer
  /question        ask a question (a permission request for the tool AskUserQuestion, with
                   rawInput.questions); the chunk \"answer: […]\" reports the result's _meta.answers
  /tool [PATH]     a tool call (kind edit) whose completed update holds a diff of PATH
                   (default mock-edit.txt in its working directory; nothing is written)
  /error           end the turn with a JSON-RPC error instead of a stop reason
  /crash N         exit at once with code N (default 1)
  /stderr TEXT     write TEXT to stderr (the daemon logs it)
  /garbage         write a line that is not JSON
  /spawn-orphan    start a sleeping grandchild that leaves the process group
  /ignore-term     ignore SIGTERM from now on (the stop has to SIGKILL)
  /fork N          start N sleeping children in the same group
  /alloc MB        allocate and touch MB MiB of memory, kept until exit
  /history         one chunk \"history: P1 | P2 ...\" of the session's earlier prompts

A prompt that is exactly one of the bare words tool, error, permission or question acts as
that command (the prompts OpenCode compatibility suites send).

Example: sandbox-agent mock-agent, then type
  {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"s\",\"prompt\":[{\"type\":\"text\",\"text\":\"/stream 3\"}]}}";

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// List known agents and whether they are installed
    List {
        #[command(flatten)]
        settings: AgentsArgs,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Install an agent (and the native CLI it needs) into the data directory
    Install {
        /// Agent id, e.g. claude, codex, opencode, gemini
        agent: String,
        /// Install again even if already installed
        #[arg(long)]
        reinstall: bool,
        /// Version of the native agent CLI
        #[arg(long, value_name = "V")]
        agent_version: Option<String>,
        /// Version of the ACP agent process (adapter)
        #[arg(long, value_name = "V")]
        agent_process_version: Option<String>,
        #[command(flatten)]
        settings: AgentsArgs,
    },
}

/// How the client commands (`status`, `instances`, `acp`, `processes`, `fs`) reach the daemon:
/// the server's own address and token settings (same flags, variables and config-file keys, so
/// the daemon's config file serves both), plus `--url` and `--json`.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Daemon and output")]
pub struct ClientArgs {
    /// TOML file of the daemon's settings; only `host`, `port`, `token` and `token_file` are read
    #[arg(long, env = "SANDBOX_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The daemon's address; an unspecified one (0.0.0.0, ::) means loopback [default: 127.0.0.1]
    #[arg(long, env = "SANDBOX_AGENT_HOST", value_name = "ADDR")]
    pub host: Option<String>,

    /// The daemon's port [default: 2468]
    #[arg(long, env = "SANDBOX_AGENT_PORT", value_name = "PORT")]
    pub port: Option<u16>,

    /// The daemon's base URL (e.g. http://127.0.0.1:2468); overrides --host and --port
    #[arg(long, env = "SANDBOX_AGENT_URL", value_name = "URL")]
    pub url: Option<String>,

    /// Bearer token the daemon requires
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// Read the bearer token from this file (surrounding whitespace ignored)
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,

    /// Print JSON (one document, or one line per event when following) instead of tables
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum AcpCommand {
    /// POST one JSON-RPC message to an instance and print the answer
    Send {
        /// The instance's serverId
        #[arg(value_name = "SERVER_ID")]
        server_id: String,
        /// The JSON-RPC message, as JSON text; `-` reads it from stdin
        #[arg(value_name = "JSON")]
        message: String,
        /// Agent to start when SERVER_ID does not exist yet (e.g. mock, claude)
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Follow an instance's event stream, one JSON line per event, until it ends
    Stream {
        /// The instance's serverId
        #[arg(value_name = "SERVER_ID")]
        server_id: String,
        /// Start after this event id (0: every event still kept) [default: every event kept]
        #[arg(long, value_name = "ID")]
        from: Option<u64>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Detach an instance and stop its agent
    Stop {
        /// The instance's serverId
        #[arg(value_name = "SERVER_ID")]
        server_id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// What `processes run` and `processes start` launch.
#[derive(Debug, Clone, Args)]
pub struct ProcessSpec {
    /// Working directory (relative: beneath the daemon's --work-dir)
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Extra environment variable for the program (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// The program and its arguments (put `--` before them when they start with `-`)
    #[arg(value_name = "COMMAND", required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ProcessesCommand {
    /// Run a program to completion; print its output and exit with its exit code
    Run {
        /// Kill it after this long, e.g. 30s (at most the daemon's limit) [default: the daemon's]
        #[arg(long, value_name = "DURATION")]
        timeout: Option<String>,
        #[command(flatten)]
        spec: ProcessSpec,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Start a program in the background and print its id
    Start {
        #[command(flatten)]
        spec: ProcessSpec,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the processes
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a process's output (stdout to stdout, stderr to stderr)
    Logs {
        /// The process id (proc_N)
        #[arg(value_name = "ID")]
        id: String,
        /// Keep printing new output until the process has exited
        #[arg(short, long)]
        follow: bool,
        /// Only this stream: stdout, stderr, pty or combined [default: all of them]
        #[arg(long, value_name = "STREAM")]
        stream: Option<String>,
        /// Only the last N chunks of output
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop a process: SIGTERM to its tree, SIGKILL after the daemon's grace
    Stop {
        /// The process id (proc_N)
        #[arg(value_name = "ID")]
        id: String,
        /// SIGKILL at once instead
        #[arg(long)]
        kill: bool,
        /// Wait until it has exited, at most this long (at most 60s) [default: 10s]
        #[arg(long, value_name = "DURATION")]
        wait: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum FsCommand {
    /// List a directory
    Ls {
        /// The directory (relative: beneath the daemon's --work-dir) [default: the work dir]
        #[arg(value_name = "PATH")]
        path: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Download a file; LOCAL absent or `-` writes it to stdout
    Get {
        /// The file in the sandbox
        #[arg(value_name = "REMOTE")]
        remote: String,
        /// Where to write it (replaced only once the whole file has arrived)
        #[arg(value_name = "LOCAL")]
        local: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Upload a file; LOCAL `-` reads stdin
    Put {
        /// The file to send, or `-` for stdin
        #[arg(value_name = "LOCAL")]
        local: PathBuf,
        /// Where to write it in the sandbox (parents created; replaced only once complete)
        #[arg(value_name = "REMOTE")]
        remote: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// The few daemon settings the installer commands use (the server's other flags would only
/// clutter their `--help`). Same names, environment variables and config-file keys as the
/// server's flags, so one config file serves both.
#[derive(Debug, Clone, Default, Args)]
pub struct AgentsArgs {
    /// TOML file with any of the server's settings as keys (unknown keys are rejected)
    #[arg(long, env = "SANDBOX_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Where installed agents live [default: $STATE_DIRECTORY, else ~/.local/share/sandbox-agent]
    #[arg(long, env = "SANDBOX_AGENT_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// TOML file declaring in-house agents (id, command, args, env)
    #[arg(long, env = "SANDBOX_AGENT_AGENTS_FILE", value_name = "FILE")]
    pub agents_file: Option<PathBuf>,

    /// ACP registry URL [default: the public agentclientprotocol registry]
    #[arg(long, env = "SANDBOX_AGENT_ACP_REGISTRY_URL", value_name = "URL")]
    pub acp_registry_url: Option<String>,

    /// Install agents for this user (name or uid) when run as root
    #[arg(long, env = "SANDBOX_AGENT_AGENT_USER", value_name = "USER")]
    pub agent_user: Option<String>,
}

impl AgentsArgs {
    /// The server's settings with only these set; everything else falls through to the config
    /// file and the defaults exactly as for the daemon.
    pub fn to_server_args(&self) -> ServerArgs {
        ServerArgs {
            config: self.config.clone(),
            data_dir: self.data_dir.clone(),
            agents_file: self.agents_file.clone(),
            acp_registry_url: self.acp_registry_url.clone(),
            agent_user: self.agent_user.clone(),
            ..ServerArgs::default()
        }
    }
}

/// Every setting of the daemon. All fields are optional here: a value left out falls through to
/// the environment (handled by clap), then the config file, then the built-in default.
#[derive(Debug, Clone, Default, Args)]
pub struct ServerArgs {
    /// TOML file with any of these settings as keys (unknown keys are rejected)
    #[arg(long, env = "SANDBOX_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address to listen on [default: 127.0.0.1]
    #[arg(long, env = "SANDBOX_AGENT_HOST", value_name = "ADDR")]
    pub host: Option<String>,

    /// TCP port; 0 picks a free one [default: 2468]
    #[arg(long, env = "SANDBOX_AGENT_PORT", value_name = "PORT")]
    pub port: Option<u16>,

    /// Bearer token required on every /v1 route
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// Serve without a token (needed to bind a non-loopback address without --token)
    #[arg(long, env = "SANDBOX_AGENT_NO_TOKEN", value_parser = BoolishValueParser::new(), conflicts_with_all = ["token", "token_file"])]
    pub no_token: bool,

    /// Where installed agents and state live [default: $STATE_DIRECTORY, else ~/.local/share/sandbox-agent]
    #[arg(long, env = "SANDBOX_AGENT_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Root against which relative filesystem paths resolve [default: the current directory]
    #[arg(long, env = "SANDBOX_AGENT_WORK_DIR", value_name = "DIR")]
    pub work_dir: Option<PathBuf>,

    /// Confine every /v1/fs and /v1/config path beneath this directory (symlinks included)
    #[arg(long, env = "SANDBOX_AGENT_FS_ROOT", value_name = "DIR")]
    pub fs_root: Option<PathBuf>,

    /// How long a POSTed request waits for the agent's answer before 504 [default: 10m]
    #[arg(long, env = "SANDBOX_AGENT_REQUEST_TIMEOUT", value_name = "DURATION")]
    pub request_timeout: Option<String>,

    /// How long shutdown waits for requests and agents before killing [default: 10s]
    #[arg(long, env = "SANDBOX_AGENT_SHUTDOWN_GRACE", value_name = "DURATION")]
    pub shutdown_grace: Option<String>,

    /// How long a stopped agent gets between SIGTERM and SIGKILL [default: 5s]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_GRACE", value_name = "DURATION")]
    pub agent_grace: Option<String>,

    /// Events kept per serverId for SSE replay [default: 4096]
    #[arg(long, env = "SANDBOX_AGENT_EVENT_BUFFER", value_name = "COUNT")]
    pub event_buffer: Option<usize>,

    /// Bytes of events kept per serverId for SSE replay [default: 16M]
    #[arg(long, env = "SANDBOX_AGENT_EVENT_BUFFER_BYTES", value_name = "SIZE")]
    pub event_buffer_bytes: Option<String>,

    /// Keep every serverId's events (and sessions, processes) on disk here, so that they
    /// survive a daemon restart; empty: off [default: off]
    #[arg(long, env = "SANDBOX_AGENT_STATE_DIR", value_name = "DIR",
          value_parser = clap::builder::OsStringValueParser::new())]
    pub state_dir: Option<std::ffi::OsString>,

    /// Keep the OpenCode bridge's sessions (/opencode/*) in this directory when there is no
    /// --state-dir (with one they live in it); also read from OPENCODE_COMPAT_DB_PATH [default: off]
    #[arg(long, env = "SANDBOX_AGENT_OPENCODE_STORE", value_name = "DIR",
          value_parser = clap::builder::OsStringValueParser::new())]
    pub opencode_store: Option<std::ffi::OsString>,

    /// When the state dir's writes reach the disk: every, batch:<ms> or os [default: batch:100]
    #[arg(long, env = "SANDBOX_AGENT_STATE_SYNC", value_name = "POLICY")]
    pub state_sync: Option<String>,

    /// Most bytes of one serverId's event log on disk [default: 64M]
    #[arg(long, env = "SANDBOX_AGENT_STATE_MAX_BYTES", value_name = "SIZE")]
    pub state_max_bytes: Option<String>,

    /// Most bytes of the whole state dir [default: 1G]
    #[arg(long, env = "SANDBOX_AGENT_STATE_TOTAL_BYTES", value_name = "SIZE")]
    pub state_total_bytes: Option<String>,

    /// Interval of SSE keepalive comments [default: 15s]
    #[arg(long, env = "SANDBOX_AGENT_KEEPALIVE", value_name = "DURATION")]
    pub keepalive: Option<String>,

    /// Largest JSON request body (ACP envelopes, config entries) [default: 32M]
    #[arg(long, env = "SANDBOX_AGENT_BODY_LIMIT", value_name = "SIZE")]
    pub body_limit: Option<String>,

    /// Largest file upload body (PUT /v1/fs/file, upload-batch); `max` for none [default: 64G]
    #[arg(long, env = "SANDBOX_AGENT_UPLOAD_LIMIT", value_name = "SIZE")]
    pub upload_limit: Option<String>,

    /// Most entries one upload-batch may extract [default: 1000000]
    #[arg(long, env = "SANDBOX_AGENT_UPLOAD_MAX_ENTRIES", value_name = "COUNT")]
    pub upload_max_entries: Option<u64>,

    /// Longest stdout line accepted from an agent; longer lines are dropped [default: 16M]
    #[arg(long, env = "SANDBOX_AGENT_MAX_LINE", value_name = "SIZE")]
    pub max_line: Option<String>,

    /// Memory limit of each agent's cgroup; `max` for none [default: 4G]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_MEMORY_MAX", value_name = "SIZE")]
    pub agent_memory_max: Option<String>,

    /// Process (task) limit of each agent's cgroup; `max` for none [default: 1024]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_PIDS_MAX", value_name = "COUNT")]
    pub agent_pids_max: Option<String>,

    /// CPU limit of each agent in cores, e.g. 1.5; `max` for none [default: max]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_CPU_MAX", value_name = "CORES")]
    pub agent_cpu_max: Option<String>,

    /// Run agents as this user (name or uid) when the daemon runs as root
    #[arg(long, env = "SANDBOX_AGENT_AGENT_USER", value_name = "USER")]
    pub agent_user: Option<String>,

    /// Environment variables passed to agents: names, or prefixes ending in `*`; `*` for all
    /// (daemon secrets and systemd variables are never passed) [default: *]
    #[arg(
        long,
        env = "SANDBOX_AGENT_AGENT_ENV_PASS",
        value_name = "NAMES",
        value_delimiter = ','
    )]
    pub agent_env_pass: Option<Vec<String>>,

    /// Extra environment for agents, KEY=VALUE (repeatable; comma-separated in the env var)
    #[arg(
        long,
        env = "SANDBOX_AGENT_AGENT_ENV",
        value_name = "KEY=VALUE",
        value_delimiter = ','
    )]
    pub agent_env: Option<Vec<String>>,

    /// TOML file declaring in-house agents (id, command, args, env)
    #[arg(long, env = "SANDBOX_AGENT_AGENTS_FILE", value_name = "FILE")]
    pub agents_file: Option<PathBuf>,

    /// Never install agents at run time; the first POST for a missing agent fails with 4xx
    #[arg(long, env = "SANDBOX_AGENT_REQUIRE_PREINSTALL", value_parser = BoolishValueParser::new())]
    pub require_preinstall: bool,

    /// Answer agent failures and timeouts on requests as 200 + JSON-RPC error instead of 502/504
    #[arg(long, env = "SANDBOX_AGENT_JSONRPC_ERRORS", value_parser = BoolishValueParser::new())]
    pub jsonrpc_errors: bool,

    /// ACP registry URL [default: the public agentclientprotocol registry]
    #[arg(long, env = "SANDBOX_AGENT_ACP_REGISTRY_URL", value_name = "URL")]
    pub acp_registry_url: Option<String>,

    /// Log format: auto (journald when stderr is the journal, else text), journald, text, json
    #[arg(long, env = "SANDBOX_AGENT_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// Log filter, e.g. `info` or `sandbox_agent=debug` [default: info]
    #[arg(long, env = "SANDBOX_AGENT_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Log every request at INFO (method, path, status, latency); without it only errors,
    /// refusals and slow requests are logged, the rest at DEBUG
    #[arg(long, env = "SANDBOX_AGENT_ACCESS_LOG", value_parser = BoolishValueParser::new())]
    pub access_log: bool,

    /// A request whose answer head takes longer than this is logged at INFO even without
    /// --access-log [default: 1s]
    #[arg(long, env = "SANDBOX_AGENT_SLOW_REQUEST", value_name = "DURATION")]
    pub slow_request: Option<String>,

    /// Act as init: reap every orphan and forward signals (automatic when running as PID 1)
    #[arg(long, env = "SANDBOX_AGENT_INIT", value_parser = BoolishValueParser::new())]
    pub init: bool,

    /// Agent cgroups: auto (v1 controllers if mounted, else v2), v1, v2, or off (rlimits only)
    /// [default: auto]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_CGROUPS", value_name = "MODE")]
    pub agent_cgroups: Option<String>,

    // --- harden-edge: the edge (connections, Host/Origin, token file, runtime) ---
    /// Read the bearer token from this file (once, at start; surrounding whitespace ignored)
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,

    /// Extra Host names (or name:port) accepted besides loopback and --host; `*` accepts any
    /// (comma-separated) [default: none]
    #[arg(
        long,
        env = "SANDBOX_AGENT_ALLOWED_HOSTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Option<Vec<String>>,

    /// Browser origins (scheme://host[:port]) allowed besides the daemon's own; `*` allows any
    /// (comma-separated) [default: none]
    #[arg(
        long,
        env = "SANDBOX_AGENT_ALLOWED_ORIGINS",
        value_name = "ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Option<Vec<String>>,

    /// How long a client may take to send a request head, from its first byte [default: 10s]
    #[arg(
        long,
        env = "SANDBOX_AGENT_HEADER_READ_TIMEOUT",
        value_name = "DURATION"
    )]
    pub header_read_timeout: Option<String>,

    /// How long a connection with no request in flight (or a new one that sent nothing) may
    /// stay silent [default: 60s]
    #[arg(long, env = "SANDBOX_AGENT_IDLE_TIMEOUT", value_name = "DURATION")]
    pub idle_timeout: Option<String>,

    /// Open connections held at once; more are answered 503 and closed
    /// [default: half the open-file limit, at most 4096]
    #[arg(long, env = "SANDBOX_AGENT_MAX_CONNECTIONS", value_name = "COUNT")]
    pub max_connections: Option<String>,

    /// Threads of the async runtime; `auto` picks from the CPU count (see docs/config.md)
    /// [default: auto]
    #[arg(long, env = "SANDBOX_AGENT_WORKER_THREADS", value_name = "COUNT")]
    pub worker_threads: Option<String>,

    // --- Runtime caps (hostile clients and agents; see docs/operations.md "Limits and timeouts").
    /// Most agent instances (serverIds) at once; more are refused 503 [default: 64]
    #[arg(long, env = "SANDBOX_AGENT_MAX_AGENTS", value_name = "COUNT")]
    pub max_agents: Option<String>,

    /// Most SSE subscribers of one serverId [default: 64]
    #[arg(long, env = "SANDBOX_AGENT_MAX_SUBSCRIBERS", value_name = "COUNT")]
    pub max_subscribers: Option<String>,

    /// Most SSE subscribers of all serverIds together [default: 1024]
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_SUBSCRIBERS_TOTAL",
        value_name = "COUNT"
    )]
    pub max_subscribers_total: Option<String>,

    /// Bytes queued for one agent's stdin (it reads slower than clients POST) [default: 64M]
    #[arg(long, env = "SANDBOX_AGENT_STDIN_QUEUE", value_name = "SIZE")]
    pub stdin_queue: Option<String>,

    /// Bytes queued for every agent's stdin together [default: 256M]
    #[arg(long, env = "SANDBOX_AGENT_STDIN_QUEUE_TOTAL", value_name = "SIZE")]
    pub stdin_queue_total: Option<String>,

    /// Request body bytes of ACP POSTs being received at once, all together [default: 256M]
    #[arg(long, env = "SANDBOX_AGENT_ACP_INFLIGHT_BYTES", value_name = "SIZE")]
    pub acp_inflight_bytes: Option<String>,

    /// Memory limit of all agents together (a parent cgroup); `max` for none [default: max]
    #[arg(long, env = "SANDBOX_AGENT_AGENTS_MEMORY_MAX", value_name = "SIZE")]
    pub agents_memory_max: Option<String>,

    /// Process (task) limit of all agents together (a parent cgroup); `max` for none
    /// [default: max]
    #[arg(long, env = "SANDBOX_AGENT_AGENTS_PIDS_MAX", value_name = "COUNT")]
    pub agents_pids_max: Option<String>,

    /// Bytes of log records waiting for the log writer; more are dropped and counted [default: 8M]
    #[arg(long, env = "SANDBOX_AGENT_LOG_QUEUE", value_name = "SIZE")]
    pub log_queue: Option<String>,

    /// Send traces over OTLP/HTTP (protobuf) to this collector base URL (`/v1/traces` is
    /// appended); also OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as the
    /// full URL. Without any of them no trace is made [default: off]
    #[arg(long, env = "SANDBOX_AGENT_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// journald's native socket, for --log-format journald
    /// [default: /run/systemd/journal/socket]
    #[arg(long, env = "SANDBOX_AGENT_JOURNAL_SOCKET", value_name = "PATH")]
    pub journal_socket: Option<PathBuf>,

    /// Lines per second of one agent's stderr that reach the log; the rest are counted
    /// [default: 100]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_STDERR_LINES", value_name = "COUNT")]
    pub agent_stderr_lines: Option<String>,

    /// Bytes per second of one agent's stderr that reach the log [default: 64K]
    #[arg(long, env = "SANDBOX_AGENT_AGENT_STDERR_BYTES", value_name = "SIZE")]
    pub agent_stderr_bytes: Option<String>,
    // --- harden-files: transfers, registry, checksums ---
    /// A file transfer (PUT/GET /v1/fs/file, upload-batch) whose client sends or takes nothing
    /// for this long is ended [default: 30s]
    #[arg(long, env = "SANDBOX_AGENT_TRANSFER_TIMEOUT", value_name = "DURATION")]
    pub transfer_timeout: Option<String>,

    /// Most blocking disk steps (one write or read of about 1 MiB) of file transfers running at
    /// once; more wait for a free one. A transfer waiting on its client holds none [default: 256]
    #[arg(long, env = "SANDBOX_AGENT_TRANSFER_MAX", value_name = "COUNT")]
    pub transfer_max: Option<String>,

    /// Most watch streams (GET /v1/fs/watch) at once; more are answered 503 [default: 64]
    #[arg(long, env = "SANDBOX_AGENT_MAX_WATCHES", value_name = "COUNT")]
    pub max_watches: Option<String>,

    /// Most directories (kernel inotify watches) all watch streams hold together; a stream that
    /// needs more fails [default: 65536]
    #[arg(long, env = "SANDBOX_AGENT_WATCH_MAX_DIRS", value_name = "COUNT")]
    pub watch_max_dirs: Option<String>,

    /// Bytes of changes queued for one watch stream's reader; beyond, changes are dropped and an
    /// `overflow` event says so [default: 1M]
    #[arg(long, env = "SANDBOX_AGENT_WATCH_QUEUE", value_name = "SIZE")]
    pub watch_queue: Option<String>,

    /// Bytes per second a request body must average once its grace has passed (uploads: PUT
    /// /v1/fs/file and upload-batch after --transfer-timeout; POST /v1/acp after --idle-timeout);
    /// a slower body is ended with 408. 0 turns it off [default: 1K]
    #[arg(long, env = "SANDBOX_AGENT_BODY_MIN_RATE", value_name = "SIZE")]
    pub body_min_rate: Option<String>,

    /// Largest ACP registry document read [default: 16M]
    #[arg(long, env = "SANDBOX_AGENT_REGISTRY_MAX_BYTES", value_name = "SIZE")]
    pub registry_max_bytes: Option<String>,

    /// Refuse registry binaries that come without a sha256
    #[arg(long, env = "SANDBOX_AGENT_REQUIRE_CHECKSUMS")]
    pub require_checksums: bool,
    /// How long an ACP RFD transport connection (/v1/agents/{agent}/acp) may have no open stream
    /// or socket before its agent is stopped [default: 30s]
    #[arg(
        long,
        env = "SANDBOX_AGENT_ACP_CONNECTION_IDLE",
        value_name = "DURATION"
    )]
    pub acp_connection_idle: Option<String>,
    // ---- Process API (/v1/processes) ----
    /// Processes (background and `run`) that may run at once; more are refused with 429
    /// [default: 64]
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_MAX_CONCURRENT",
        value_name = "COUNT"
    )]
    pub process_max_concurrent: Option<usize>,

    /// Output kept per background process; older output is dropped (readers see a gap)
    /// [default: 4M]
    #[arg(long, env = "SANDBOX_AGENT_PROCESS_MAX_LOG_BYTES", value_name = "SIZE")]
    pub process_max_log_bytes: Option<String>,

    /// Output kept over all process records; a create that does not fit is refused with 503
    /// [default: 256M]
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_MAX_TOTAL_LOG_BYTES",
        value_name = "SIZE"
    )]
    pub process_max_total_log_bytes: Option<String>,

    /// Output a `run` captures per stream before truncating [default: 1M]
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_MAX_OUTPUT_BYTES",
        value_name = "SIZE"
    )]
    pub process_max_output_bytes: Option<String>,

    /// Timeout of a `run` that names none [default: 30s]
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_RUN_TIMEOUT",
        value_name = "DURATION"
    )]
    pub process_run_timeout: Option<String>,

    /// Longest timeout a `run` may ask for [default: 5m]
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_MAX_RUN_TIMEOUT",
        value_name = "DURATION"
    )]
    pub process_max_run_timeout: Option<String>,

    /// Largest decoded input one request may write to a process [default: 64K]
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_MAX_INPUT_BYTES",
        value_name = "SIZE"
    )]
    pub process_max_input_bytes: Option<String>,

    /// Children kept started ahead, each in its own cgroup with its limits, waiting to exec the
    /// next agent or process; 0 turns it off [default: 4]
    #[arg(long, env = "SANDBOX_AGENT_WARM_SPAWNS", value_name = "COUNT")]
    pub warm_spawns: Option<String>,
}
