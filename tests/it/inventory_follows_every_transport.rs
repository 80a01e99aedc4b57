//! The session inventory (`GET /v1/sessions`) lists the sessions made over the WebSocket face
//! and over the RFD transport like those made by POST: their answers reach the agent's event
//! stream rather than a waiting POST, and the inventory reads them there.

use serde_json::{Value, json};

use crate::transports::{
    Stream, connect, daemon, prompt, request, rfd_initialize, rfd_post, send, until_response,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_over_the_websocket_is_listed() {
    let d = daemon(&[]);
    let mut ws = connect(&d, "/v1/acp/over-ws?agent=mock").await;
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    until_response(&mut ws, &json!(0)).await;
    send(
        &mut ws,
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/tmp", "mcpServers": []}),
        ),
    )
    .await;
    let new = until_response(&mut ws, &json!(1)).await;
    let session = new.last().unwrap()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    send(
        &mut ws,
        &prompt(json!(2), &session, "/title Over the socket"),
    )
    .await;
    until_response(&mut ws, &json!(2)).await;
    let listed = d.get_json("/v1/sessions?serverId=over-ws").await;
    let s: &Value = &listed["sessions"][0];
    assert_eq!(s["sessionId"], session.as_str(), "{listed}");
    assert_eq!(s["agent"], "mock");
    assert_eq!(s["cwd"], "/tmp");
    assert_eq!(s["title"], "Over the socket");
    assert_eq!(s["state"], "live");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_over_the_rfd_transport_is_listed() {
    let d = daemon(&[]);
    let conn = rfd_initialize(&d).await;
    let mut main = Stream::open(&d, &conn, None).await.unwrap();
    let h = [("acp-connection-id", conn.as_str())];
    let a = rfd_post(
        &d,
        &h,
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/tmp", "mcpServers": []}),
        )
        .to_string(),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text);
    let new = main.next().await.unwrap();
    assert_eq!(new["id"], 1, "{new}");
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    let server = format!("acp-conn-{conn}");
    let listed = crate::support::eventually_async(
        std::time::Duration::from_secs(10),
        "the RFD session in the inventory",
        || {
            let (d, server) = (&d, &server);
            async move {
                let l = d.get_json(&format!("/v1/sessions?serverId={server}")).await;
                (l["sessions"].as_array()?.len() == 1).then_some(l)
            }
        },
    )
    .await;
    let s = &listed["sessions"][0];
    assert_eq!(s["sessionId"], session.as_str(), "{listed}");
    assert_eq!(s["agent"], "mock");
    assert_eq!(s["cwd"], "/tmp");
}
