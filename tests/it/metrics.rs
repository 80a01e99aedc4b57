//! `GET /metrics` through the real binary: traffic (instances, a crash, a refusal, an SSE stream,
//! a process), then the figures — read by parsing the exposition here, and by Debian's
//! Prometheus scraping the daemon with the bearer token and answering PromQL.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{self, Daemon, eventually_async};

const TOKEN: &str = "metrics-secret";

/// One sample of the text format: name and sorted labels → value.
type Samples = BTreeMap<(String, Vec<(String, String)>), f64>;

fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), Vec::new()),
            Some((name, rest)) => {
                let rest = rest.strip_suffix('}').expect("closing brace");
                let mut labels: Vec<(String, String)> = rest
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once("=\"").expect("label=\"value\"");
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                labels.sort();
                (name.to_string(), labels)
            }
        };
        out.insert((name, labels), value);
    }
    out
}

fn get(s: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    s.get(&(name.to_string(), l)).copied()
}

async fn scrape(d: &Daemon) -> Samples {
    let resp = d.client().get(d.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
    );
    parse(&resp.text().await.unwrap())
}

async fn post(d: &Daemon, path: &str, body: Value) -> (u16, Value) {
    let resp = d
        .client()
        .post(d.url(path))
        .header("content-type", "application/json")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
}

async fn pid_of(d: &Daemon, server_id: &str) -> i32 {
    let rows = d.servers().await;
    let row = rows
        .iter()
        .find(|r| r["serverId"] == server_id)
        .expect("the instance is listed");
    row["pid"].as_i64().expect("a pid") as i32
}

/// The traffic both tests make: `s1` running with an SSE subscriber, `s2` crashed (SIGKILL from
/// outside), `s3` refused by `--max-agents 2`, one process running. Returns the open SSE
/// response, which the caller keeps alive.
async fn traffic(d: &Daemon) -> reqwest::Response {
    for id in ["s1", "s2"] {
        let (status, body) = post(d, &format!("/v1/acp/{id}?agent=mock"), initialize()).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = post(d, "/v1/acp/s3?agent=mock", initialize()).await;
    assert_eq!(status, 503, "max-agents refuses the third: {body}");
    let sse = d
        .client()
        .get(d.url("/v1/acp/s1"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let pid = pid_of(d, "s2").await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually_async(Duration::from_secs(20), "s2 exited", || async {
        let rows = d.servers().await;
        rows.iter()
            .any(|r| r["serverId"] == "s2" && r["status"] == "exited")
            .then_some(())
    })
    .await;
    let (status, body) = post(
        d,
        "/v1/processes",
        json!({"command": "sleep", "args": ["60"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    sse
}

fn daemon() -> Daemon {
    Daemon::builder()
        .token(TOKEN)
        .args(["--max-agents", "2"])
        .start()
}

#[tokio::test]
async fn metrics_count_the_traffic_with_route_templates_for_labels() {
    let d = daemon();
    // Behind the token, like /v1.
    let refused = support::http().get(d.url("/metrics")).send().await.unwrap();
    assert_eq!(refused.status(), 401);

    let _sse = traffic(&d).await;
    // The per-instance figures are sampled every 2 s: wait for s1's.
    let s = eventually_async(Duration::from_secs(20), "s1's sampled figures", || async {
        let s = scrape(&d).await;
        get(
            &s,
            "sandbox_agent_agent_memory_bytes",
            &[("server_id", "s1"), ("agent", "mock")],
        )
        .filter(|m| *m > 0.0)
        .map(|_| s)
    })
    .await;

    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        get(&s, "sandbox_agent_build_info", &[("version", version)]),
        Some(1.0)
    );
    let instances = |state| get(&s, "sandbox_agent_instances", &[("state", state)]);
    assert_eq!(instances("running"), Some(1.0));
    assert_eq!(instances("exited"), Some(1.0));
    assert_eq!(instances("starting"), Some(0.0));
    assert_eq!(
        get(&s, "sandbox_agent_agent_starts_total", &[("agent", "mock")]),
        Some(2.0)
    );
    assert_eq!(
        get(
            &s,
            "sandbox_agent_agent_exits_total",
            &[("agent", "mock"), ("reason", "crashed")]
        ),
        Some(1.0)
    );
    let acp_route = [
        ("route", "/v1/acp/{serverId}"),
        ("method", "POST"),
        ("status", "200"),
    ];
    assert_eq!(
        get(&s, "sandbox_agent_http_requests_total", &acp_route),
        Some(2.0)
    );
    let refused_route = [
        ("route", "/v1/acp/{serverId}"),
        ("method", "POST"),
        ("status", "503"),
    ];
    assert_eq!(
        get(&s, "sandbox_agent_http_requests_total", &refused_route),
        Some(1.0)
    );
    assert_eq!(
        get(
            &s,
            "sandbox_agent_http_request_duration_seconds_count",
            &[("route", "/v1/acp/{serverId}"), ("method", "POST")]
        ),
        Some(3.0)
    );
    // No raw path, serverId or process id ever becomes a label value of the request figures.
    for (name, labels) in s.keys() {
        if name.starts_with("sandbox_agent_http_") {
            for (k, v) in labels {
                assert!(
                    !v.contains("s1") && !v.contains("s2") && !v.contains("proc_"),
                    "{name}: {k}={v}"
                );
            }
        }
    }
    assert_eq!(
        get(
            &s,
            "sandbox_agent_refusals_total",
            &[("limit", "max_agents")]
        ),
        Some(1.0)
    );
    assert_eq!(
        get(
            &s,
            "sandbox_agent_refusals_total",
            &[("limit", "max_connections")]
        ),
        Some(0.0),
        "every limit is exposed, untouched ones at 0"
    );
    assert_eq!(
        get(
            &s,
            "sandbox_agent_acp_request_duration_seconds_count",
            &[("method", "initialize")]
        ),
        Some(2.0)
    );
    let to_agent = get(
        &s,
        "sandbox_agent_acp_messages_total",
        &[("direction", "to_agent")],
    );
    let from_agent = get(
        &s,
        "sandbox_agent_acp_messages_total",
        &[("direction", "from_agent")],
    );
    assert_eq!(to_agent, Some(2.0));
    assert!(from_agent.is_some_and(|n| n >= 2.0), "{from_agent:?}");
    assert_eq!(get(&s, "sandbox_agent_sse_subscribers", &[]), Some(1.0));
    assert_eq!(
        get(&s, "sandbox_agent_processes", &[("state", "running")]),
        Some(1.0)
    );
    let s1 = [("server_id", "s1"), ("agent", "mock")];
    assert_eq!(get(&s, "sandbox_agent_agent_processes", &s1), Some(1.0));
    assert!(get(&s, "sandbox_agent_agent_cpu_seconds_total", &s1).is_some());
    // The crashed instance has no process: no figures.
    assert_eq!(
        get(
            &s,
            "sandbox_agent_agent_memory_bytes",
            &[("server_id", "s2"), ("agent", "mock")]
        ),
        None
    );
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_virtual_memory_bytes",
    ] {
        assert!(get(&s, name, &[]).is_some_and(|v| v > 0.0), "{name}");
    }
    assert!(get(&s, "process_cpu_seconds_total", &[]).is_some());
    assert_eq!(
        get(&s, "sandbox_agent_log_records_dropped_total", &[]),
        Some(0.0)
    );

    // A file written and read back moves the transfer counters by its size.
    let body = vec![b'x'; 10_000];
    let put = d
        .client()
        .put(d.url("/v1/fs/file?path=metrics.bin"))
        .header("content-type", "application/octet-stream")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let got = d
        .client()
        .get(d.url("/v1/fs/file?path=metrics.bin"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.len(), body.len());
    let s = scrape(&d).await;
    assert_eq!(
        get(&s, "sandbox_agent_file_transfer_received_bytes_total", &[]),
        Some(10_000.0)
    );
    assert_eq!(
        get(&s, "sandbox_agent_file_transfer_sent_bytes_total", &[]),
        Some(10_000.0)
    );

    // A deleted instance's series go at once.
    let del = d.client().delete(d.url("/v1/acp/s1")).send().await.unwrap();
    assert!(del.status().is_success());
    let s = scrape(&d).await;
    assert_eq!(get(&s, "sandbox_agent_agent_memory_bytes", &s1), None);

    // OpenMetrics when asked for.
    let resp = d
        .client()
        .get(d.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .unwrap();
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0")
    );
    let text = resp.text().await.unwrap();
    assert!(
        text.ends_with("# EOF\n"),
        "{}",
        &text[text.len().saturating_sub(200)..]
    );
    assert!(text.contains("# TYPE sandbox_agent_refusals counter\n"));
}

/// A free port on loopback (bound, then released for Prometheus to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Prometheus {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Prometheus scraping `target` every second as job `sandbox-agent` with the token, and as
    /// job `wrong-token` with another one (the negative control of the bearer rule).
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n\
             - job_name: sandbox-agent\n  authorization: {{type: Bearer, credentials: {TOKEN}}}\n  \
             static_configs: [{{targets: ['{target}']}}]\n\
             - job_name: wrong-token\n  authorization: {{type: Bearer, credentials: nope}}\n  \
             static_configs: [{{targets: ['{target}']}}]\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = std::process::Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// The value of an instant query's only sample, if it has exactly one.
    async fn value(&self, promql: &str) -> Option<f64> {
        let q = encode_query(promql);
        let resp = support::http()
            .get(format!(
                "http://127.0.0.1:{}/api/v1/query?query={q}",
                self.port
            ))
            .send()
            .await
            .ok()?;
        let body: Value = resp.json().await.ok()?;
        let result = body["data"]["result"].as_array()?;
        if result.len() != 1 {
            return None;
        }
        result[0]["value"][1].as_str()?.parse().ok()
    }

    /// Waits until `promql` is answered with at least one series (a failed query panics).
    async fn expect_series(&self, promql: &str) {
        let q = encode_query(promql);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let body: Value = support::http()
                .get(format!(
                    "http://127.0.0.1:{}/api/v1/query?query={q}",
                    self.port
                ))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(body["status"], "success", "{promql}: {body}");
            if body["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{promql}: no series within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn expect(&self, promql: &str, want: f64) {
        let mut last = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            last = self.value(promql).await;
            if last == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("{promql}: wanted {want}, last answer {last:?}");
    }
}

#[tokio::test]
async fn prometheus_scrapes_with_the_token_and_promql_sees_the_figures() {
    if !support::on_path("prometheus") {
        support::skip("prometheus is not installed (.ci/install-metrics.sh)");
        return;
    }
    let d = daemon();
    let target = d
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let prom = Prometheus::start(&target);
    let _sse = traffic(&d).await;

    prom.expect(r#"up{job="sandbox-agent"}"#, 1.0).await;
    // The scrape without the right token is refused: the bearer rule holds for /metrics.
    prom.expect(r#"up{job="wrong-token"}"#, 0.0).await;
    let job = r#"job="sandbox-agent""#;
    prom.expect(
        &format!(r#"sandbox_agent_instances{{{job},state="running"}}"#),
        1.0,
    )
    .await;
    prom.expect(
        &format!(r#"sandbox_agent_instances{{{job},state="exited"}}"#),
        1.0,
    )
    .await;
    prom.expect(
        &format!(r#"sum(sandbox_agent_agent_exits_total{{{job},reason="crashed"}})"#),
        1.0,
    )
    .await;
    prom.expect(
        &format!(r#"sandbox_agent_refusals_total{{{job},limit="max_agents"}}"#),
        1.0,
    )
    .await;
    prom.expect(&format!(r#"sandbox_agent_sse_subscribers{{{job}}}"#), 1.0)
        .await;
    prom.expect(
        &format!(r#"sandbox_agent_processes{{{job},state="running"}}"#),
        1.0,
    )
    .await;
    prom.expect(
        &format!(
            r#"sum(sandbox_agent_http_requests_total{{{job},route="/v1/acp/{{serverId}}",method="POST"}})"#
        ),
        3.0,
    )
    .await;
    prom.expect(
        &format!(r#"count(sandbox_agent_agent_memory_bytes{{{job},server_id="s1"}} > 0)"#),
        1.0,
    )
    .await;
    // A histogram quantile over the ACP request durations exists (two initialize requests).
    prom.expect(
        &format!(
            r#"sum(sandbox_agent_acp_request_duration_seconds_count{{{job},method="initialize"}})"#
        ),
        2.0,
    )
    .await;
    prom.expect(
        &format!(r#"count(process_resident_memory_bytes{{{job}}} > 0)"#),
        1.0,
    )
    .await;

    // Every query of the shipped Grafana dashboard is valid PromQL and finds series.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/grafana-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            exprs.push(
                t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$job", "sandbox-agent")
                    .replace("$instance", ".*"),
            );
        }
    }
    assert!(exprs.len() >= 16);
    for e in &exprs {
        prom.expect_series(e).await;
    }
}

/// The alert rules of docs/observability.md ("Dashboards and alerts") pass `promtool check rules`.
#[test]
fn documented_alert_rules_are_valid() {
    if !support::on_path("promtool") {
        support::skip("promtool is not installed (.ci/install-metrics.sh)");
        return;
    }
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/observability.md"
    ))
    .unwrap();
    let section = doc
        .split("## Dashboards and alerts")
        .nth(1)
        .expect("the section");
    let rules = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|r| r.split("```").next())
        .expect("a yaml block");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yml");
    std::fs::write(&path, rules).unwrap();
    let out = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Negative control: a broken expression is refused.
    std::fs::write(&path, rules.replacen("> 0", "> > 0", 1)).unwrap();
    let bad = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

/// A request head over the 64 KiB cap is answered 431 by hyper itself; the refusal is counted as
/// `request_head` all the same (it was the one cap the figures missed).
#[tokio::test]
async fn a_request_head_over_the_cap_is_counted_as_a_refusal() {
    use std::io::{Read, Write};
    let d = daemon();
    assert_eq!(
        get(
            &scrape(&d).await,
            "sandbox_agent_refusals_total",
            &[("limit", "request_head")]
        ),
        Some(0.0)
    );
    let addr = d.addr.clone();
    let status = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let big = "a".repeat(100 * 1024);
        let head = format!("GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {big}\r\n\r\n");
        let _ = s.write_all(head.as_bytes());
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        String::from_utf8_lossy(&got)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    })
    .await
    .unwrap();
    assert!(status.contains(" 431 "), "{status:?}");
    eventually_async(Duration::from_secs(10), "the refusal counted", || async {
        let s = scrape(&d).await;
        (get(
            &s,
            "sandbox_agent_refusals_total",
            &[("limit", "request_head")],
        ) == Some(1.0))
        .then_some(())
    })
    .await;
}

/// A PromQL query as a URL query value: every byte but letters and digits percent-encoded.
fn encode_query(promql: &str) -> String {
    promql
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
