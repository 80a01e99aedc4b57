//! In-place reload and the process API's records: an exited record is carried with its exit and
//! its output log (same id, same offsets) and can be read and deleted after the reload; with a
//! state dir, a process carried across a reload keeps writing its record on disk, so a crash
//! after the reload shows its real end and the output it wrote after the reload.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::reload::{create_process, process_log, reload};
use crate::support::{Daemon, eventually, eventually_async};

const SECS20: Duration = Duration::from_secs(20);

/// Waits until process `id` has exited; its record.
async fn wait_exited(d: &Daemon, id: &str) -> Value {
    eventually_async(SECS20, "the process to exit", || async {
        let p = d.get_json(&format!("/v1/processes/{id}")).await;
        (p["status"] == "exited").then_some(p)
    })
    .await
}

/// The record's fields that a reload must not change (the running figures left out).
fn kept_fields(p: &Value) -> Value {
    let mut p = p.clone();
    if let Some(o) = p.as_object_mut() {
        o.remove("stats");
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_process_is_listed_after_a_reload_with_its_exit_and_log_and_can_be_deleted() {
    let mut d = Daemon::start();
    let exited = create_process(&d, "echo out; echo err >&2; exit 3").await;
    let exited_id = exited["id"].as_str().unwrap().to_string();
    let running = create_process(&d, "echo started; exec sleep 1000").await;
    let running_id = running["id"].as_str().unwrap().to_string();
    let running_pid = running["pid"].as_u64().unwrap();

    let before = wait_exited(&d, &exited_id).await;
    assert_eq!(before["exitCode"], 3, "{before}");
    let (entries_before, log_before) = process_log(&d, &exited_id).await;
    let text: Vec<u8> = entries_before.iter().flat_map(|(_, b)| b.clone()).collect();
    assert!(
        text == b"out\nerr\n" || text == b"err\nout\n",
        "{:?}",
        String::from_utf8_lossy(&text)
    );
    eventually_async(SECS20, "the running one's output", || async {
        let (e, _) = process_log(&d, &running_id).await;
        (!e.is_empty()).then_some(())
    })
    .await;

    reload(&mut d);
    // A second reload: the record the new image rebuilt is carried as well.
    reload(&mut d);

    let list = d.get_json("/v1/processes").await;
    let ids: Vec<&str> = list["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert!(
        ids.contains(&exited_id.as_str()) && ids.contains(&running_id.as_str()),
        "{list}"
    );
    let after = d.get_json(&format!("/v1/processes/{exited_id}")).await;
    assert_eq!(after["status"], "exited", "{after}");
    assert_eq!(after["exitCode"], 3, "{after}");
    assert_eq!(kept_fields(&after), kept_fields(&before));
    let (entries_after, log_after) = process_log(&d, &exited_id).await;
    assert_eq!(
        entries_after, entries_before,
        "the same chunks at the same offsets"
    );
    assert_eq!(log_after, log_before);
    // Reading after an offset works on the rebuilt log as it did before.
    let first_end = entries_before[0].0;
    let rest = d
        .get_json(&format!("/v1/processes/{exited_id}/logs?since={first_end}"))
        .await;
    assert_eq!(
        rest["entries"].as_array().map(Vec::len),
        Some(entries_before.len() - 1),
        "{rest}"
    );

    // The running one runs on, the same process.
    let r = d.get_json(&format!("/v1/processes/{running_id}")).await;
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["pid"].as_u64(), Some(running_pid), "{r}");

    // DELETE of the carried exited record works, and it is gone.
    let resp = d
        .client()
        .delete(d.url(&format!("/v1/processes/{exited_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let resp = d
        .client()
        .get(d.url(&format!("/v1/processes/{exited_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // The running one is still a conflict to delete, and stops on request.
    let resp = d
        .client()
        .delete(d.url(&format!("/v1/processes/{running_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let resp = d
        .client()
        .post(d.url(&format!("/v1/processes/{running_id}/kill")))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    wait_exited(&d, &running_id).await;
}

/// With a state dir: a process started before a reload writes more output after it and exits;
/// the daemon is then killed outright and started again on the same state dir. The record on
/// disk has the real exit (not `daemon_restart`) and the output written after the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_state_dir_a_process_carried_across_a_reload_keeps_its_record_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let gate = tmp.path().join("gate");
    let mut d = Daemon::builder()
        .args(crate::durable::state_args(&state))
        .expect_exit(None)
        .start();
    let script = format!(
        "echo before; while [ ! -e '{}' ]; do sleep 0.02; done; echo after; exit 7",
        gate.display()
    );
    let p = create_process(&d, &script).await;
    let id = p["id"].as_str().unwrap().to_string();
    eventually_async(SECS20, "output before the reload", || async {
        let (e, _) = process_log(&d, &id).await;
        (!e.is_empty()).then_some(())
    })
    .await;

    reload(&mut d);
    let carried = d.get_json(&format!("/v1/processes/{id}")).await;
    assert_eq!(carried["status"], "running", "{carried}");
    std::fs::write(&gate, b"").unwrap();
    let ended = wait_exited(&d, &id).await;
    assert_eq!(ended["exitCode"], 7, "{ended}");
    let (entries, _) = process_log(&d, &id).await;

    // The record on disk reaches its end (the state writer runs on its own thread); then a
    // crash: SIGKILL to the daemon (the process has ended already).
    let dir = state.join("processes").join(&id);
    eventually(SECS20, "the exit in the record on disk", || {
        let meta = std::fs::read_to_string(dir.join("meta.json")).ok()?;
        meta.contains("\"code\":7").then_some(())
    });
    let mut child = d.child.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    eventually(SECS20, "the daemon to die", || child.try_wait().unwrap());

    let d2 = Daemon::builder()
        .args(crate::durable::state_args(&state))
        .start();
    let r = d2.get_json(&format!("/v1/processes/{id}")).await;
    assert_eq!(r["status"], "exited", "{r}");
    assert_eq!(r["exitReason"], "exited", "{r}");
    assert_eq!(r["exitCode"], 7, "{r}");
    let (again, _) = process_log(&d2, &id).await;
    assert_eq!(
        again, entries,
        "the output written after the reload is on disk with its offsets"
    );
    let text: Vec<u8> = again.iter().flat_map(|(_, b)| b.clone()).collect();
    assert_eq!(String::from_utf8_lossy(&text), "before\nafter\n");
}
