//! The machinery behind the one table of settings (`settings.rs`): what a setting declares
//! (`Setting`), how its command-line field is parsed (`ArgValue`), how a value is taken from
//! the flag, its variable or the file and checked (`Resolver`), and the rows of docs/config.md.
//! **Invariant:** everything about a setting that a user can see (flag, variable, file key,
//! default, help) is derived here from the one entry; nothing else spells it again.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::{BoolishValueParser, OsStringValueParser};
use clap::{Arg, ArgAction, ArgMatches};

use super::error::{ConfigError, InvalidValue, Origin};
use super::sources::{FileValues, env_name, origin};

/// A value as a source gave it, before it is parsed.
pub(crate) enum Raw {
    Text(String),
    Path(OsString),
    Bool(bool),
    List(Vec<String>),
}

/// What a setting's parser may look at besides the value: the directory relative paths are
/// resolved against and the process environment (machine-dependent defaults).
pub(crate) struct Ctx {
    pub cwd: PathBuf,
    pub env: Vec<(OsString, OsString)>,
}

impl Ctx {
    pub fn var(&self, name: &str) -> Option<OsString> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// A refused value: why, and the part of the raw value at fault (one item of a list), which
/// tells whether it came from the variable the user set.
pub(crate) struct Refusal {
    item: Option<String>,
    why: InvalidValue,
}

type Parser<T> = Box<dyn Fn(Raw, &Ctx) -> Result<T, Refusal>>;

enum Fallback<T> {
    /// The entry forgot to say (`every_default_is_valid` fails on it).
    Missing,
    /// Parsed by the setting's own parser: the help and the docs show this very text.
    Literal(&'static str),
    /// Computed (from the machine or the environment); the text says how.
    Computed(&'static str, Box<dyn Fn(&Ctx) -> T>),
}

/// One setting: how its value is written (`value_name`), parsed and checked, its default, and
/// the longer text docs/config.md gives it. Its name, flag, variable, file key and short help
/// come from the `settings!` entry that holds it.
pub(crate) struct Setting<T> {
    value_name: Option<&'static str>,
    parse: Parser<T>,
    fallback: Fallback<T>,
    docs: Option<&'static str>,
    shape: fn(Arg) -> Arg,
}

fn same(a: Arg) -> Arg {
    a
}

fn text_of(raw: Raw) -> String {
    match raw {
        Raw::Text(s) => s,
        Raw::Path(p) => p.to_string_lossy().into_owned(),
        Raw::Bool(b) => b.to_string(),
        Raw::List(items) => items.join(","),
    }
}

/// A value written as text (a number, a duration, a size, a word).
pub(crate) fn text<T>(
    value_name: &'static str,
    parse: impl Fn(&str) -> Result<T, InvalidValue> + 'static,
) -> Setting<T> {
    Setting::new(
        Some(value_name),
        Box::new(move |raw, _| {
            let s = text_of(raw);
            parse(&s).map_err(|e| Refusal {
                item: Some(s),
                why: e,
            })
        }),
    )
}

/// A path, resolved by `parse` (against the working directory, usually).
pub(crate) fn path<T>(
    value_name: &'static str,
    parse: impl Fn(PathBuf, &Ctx) -> Result<T, InvalidValue> + 'static,
) -> Setting<T> {
    Setting::new(
        Some(value_name),
        Box::new(move |raw, cx| {
            let p = match raw {
                Raw::Path(p) => PathBuf::from(p),
                other => PathBuf::from(text_of(other)),
            };
            let item = p.to_string_lossy().into_owned();
            parse(p, cx).map_err(|e| Refusal {
                item: Some(item),
                why: e,
            })
        }),
    )
}

/// An on/off flag: `true`/`false` in the file, boolish words in the variable, off by default.
pub(crate) fn switch() -> Setting<bool> {
    let mut s = Setting::new(
        None,
        Box::new(|raw, _| {
            Ok(match raw {
                Raw::Bool(b) => b,
                other => text_of(other) == "true",
            })
        }),
    );
    s.fallback = Fallback::Literal("false");
    s
}

/// A comma-separated list (a TOML array in the file); empty items are dropped, each other one
/// goes through `item`.
pub(crate) fn list<T>(
    value_name: &'static str,
    item: impl Fn(&str) -> Result<T, InvalidValue> + 'static,
) -> Setting<Vec<T>> {
    Setting::new(
        Some(value_name),
        Box::new(move |raw, _| {
            let items = match raw {
                Raw::List(items) => items,
                other => text_of(other).split(',').map(str::to_owned).collect(),
            };
            let mut out = Vec::new();
            for i in items.iter().filter(|i| !i.trim().is_empty()) {
                out.push(item(i).map_err(|e| Refusal {
                    item: Some(i.clone()),
                    why: e,
                })?);
            }
            Ok(out)
        }),
    )
}

impl<T> Setting<T> {
    fn new(value_name: Option<&'static str>, parse: Parser<T>) -> Self {
        Setting {
            value_name,
            parse,
            fallback: Fallback::Missing,
            docs: None,
            shape: same,
        }
    }

    /// The default, written as a user would write the value (it goes through the same parser).
    pub fn default(mut self, literal: &'static str) -> Self {
        self.fallback = Fallback::Literal(literal);
        self
    }

    /// A default computed at start; `says` is what the help and the docs show instead.
    pub fn default_from(mut self, says: &'static str, f: impl Fn(&Ctx) -> T + 'static) -> Self {
        self.fallback = Fallback::Computed(says, Box::new(f));
        self
    }

    /// What docs/config.md says of the setting, when it says more than the one-line help.
    pub fn docs(mut self, text: &'static str) -> Self {
        self.docs = Some(text);
        self
    }

    /// Anything else clap must know (conflicts, hidden values).
    pub fn clap(mut self, shape: fn(Arg) -> Arg) -> Self {
        self.shape = shape;
        self
    }

    fn default_value(&self, name: &str, cx: &Ctx) -> T {
        match &self.fallback {
            Fallback::Missing => panic!("--{name} declares no default (nor `unset`)"),
            Fallback::Computed(_, f) => f(cx),
            Fallback::Literal(lit) => {
                let raw = match self.value_name {
                    None => Raw::Bool(*lit == "true"),
                    Some(_) => Raw::Text((*lit).to_string()),
                };
                match (self.parse)(raw, cx) {
                    Ok(v) => v,
                    // Every default is parsed by `every_default_is_valid` in the tests.
                    Err(e) => panic!("the default `{lit}` of --{name} is invalid: {}", e.why),
                }
            }
        }
    }

    /// The facts docs/config.md and `--help` show.
    pub fn meta(&self, name: &'static str, help: &'static str) -> Meta {
        let (default_help, default_docs) = match &self.fallback {
            Fallback::Missing => (None, "?".to_string()),
            Fallback::Literal(l) if self.value_name.is_none() => (None, (*l).to_string()),
            Fallback::Literal(l) => (Some((*l).to_string()), format!("`{l}`")),
            Fallback::Computed(says, _) => (Some((*says).to_string()), (*says).to_string()),
        };
        Meta {
            name,
            value_name: self.value_name,
            help: help.trim(),
            docs: self.docs,
            default_help,
            default_docs,
            shape: self.shape,
        }
    }
}

impl<T: Default> Setting<T> {
    /// No default value: the setting is unset (`None`, empty, off) unless given.
    pub fn unset(self, says: &'static str) -> Self {
        self.default_from(says, |_| T::default())
    }
}

/// What is shown about a setting (`--help`, docs/config.md).
pub(crate) struct Meta {
    pub name: &'static str,
    pub value_name: Option<&'static str>,
    pub help: &'static str,
    pub docs: Option<&'static str>,
    default_help: Option<String>,
    pub default_docs: String,
    shape: fn(Arg) -> Arg,
}

impl Meta {
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The clap argument: `--flag`, `SANDBOX_AGENT_FLAG`, the help with its default.
    pub fn arg(&self) -> Arg {
        let help = match &self.default_help {
            Some(d) => format!("{} [default: {}]", self.help, d.replace('`', "")),
            None => self.help.to_string(),
        };
        let mut arg = Arg::new(self.name)
            .long(self.flag())
            .env(env_name(self.name))
            .help(help);
        if let Some(v) = self.value_name {
            arg = arg.value_name(v);
        }
        (self.shape)(arg)
    }

    /// The row of the docs/config.md table.
    pub fn docs_row(&self) -> String {
        let flag = match self.value_name {
            Some(v) => format!("--{} {v}", self.flag()),
            None => format!("--{}", self.flag()),
        };
        format!(
            "| `{flag}` | `{}` | `{}` | {} | {} |",
            env_name(self.name),
            self.name,
            self.default_docs,
            self.docs.unwrap_or(self.help)
        )
    }
}

/// The type of a setting's command-line field: how clap parses it and what it gave.
pub(crate) trait ArgValue: Sized {
    fn shape(arg: Arg) -> Arg;
    /// The field's value; `None` when the argument is not part of this command (the installer
    /// and the client take only a few of the settings).
    fn from_matches(m: &ArgMatches, id: &str) -> Self;
    /// What the flag or its variable gave, if anything.
    fn given(&self) -> Option<Raw>;
    /// The file's value under `key`, taken out of the file (so that it is known).
    fn from_file(file: &mut FileValues, key: &str, errors: &mut Vec<ConfigError>) -> Option<Raw>;
}

fn one<T: Clone + Send + Sync + 'static>(m: &ArgMatches, id: &str) -> Option<T> {
    m.try_get_one::<T>(id).ok().flatten().cloned()
}

macro_rules! text_arg {
    ($($t:ty),*) => {$(
        impl ArgValue for Option<$t> {
            fn shape(arg: Arg) -> Arg {
                arg.action(ArgAction::Set).value_parser(clap::value_parser!($t))
            }
            fn from_matches(m: &ArgMatches, id: &str) -> Self {
                one::<$t>(m, id)
            }
            fn given(&self) -> Option<Raw> {
                self.as_ref().map(|v| Raw::Text(v.to_string()))
            }
            fn from_file(file: &mut FileValues, key: &str, errors: &mut Vec<ConfigError>) -> Option<Raw> {
                file.take_string(key, errors).map(Raw::Text)
            }
        }
    )*};
}
text_arg!(String, u16, u64, usize);

impl ArgValue for Option<PathBuf> {
    fn shape(arg: Arg) -> Arg {
        arg.action(ArgAction::Set)
            .value_parser(clap::value_parser!(PathBuf))
    }
    fn from_matches(m: &ArgMatches, id: &str) -> Self {
        one::<PathBuf>(m, id)
    }
    fn given(&self) -> Option<Raw> {
        self.clone().map(|p| Raw::Path(p.into_os_string()))
    }
    fn from_file(file: &mut FileValues, key: &str, errors: &mut Vec<ConfigError>) -> Option<Raw> {
        file.take_string(key, errors)
            .map(|s| Raw::Path(OsString::from(s)))
    }
}

/// A path that may be empty (which `PathBuf`'s parser refuses): `--state-dir ""` means off.
impl ArgValue for Option<OsString> {
    fn shape(arg: Arg) -> Arg {
        arg.action(ArgAction::Set)
            .value_parser(OsStringValueParser::new())
    }
    fn from_matches(m: &ArgMatches, id: &str) -> Self {
        one::<OsString>(m, id)
    }
    fn given(&self) -> Option<Raw> {
        self.clone().map(Raw::Path)
    }
    fn from_file(file: &mut FileValues, key: &str, errors: &mut Vec<ConfigError>) -> Option<Raw> {
        file.take_string(key, errors)
            .map(|s| Raw::Path(OsString::from(s)))
    }
}

impl ArgValue for bool {
    fn shape(arg: Arg) -> Arg {
        arg.action(ArgAction::SetTrue)
            .value_parser(BoolishValueParser::new())
    }
    fn from_matches(m: &ArgMatches, id: &str) -> Self {
        one::<bool>(m, id).unwrap_or(false)
    }
    fn given(&self) -> Option<Raw> {
        self.then_some(Raw::Bool(true))
    }
    fn from_file(file: &mut FileValues, key: &str, errors: &mut Vec<ConfigError>) -> Option<Raw> {
        file.take_bool(key, errors).map(Raw::Bool)
    }
}

impl ArgValue for Option<Vec<String>> {
    fn shape(arg: Arg) -> Arg {
        arg.action(ArgAction::Append).value_delimiter(',')
    }
    fn from_matches(m: &ArgMatches, id: &str) -> Self {
        m.try_get_many::<String>(id)
            .ok()
            .flatten()
            .map(|v| v.cloned().collect())
    }
    fn given(&self) -> Option<Raw> {
        self.clone().map(Raw::List)
    }
    fn from_file(file: &mut FileValues, key: &str, errors: &mut Vec<ConfigError>) -> Option<Raw> {
        file.take_list(key, errors).map(Raw::List)
    }
}

/// Takes every setting from its flag (or variable), else the file, else its default, and
/// collects every problem instead of stopping at the first.
pub(crate) struct Resolver<'a> {
    pub file: FileValues,
    pub cx: &'a Ctx,
    pub errors: Vec<ConfigError>,
}

impl Resolver<'_> {
    pub fn resolve<T, A: ArgValue>(&mut self, name: &'static str, arg: &A, s: &Setting<T>) -> T {
        // Always take the key out of the file, so that a key a flag overrides is still known
        // (and still checked).
        let in_file = A::from_file(&mut self.file, name, &mut self.errors);
        let (raw, from_file) = match arg.given() {
            Some(raw) => (Some(raw), false),
            None => (in_file, true),
        };
        let Some(raw) = raw else {
            return s.default_value(name, self.cx);
        };
        match (s.parse)(raw, self.cx) {
            Ok(v) => v,
            Err(r) => {
                let origin = self.origin(name, from_file, r.item.as_deref());
                self.errors
                    .push(ConfigError::InvalidSetting { origin, why: r.why });
                s.default_value(name, self.cx)
            }
        }
    }

    /// Names where a bad value came from: the file's key, the variable the user set (when it
    /// holds that very value, or that item among its comma-separated ones), or the flag.
    pub fn origin(&self, name: &str, from_file: bool, raw: Option<&str>) -> Origin {
        let from_env = !from_file
            && raw.is_some_and(|raw| {
                self.cx.var(&env_name(name)).is_some_and(|v| {
                    v.to_str()
                        .is_some_and(|v| v == raw || v.split(',').any(|i| i.trim() == raw))
                })
            });
        origin(
            &name.replace('_', "-"),
            from_file,
            from_env,
            &self.file.path,
        )
    }
}

/// Declares every setting once; see `settings.rs` for the table and docs/config.md ("Adding a
/// setting") for how to add one. For each entry `name: Type, Field = setting-expression;` it
/// makes the `ServerArgs` field (`Field`: how clap parses the flag and its variable), the
/// `Config` field (`Type`: the parsed value) and their resolution, the `--help` line (from the
/// doc comment) and the docs/config.md row.
macro_rules! settings {
    (
        settings {
            $(
                $(#[doc = $help:literal])*
                $name:ident : $ty:ty, $arg:ty = $spec:expr;
            )*
        }
        derived {
            $(
                $(#[doc = $xdoc:literal])*
                $x:ident : $xty:ty,
            )*
        }
    ) => {
        /// Every setting of the daemon as the command line gave it (flag, else its variable);
        /// a value left out falls through to the config file, then the default.
        #[derive(Debug, Clone, Default)]
        pub struct ServerArgs {
            /// TOML file with any of these settings as keys.
            pub config: Option<std::path::PathBuf>,
            /// `--ready-fd FD`: a descriptor of whoever started the daemon, not a setting.
            pub ready_fd: Option<i32>,
            $( $(#[doc = $help])* pub $name: $arg, )*
        }

        /// The daemon's configuration: every setting, parsed, and what is derived from them
        /// and the environment.
        #[derive(Clone)]
        pub struct Config {
            $( $(#[doc = $help])* pub $name: $ty, )*
            $( $(#[doc = $xdoc])* pub $x: $xty, )*
        }

        /// What `Config` holds besides the settings, worked out after them.
        pub(super) struct Derived {
            $( pub $x: $xty, )*
        }

        /// The settings alone, as resolved.
        pub(super) struct Settings {
            $( pub $name: $ty, )*
        }

        impl Settings {
            pub(super) fn resolve(args: &ServerArgs, r: &mut Resolver<'_>) -> Settings {
                Settings {
                    $( $name: r.resolve(stringify!($name), &args.$name, &$spec), )*
                }
            }

            pub(super) fn into_config(self, d: Derived) -> Config {
                Config {
                    $( $name: self.$name, )*
                    $( $x: d.$x, )*
                }
            }
        }

        /// What `--help` and docs/config.md show of every setting, in table order.
        pub(crate) fn table() -> Vec<Meta> {
            vec![ $( $spec.meta(stringify!($name), concat!($($help),*)), )* ]
        }

        impl ServerArgs {
            /// Adds the settings `keep` selects to `cmd`; `hide` keeps them out of its help.
            pub(crate) fn augment(
                cmd: clap::Command,
                keep: impl Fn(&str) -> bool,
                hide: bool,
            ) -> clap::Command {
                let mut cmd = cmd.arg(config_arg().hide(hide));
                if keep("ready_fd") {
                    cmd = cmd.arg(ready_fd_arg().hide(hide));
                }
                $(
                    if keep(stringify!($name)) {
                        let meta = $spec.meta(stringify!($name), concat!($($help),*));
                        cmd = cmd.arg(<$arg as ArgValue>::shape(meta.arg()).hide(hide));
                    }
                )*
                cmd
            }
        }

        impl clap::FromArgMatches for ServerArgs {
            fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
                Ok(ServerArgs {
                    config: m.try_get_one::<std::path::PathBuf>("config").ok().flatten().cloned(),
                    ready_fd: m.try_get_one::<i32>("ready_fd").ok().flatten().copied(),
                    $( $name: <$arg as ArgValue>::from_matches(m, stringify!($name)), )*
                })
            }
            fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
                *self = Self::from_arg_matches(m)?;
                Ok(())
            }
        }

        impl clap::Args for ServerArgs {
            fn augment_args(cmd: clap::Command) -> clap::Command {
                Self::augment(cmd, |_| true, false)
            }
            fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
                Self::augment_args(cmd)
            }
        }
    };
}
pub(crate) use settings;

/// `--ready-fd FD`: not a setting of the table (a flag only: no variable, no file key), since it
/// names a descriptor the process that starts the daemon hands it.
pub(crate) fn ready_fd_arg() -> Arg {
    Arg::new("ready_fd")
        .long("ready-fd")
        .value_name("FD")
        .help(
            "Once listening, write one JSON line (url, host, port, pid) to this inherited \
             descriptor and close it: how a parent that started the daemon on port 0 learns the \
             address",
        )
        .action(ArgAction::Set)
        .value_parser(clap::value_parser!(i32))
}

/// `--config FILE`: not a setting of the table (the file cannot name itself).
pub(crate) fn config_arg() -> Arg {
    Arg::new("config")
        .long("config")
        .env("SANDBOX_AGENT_CONFIG")
        .value_name("FILE")
        .help("TOML file with any of the server's settings as keys (unknown keys are rejected)")
        .action(ArgAction::Set)
        .value_parser(clap::value_parser!(PathBuf))
}
