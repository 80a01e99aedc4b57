//! Screen recordings: one `ffmpeg -f x11grab` child at a time (H.264 in MP4), bounded by
//! [`MAX_SECONDS`] and [`MAX_BYTES`] (ffmpeg's own `-t` and `-fs`, so it ends by itself at a
//! cap), at most [`MAX_KEPT`] kept in `<data dir>/desktop-recordings/`, removed on DELETE.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use super::{DesktopError, DesktopService};
use crate::supervisor::ChildHandle;

pub const MAX_SECONDS: u64 = 3600;
pub const MAX_BYTES: u64 = 1 << 30;
pub const MAX_KEPT: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecStatus {
    Recording,
    Completed,
    Failed,
}

impl RecStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RecStatus::Recording => "recording",
            RecStatus::Completed => "completed",
            RecStatus::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Recording {
    pub id: String,
    pub file_name: String,
    pub path: PathBuf,
    pub started_at: SystemTime,
    pub ended_at: Option<SystemTime>,
    pub status: RecStatus,
    pub bytes: u64,
}

struct Inner {
    list: Vec<Recording>,
    active: Option<(String, ChildHandle)>,
}

pub struct Recordings {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl Recordings {
    pub fn new(dir: PathBuf) -> Self {
        Recordings {
            dir,
            inner: Mutex::new(Inner {
                list: Vec::new(),
                active: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sys::lock(&self.inner)
    }

    /// Marks an active recording whose ffmpeg ended (a cap reached) as finished.
    fn settle(inner: &mut Inner) {
        if let Some((id, h)) = &inner.active
            && let Some(exit) = h.exit()
        {
            let id = id.clone();
            inner.active = None;
            if let Some(r) = inner.list.iter_mut().find(|r| r.id == id) {
                r.ended_at = Some(SystemTime::now());
                r.bytes = std::fs::metadata(&r.path).map(|m| m.len()).unwrap_or(0);
                // ffmpeg answers SIGINT with 255 after writing the file out.
                r.status = if r.bytes > 0 && matches!(exit.code, Some(0) | Some(255)) {
                    RecStatus::Completed
                } else {
                    RecStatus::Failed
                };
            }
        }
    }

    pub fn list(&self) -> Vec<Recording> {
        let mut inner = self.lock();
        Self::settle(&mut inner);
        let active = inner.active.as_ref().map(|(id, _)| id.clone());
        inner
            .list
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if Some(&r.id) == active.as_ref() {
                    r.bytes = std::fs::metadata(&r.path).map(|m| m.len()).unwrap_or(0);
                }
                r
            })
            .collect()
    }

    pub fn get(&self, id: &str) -> Result<Recording, DesktopError> {
        self.list()
            .into_iter()
            .find(|r| r.id == id)
            .ok_or_else(|| DesktopError::NotFound(format!("no recording {id:?}")))
    }

    /// Stops the active recording (SIGINT: ffmpeg finishes the file), if any.
    pub async fn stop_active(&self) -> Option<Recording> {
        let (id, h) = self.lock().active.clone()?;
        h.signal_group(Signal::SIGINT);
        if tokio::time::timeout(Duration::from_secs(10), h.wait())
            .await
            .is_err()
        {
            h.kill().await;
        }
        let mut inner = self.lock();
        Self::settle(&mut inner);
        inner.list.iter().find(|r| r.id == id).cloned()
    }

    /// Removes a recording that is not being recorded, and its file.
    pub async fn delete(&self, id: &str) -> Result<(), DesktopError> {
        let path = {
            let mut inner = self.lock();
            Self::settle(&mut inner);
            if inner.active.as_ref().is_some_and(|(a, _)| a == id) {
                return Err(DesktopError::Conflict(
                    "the recording is still running; stop it first".into(),
                ));
            }
            let i = inner
                .list
                .iter()
                .position(|r| r.id == id)
                .ok_or_else(|| DesktopError::NotFound(format!("no recording {id:?}")))?;
            inner.list.remove(i).path
        };
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(DesktopError::Failed(format!("cannot remove the file: {e}"))),
        }
    }
}

impl DesktopService {
    pub async fn start_recording(&self, fps: Option<u32>) -> Result<Recording, DesktopError> {
        let d = self.display()?;
        let fps = fps.unwrap_or(30);
        if !(1..=60).contains(&fps) {
            return Err(DesktopError::invalid(
                "fps",
                format!("{fps} is outside 1..=60"),
            ));
        }
        let ffmpeg = self.tool("ffmpeg")?;
        let recs = &self.recordings;
        {
            let mut inner = recs.lock();
            Recordings::settle(&mut inner);
            if inner.active.is_some() {
                return Err(DesktopError::Conflict(
                    "a recording is already running".into(),
                ));
            }
            if inner.list.len() >= MAX_KEPT {
                return Err(DesktopError::Conflict(format!(
                    "{MAX_KEPT} recordings are kept; delete one first"
                )));
            }
        }
        let dir = recs.dir.clone();
        crate::sys::blocking(move || {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
        })
        .await
        .map_err(|e| DesktopError::Failed(format!("cannot create {}: {e}", recs.dir.display())))?;
        let id = self.next_id("rec");
        let file_name = format!("{id}.mp4");
        let path = recs.dir.join(&file_name);
        let args: Vec<String> = vec![
            "-hide_banner".into(),
            "-loglevel".into(),
            "error".into(),
            "-nostdin".into(),
            "-y".into(),
            "-f".into(),
            "x11grab".into(),
            "-framerate".into(),
            fps.to_string(),
            "-video_size".into(),
            format!("{}x{}", d.screen.width, d.screen.height),
            "-i".into(),
            d.name(),
            "-t".into(),
            MAX_SECONDS.to_string(),
            "-fs".into(),
            MAX_BYTES.to_string(),
            "-vf".into(),
            "scale=trunc(iw/2)*2:trunc(ih/2)*2".into(),
            "-c:v".into(),
            "libx264".into(),
            "-preset".into(),
            "ultrafast".into(),
            "-tune".into(),
            "zerolatency".into(),
            "-pix_fmt".into(),
            "yuv420p".into(),
            // A keyframe each second, and a fragment written at each: the file grows as it
            // records (a plain MP4 holds everything until the end) and what a crash leaves
            // still plays.
            "-g".into(),
            fps.to_string(),
            "-movflags".into(),
            "+frag_keyframe+empty_moov+default_base_moof".into(),
            path.to_string_lossy().into_owned(),
        ];
        let handle = self
            .spawn(
                ffmpeg,
                args.into_iter().map(OsString::from).collect(),
                &d.name(),
                id.clone(),
                "ffmpeg",
            )
            .await?;
        let rec = Recording {
            id: id.clone(),
            file_name,
            path,
            started_at: SystemTime::now(),
            ended_at: None,
            status: RecStatus::Recording,
            bytes: 0,
        };
        let mut inner = recs.lock();
        inner.list.push(rec.clone());
        inner.active = Some((id, handle));
        Ok(rec)
    }

    pub async fn stop_recording(&self) -> Result<Recording, DesktopError> {
        self.recordings
            .stop_active()
            .await
            .ok_or_else(|| DesktopError::Conflict("no recording is running".into()))
    }
}
