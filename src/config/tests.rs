//! The resolution seen from inside: value parsers, the standard OpenTelemetry variables, and
//! that the table, its defaults and docs/config.md agree.

use std::time::Duration;

use super::*;

fn check_size(input: &str, expected: Result<Option<u64>, ()>) {
    assert_eq!(parse_size(input).map_err(|_| ()), expected, "{input}");
}

#[test]
fn sizes() {
    check_size("256M", Ok(Some(256 << 20)));
    check_size("1G", Ok(Some(1 << 30)));
    check_size("1.5GiB", Ok(Some(3 << 29)));
    check_size("4096", Ok(Some(4096)));
    check_size("max", Ok(None));
    check_size("12Q", Err(()));
    check_size("", Err(()));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn otel_settings_come_from_the_standard_variables_and_stay_away_from_agents() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    };
    let c = Config::load_with_env(
        &ServerArgs::default(),
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_SERVICE_NAME", "box-7"),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("PATH", "/bin"),
        ]),
    )
    .expect("valid");
    assert_eq!(
        c.otlp_traces_endpoint.as_deref(),
        Some("http://collector:4318/v1/traces")
    );
    assert_eq!(c.otel_service_name, "box-7");
    assert_eq!(c.otel_sampler, TraceSampler::Ratio(0.25));
    let names: Vec<_> = c.agent_base_env.iter().map(|(k, _)| k.clone()).collect();
    assert!(names.contains(&OsString::from("PATH")));
    assert!(
        !names
            .iter()
            .any(|n| n.to_string_lossy().starts_with("OTEL_"))
    );
    // Named explicitly, they pass.
    let args = ServerArgs {
        agent_env_pass: Some(vec!["PATH".into(), "OTEL_*".into()]),
        ..ServerArgs::default()
    };
    let c = Config::load_with_env(
        &args,
        env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]),
    )
    .expect("valid");
    assert_eq!(c.agent_base_env.len(), 1);
    // Off by default; a bad sampler is a configuration error.
    let off = Config::load_with_env(&ServerArgs::default(), Vec::new()).expect("valid");
    assert_eq!(off.otlp_traces_endpoint, None);
    assert!(
        Config::load_with_env(
            &ServerArgs::default(),
            env(&[("OTEL_TRACES_SAMPLER", "sometimes")])
        )
        .is_err()
    );
}

#[test]
fn agent_cgroups_modes() {
    assert_eq!(Config::defaults().agent_cgroups, AgentCgroups::Auto);
    for (raw, mode) in [
        ("v1", AgentCgroups::V1),
        ("V2", AgentCgroups::V2),
        ("off", AgentCgroups::Off),
    ] {
        let args = ServerArgs {
            agent_cgroups: Some(raw.into()),
            ..ServerArgs::default()
        };
        let config = Config::load_with_env(&args, Vec::new()).expect("valid");
        assert_eq!(config.agent_cgroups, mode);
    }
    let bad = ServerArgs {
        agent_cgroups: Some("v3".into()),
        ..ServerArgs::default()
    };
    let err = Config::load_with_env(&bad, Vec::new()).expect_err("rejected");
    assert!(err.to_string().contains("agent-cgroups"), "{err}");
}

/// Every default of the table goes through its own parser (a bad one would panic at start).
#[test]
fn every_default_is_valid() {
    let c = Config::defaults();
    assert_eq!(c.request_timeout, Duration::from_secs(600));
    assert_eq!(c.upload_limit, Some(64 << 30));
    assert_eq!(c.agent_env_pass, vec!["*".to_string()]);
    assert_eq!(c.state_sync, StateSync::Batch(Duration::from_millis(100)));
}

/// The settings table of docs/config.md is the one `docs_table` makes; with `UPDATE_DOCS=1`
/// this test writes it instead.
#[test]
fn docs_config_md_lists_every_setting_as_declared() {
    const BEGIN: &str = "<!-- settings table: generated from src/config/settings.rs -->\n";
    const END: &str = "<!-- end of the generated settings table -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md");
    let text = std::fs::read_to_string(path).unwrap();
    let start = text.find(BEGIN).expect("the begin marker") + BEGIN.len();
    let end = text.find(END).expect("the end marker");
    let want = docs_table();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = format!("{}{want}{}", &text[..start], &text[end..]);
        std::fs::write(path, updated).unwrap();
        return;
    }
    assert!(
        text[start..end] == want,
        "docs/config.md's settings table differs from src/config/settings.rs; run \
         `UPDATE_DOCS=1 cargo test --lib config::tests::docs` and commit docs/config.md"
    );
}

/// Each shape of entry (text, path, switch, list) through each source: the file's key when no
/// flag is given, the flag over the file, and a bad value named by where it came from.
#[test]
fn every_shape_of_setting_comes_from_the_file_and_yields_to_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "keepalive = '20s'\nevent_buffer = 7\njournal_socket = 'j.sock'\nrequire_preinstall = true\n\
         allowed_hosts = ['A.example', 'b.example']\nagent_env = 'K=v,L=w'\nport = 2469\n",
    )
    .unwrap();
    let from_file = ServerArgs {
        config: Some(file.clone()),
        ..ServerArgs::default()
    };
    let c = Config::load_with_env(&from_file, Vec::new()).expect("valid");
    assert_eq!(c.keepalive, Duration::from_secs(20));
    assert_eq!(c.event_buffer, 7);
    assert_eq!(c.port, 2469);
    assert_eq!(c.journal_socket, PathBuf::from("j.sock"));
    assert!(c.require_preinstall);
    assert_eq!(c.allowed_hosts, ["a.example", "b.example"]);
    assert_eq!(
        c.agent_env,
        [("K".into(), "v".into()), ("L".into(), "w".into())]
    );

    let flags = ServerArgs {
        config: Some(file.clone()),
        keepalive: Some("3s".into()),
        event_buffer: Some(9),
        allowed_hosts: Some(vec!["c.example".into()]),
        ..ServerArgs::default()
    };
    let c = Config::load_with_env(&flags, Vec::new()).expect("valid");
    assert_eq!(c.keepalive, Duration::from_secs(3));
    assert_eq!(c.event_buffer, 9);
    assert_eq!(c.allowed_hosts, ["c.example"]);

    std::fs::write(&file, "keepalive = 'soon'\nagent_env = ['novalue']\n").unwrap();
    let bad = ServerArgs {
        config: Some(file),
        event_buffer: Some(0),
        ..ServerArgs::default()
    };
    let err = Config::load_with_env(&bad, Vec::new())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("3 problem(s)"), "{err}");
    assert!(err.contains("key `keepalive`: `soon`"), "{err}");
    assert!(
        err.contains("key `agent_env`: `novalue` is not KEY=VALUE"),
        "{err}"
    );
    assert!(err.contains("--event-buffer: `0`"), "{err}");
}

/// The file accepts exactly the server's flags as keys (`--shutdown-grace`: `shutdown_grace`),
/// but for `--ready-fd`, a descriptor handed over by whoever starts the daemon.
#[test]
fn the_file_knows_every_flag_of_the_server() {
    use clap::Args;
    let mut keys = keys::known_file_keys();
    keys.sort();
    let cmd = ServerArgs::augment_args(clap::Command::new("sandbox-agent"));
    let mut flags: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| l.replace('-', "_"))
        .filter(|k| k != "ready_fd")
        .collect();
    flags.sort();
    assert_eq!(keys, flags);
}
