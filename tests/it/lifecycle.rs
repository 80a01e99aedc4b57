//! The daemon's foundation seen from outside: readiness, auth, errors, config, signals.

use crate::support::Daemon;

#[tokio::test]
async fn root_and_health_answer() {
    let d = Daemon::start();
    let c = d.client();
    let root: serde_json::Value = c
        .get(d.url("/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(root["name"], "Sandbox Agent");
    let health = c.get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({"status":"ok"})
    );
}
