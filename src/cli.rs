//! Command-line surface (clap): the subcommands. The client commands' flags (`ClientArgs`) are
//! declared in `config/client.rs`, beside what they resolve to. The daemon's
//! settings (each a flag, an environment variable `SANDBOX_AGENT_<NAME>` and a key of the
//! optional TOML file) are declared once, in `config/settings.rs`, which makes `ServerArgs`;
//! `config/` merges the three sources (flag > env > file > default) into one `Config`.

use std::path::PathBuf;

use clap::{Args, FromArgMatches, Parser, Subcommand};

pub use crate::config::{ClientArgs, ServerArgs};

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-agent",
    version,
    about = "Runs ACP coding agents inside a sandbox and serves them over HTTP",
    long_about = "Sandbox Agent supervises coding agents that speak the Agent Client Protocol \
(Claude Code, Codex, OpenCode, Gemini, ...) and lets programs outside the sandbox drive them over \
HTTP: POST JSON-RPC to /v1/acp/{serverId}, read what the agent says on GET /v1/acp/{serverId} (SSE).\n\n\
Run without a subcommand to start the daemon on 127.0.0.1:2468.",
    after_help = "Without a subcommand, sandbox-agent runs the daemon and takes every option of \
`sandbox-agent server` (listed by `sandbox-agent server --help`): --config, --host, --port, \
--token, --no-token, --data-dir, --work-dir, --request-timeout and the rest.\n\
Every server option can also be set as an environment variable SANDBOX_AGENT_<NAME> \
(e.g. SANDBOX_AGENT_PORT=8080) or as a key in the --config TOML file (e.g. port = 8080).\n\
Precedence: flag > environment > config file > default. See docs/config.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub server: TopLevelServerArgs,
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
        /// Advertise `sessionCapabilities.list` and answer session/list itself
        #[arg(long)]
        list_sessions: bool,
        /// Advertise `sessionCapabilities.resume` and answer session/resume (reattach without
        /// a replay)
        #[arg(long)]
        resume_session: bool,
    },
    /// Install the Debian packages of the desktop or the browser (apt-get as root; otherwise
    /// prints the command to run); packages whose program is already in PATH are skipped
    Install {
        #[arg(value_enum)]
        what: crate::desktop::install::Target,
        /// Print the missing packages and the command, install nothing
        #[arg(long)]
        dry_run: bool,
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
    /// List every ACP session a running daemon knows (the `GET /v1/sessions` table, every page)
    Sessions {
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
    /// Git status and diff of a repository through a running daemon (`/v1/git/*`)
    Git {
        #[command(subcommand)]
        command: GitCommand,
    },
    /// Search file contents through a running daemon (`/v1/fs/grep`: gitignore-aware, binary
    /// files skipped)
    Grep {
        /// A regular expression (ripgrep's syntax)
        pattern: String,
        /// The directory searched [default: the daemon's work dir]
        #[arg(value_name = "PATH")]
        path: Option<String>,
        /// Only files matching this gitignore-style glob
        #[arg(long, short = 'g')]
        glob: Option<String>,
        #[arg(long, short = 'i')]
        ignore_case: bool,
        /// Include dotfiles
        #[arg(long)]
        hidden: bool,
        /// At most this many matching lines
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The TCP listeners inside the sandbox (`/v1/ports`)
    Ports {
        #[command(flatten)]
        client: ClientArgs,
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
session/close, session/delete (which forgets the session's file), with --resume-session
session/resume, with --list-sessions session/list,
session/set_config_option (its one option, `model`: mock or mock-fast) and _mock/echo
(which returns its params as its result). Its sessions are kept in .mock-agent-sessions/ under
its working directory, so that session/load works in a later process (a session/load also writes
the mcpServers it was given to <session id>.mcp.json there). A prompt's text is echoed
back as one agent_message_chunk, unless it starts with one of these commands:

  /stream N        send N chunks (\"chunk i of N\"), then end the turn
  /sleep MS        wait MS milliseconds (a session/cancel ends it: stopReason cancelled)
  /hang            never end the turn until cancelled
  /permission      ask session/request_permission; the chunk \"permission: OPTION\" reports the answer
  /question        ask a question (a permission request for the tool AskUserQuestion, with
                   rawInput.questions); the chunk \"answer: […]\" reports the result's _meta.answers
  /permission-later, /question-later
                   ask the same, but end the turn at once (the chunk \"asked for permission;
                   the answer comes later\"); the answer is reported at the start of the
                   session's next prompt, as the chunk \"earlier permission: OPTION\" (or
                   \"earlier answer: […]\")
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
  /elicit          ask elicitation/create for a string `branch`; the chunk
                   \"elicitation: ACTION VALUE\" reports the answer
  /withdraw [question|on-cancel]  ask session/request_permission (the question's shape
                   with `question`), then withdraw it ($/cancel_request naming it; with
                   `on-cancel` once the turn is cancelled) and end the turn with the chunk
                   \"withdrawn\"
  /title TEXT      a session_info_update giving the session the title TEXT
  /usage USED SIZE [COST]  a usage_update (context tokens used and window; cost in USD)

A prompt that is exactly one of the bare words tool or error acts as that command, and
permission or question as /permission-later or /question-later (the prompts OpenCode
compatibility suites send: they wait for the prompt's answer before answering the request).

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
    /// Write an instance's session bundle (tar+gzip) to stdout, e.g. `> s1.tgz`
    Export {
        /// The instance's serverId
        #[arg(value_name = "SERVER_ID")]
        server_id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Import a session bundle read from stdin as a new instance, restored by its next POST
    Import {
        /// The serverId to import as (must not exist)
        #[arg(value_name = "SERVER_ID")]
        server_id: String,
        /// Map a session cwd: OLD=NEW, both absolute (repeatable)
        #[arg(long = "cwd", value_name = "OLD=NEW")]
        cwd: Vec<String>,
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
pub enum GitCommand {
    /// Branch, HEAD and changed files
    Status {
        /// A directory in the repository [default: the daemon's work dir]
        #[arg(value_name = "PATH")]
        path: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The work tree (untracked files included) against a revision, as a unified diff
    Diff {
        /// A directory in the repository [default: the daemon's work dir]
        #[arg(value_name = "PATH")]
        path: Option<String>,
        /// The revision compared with [default: HEAD]
        #[arg(long)]
        base: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
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
/// clutter their `--help`): the same entries of the one table (`config/settings.rs`), so the same
/// names, environment variables and config-file keys, and one config file serves both.
#[derive(Debug, Clone, Default)]
pub struct AgentsArgs(Box<ServerArgs>);

/// The settings `AgentsArgs` takes (besides `--config`).
const AGENTS_SETTINGS: &[&str] = &["data_dir", "agents_file", "acp_registry_url", "agent_user"];

impl AgentsArgs {
    /// The server's settings with only these set; everything else falls through to the config
    /// file and the defaults exactly as for the daemon.
    pub fn to_server_args(&self) -> ServerArgs {
        (*self.0).clone()
    }
}

impl Args for AgentsArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        crate::config::server_args(cmd, |name| AGENTS_SETTINGS.contains(&name), false)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for AgentsArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        ServerArgs::from_arg_matches(m).map(|a| AgentsArgs(Box::new(a)))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }
}

/// The daemon's flags as `sandbox-agent` takes them without a subcommand: every one works, but
/// the top-level `--help` does not list them (`sandbox-agent server --help` does).
#[derive(Debug, Clone, Default)]
pub struct TopLevelServerArgs(pub ServerArgs);

impl std::ops::Deref for TopLevelServerArgs {
    type Target = ServerArgs;
    fn deref(&self) -> &ServerArgs {
        &self.0
    }
}

impl Args for TopLevelServerArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        crate::config::server_args(cmd, |_| true, true)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for TopLevelServerArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        ServerArgs::from_arg_matches(m).map(TopLevelServerArgs)
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `sandbox-agent --help` lists no daemon option (they are under `server --help`), yet
    /// `sandbox-agent` without a subcommand takes every one of them.
    #[test]
    fn top_level_help_leaves_the_daemon_options_to_server_help() {
        let help = Cli::command().render_long_help().to_string();
        let options: Vec<&str> = help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .collect();
        assert_eq!(options.len(), 2, "{options:?}");
        assert!(options[0].contains("--help") && options[1].contains("--version"));
        let mut cmd = Cli::command();
        let server = cmd.find_subcommand_mut("server").unwrap();
        assert!(
            server
                .render_long_help()
                .to_string()
                .contains("--max-agents")
        );

        let cli = Cli::try_parse_from([
            "sandbox-agent",
            "--port",
            "8080",
            "--max-agents",
            "3",
            "--no-token",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.server.port, Some(8080));
        assert_eq!(cli.server.max_agents.as_deref(), Some("3"));
        assert!(cli.server.no_token);
    }
}
