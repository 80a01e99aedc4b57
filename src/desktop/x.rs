//! The operations on a running display, each one short program run to completion in its own
//! process group with a timeout and an output cap (`supervisor::run_capped`): `ffmpeg` for
//! screenshots, `xdotool` for input and windows, `xprop` for the window manager's client list,
//! `xclip` for the clipboard. Long-lived children (a clipboard owner, launched apps) are
//! started by the supervisor and kept by the service, which stops them with the desktop.

use std::ffi::OsString;
use std::time::Duration;

use super::{DesktopError, DesktopService, Display};
use crate::supervisor::{ChildStdio, SpawnSpec, run_capped};

mod windows;

pub use windows::{Window, WindowOp};

const TOOL_TIMEOUT: Duration = Duration::from_secs(10);
/// Screenshots larger than this are refused (a 8192×8192 PNG of noise is ~200 MB).
pub const SCREENSHOT_CAP: usize = 64 << 20;
/// The delay (ms) between the keys of non-ASCII characters (`type_text`): the time a client
/// has to read a key before its scratch binding is undone is half of it.
const UNMAPPED_DELAY_MS: u32 = 80;
/// Non-ASCII characters typed per `xdotool` run (80 × 80 ms stays inside `TOOL_TIMEOUT`).
const UNMAPPED_CHUNK: usize = 80;
/// Text typed or put on the clipboard at once.
pub const TEXT_CAP: usize = 64 << 10;

impl DesktopService {
    /// Runs `tool` on display `d` and returns its stdout; a non-zero exit is 502 with its stderr.
    pub(super) async fn run(
        &self,
        d: &Display,
        tool: &'static str,
        args: &[String],
        cap: usize,
    ) -> Result<(Vec<u8>, String), DesktopError> {
        let path = self.tool(tool)?;
        let mut cmd = tokio::process::Command::new(path);
        cmd.args(args)
            .env_clear()
            .envs(d.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.cwd());
        let out = run_capped(cmd, TOOL_TIMEOUT, cap)
            .await
            .map_err(|e| DesktopError::Failed(e.to_string()))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(DesktopError::Failed(format!(
                "{tool} failed ({}): {}",
                out.status,
                stderr.trim()
            )));
        }
        Ok((out.stdout, stderr))
    }

    async fn xdotool(&self, d: &Display, args: &[String]) -> Result<String, DesktopError> {
        let (out, err) = self.run(d, "xdotool", args, 1 << 20).await?;
        if let Some(line) = err.lines().find(|l| l.contains("No such key name")) {
            return Err(DesktopError::invalid("key", line.trim().to_string()));
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    Webp,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Png => "image/png",
            Format::Jpeg => "image/jpeg",
            Format::Webp => "image/webp",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Shot {
    pub format: Format,
    /// 1..=100, for JPEG and WebP.
    pub quality: Option<u32>,
    /// 0 < scale <= 1.
    pub scale: Option<f32>,
    pub show_cursor: bool,
    /// x, y, width, height.
    pub region: Option<(i64, i64, i64, i64)>,
}

/// Checks that a point lies on the screen.
pub fn on_screen(d: &Display, x: i64, y: i64) -> Result<(), DesktopError> {
    if x < 0 || x >= i64::from(d.screen.width) {
        return Err(DesktopError::invalid(
            "x",
            format!("{x} is outside 0..{}", d.screen.width),
        ));
    }
    if y < 0 || y >= i64::from(d.screen.height) {
        return Err(DesktopError::invalid(
            "y",
            format!("{y} is outside 0..{}", d.screen.height),
        ));
    }
    Ok(())
}

impl DesktopService {
    pub async fn screenshot(&self, shot: Shot) -> Result<Vec<u8>, DesktopError> {
        let d = self.display()?;
        let (x, y, w, h) = match shot.region {
            None => (0, 0, i64::from(d.screen.width), i64::from(d.screen.height)),
            Some((x, y, w, h)) => {
                on_screen(&d, x, y)?;
                if w < 1 || x + w > i64::from(d.screen.width) {
                    return Err(DesktopError::invalid(
                        "width",
                        format!(
                            "the region {w} wide at x={x} runs off the {}-pixel-wide screen",
                            d.screen.width
                        ),
                    ));
                }
                if h < 1 || y + h > i64::from(d.screen.height) {
                    return Err(DesktopError::invalid(
                        "height",
                        format!(
                            "the region {h} high at y={y} runs off the {}-pixel-high screen",
                            d.screen.height
                        ),
                    ));
                }
                (x, y, w, h)
            }
        };
        if let Some(q) = shot.quality
            && !(1..=100).contains(&q)
        {
            return Err(DesktopError::invalid(
                "quality",
                format!("{q} is outside 1..=100"),
            ));
        }
        let mut args: Vec<String> = [
            "-hide_banner",
            "-loglevel",
            "error",
            "-nostdin",
            "-f",
            "x11grab",
            "-draw_mouse",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(if shot.show_cursor { "1" } else { "0" }.into());
        args.extend([
            "-video_size".into(),
            format!("{w}x{h}"),
            "-i".into(),
            format!("{}+{x},{y}", d.name()),
            "-frames:v".into(),
            "1".into(),
        ]);
        if let Some(s) = shot.scale {
            if !(s > 0.0 && s <= 1.0) {
                return Err(DesktopError::invalid(
                    "scale",
                    format!("{s} is outside (0, 1]"),
                ));
            }
            let sw = ((w as f32 * s).round() as i64).max(1);
            let sh = ((h as f32 * s).round() as i64).max(1);
            args.extend(["-vf".into(), format!("scale={sw}:{sh}")]);
        }
        let q = shot.quality.unwrap_or(85);
        match shot.format {
            Format::Png => args.extend(["-c:v".into(), "png".into()]),
            Format::Jpeg => {
                // mjpeg's scale: 2 (best) ..= 31 (worst).
                let qv = 2 + (100 - q.min(100)) * 29 / 99;
                args.extend([
                    "-c:v".into(),
                    "mjpeg".into(),
                    "-pix_fmt".into(),
                    "yuvj444p".into(),
                    "-q:v".into(),
                    qv.to_string(),
                ]);
            }
            Format::Webp => args.extend([
                "-c:v".into(),
                "libwebp".into(),
                "-quality".into(),
                q.to_string(),
            ]),
        }
        args.extend(["-f".into(), "image2pipe".into(), "pipe:1".into()]);
        let (out, _) = self.run(&d, "ffmpeg", &args, SCREENSHOT_CAP).await?;
        if out.is_empty() {
            return Err(DesktopError::Failed("ffmpeg wrote no image".into()));
        }
        Ok(out)
    }

    pub async fn mouse_position(&self) -> Result<MousePosition, DesktopError> {
        let d = self.display()?;
        self.position(&d).await
    }

    async fn position(&self, d: &Display) -> Result<MousePosition, DesktopError> {
        let out = self
            .xdotool(d, &["getmouselocation".into(), "--shell".into()])
            .await?;
        let v = shell_vars(&out);
        Ok(MousePosition {
            x: v.get("X").and_then(|s| s.parse().ok()).unwrap_or(0),
            y: v.get("Y").and_then(|s| s.parse().ok()).unwrap_or(0),
            screen: v.get("SCREEN").and_then(|s| s.parse().ok()),
            window: v.get("WINDOW").cloned(),
        })
    }

    /// Runs one xdotool command chain, then reads the pointer back.
    pub async fn mouse(&self, action: MouseAction) -> Result<MousePosition, DesktopError> {
        let d = self.display()?;
        let mut args: Vec<String> = Vec::new();
        let mv = |args: &mut Vec<String>, x: i64, y: i64| -> Result<(), DesktopError> {
            on_screen(&d, x, y)?;
            args.extend(["mousemove".into(), x.to_string(), y.to_string()]);
            Ok(())
        };
        match action {
            MouseAction::Move { x, y } => mv(&mut args, x, y)?,
            MouseAction::Click {
                x,
                y,
                button,
                count,
            } => {
                if !(1..=10).contains(&count) {
                    return Err(DesktopError::invalid(
                        "clickCount",
                        format!("{count} is outside 1..=10"),
                    ));
                }
                mv(&mut args, x, y)?;
                args.extend([
                    "click".into(),
                    "--repeat".into(),
                    count.to_string(),
                    button.to_string(),
                ]);
            }
            MouseAction::Down { at, button } | MouseAction::Up { at, button } => {
                let verb = if matches!(action, MouseAction::Down { .. }) {
                    "mousedown"
                } else {
                    "mouseup"
                };
                if let Some((x, y)) = at {
                    mv(&mut args, x, y)?;
                }
                args.extend([verb.into(), button.to_string()]);
            }
            MouseAction::Drag { from, to, button } => {
                mv(&mut args, from.0, from.1)?;
                args.extend(["mousedown".into(), button.to_string()]);
                on_screen(&d, to.0, to.1)?;
                args.extend([
                    "mousemove".into(),
                    to.0.to_string(),
                    to.1.to_string(),
                    "mouseup".into(),
                    button.to_string(),
                ]);
            }
            MouseAction::Scroll { x, y, dx, dy } => {
                mv(&mut args, x, y)?;
                for (delta, field, neg, pos) in [(dy, "deltaY", 4, 5), (dx, "deltaX", 6, 7)] {
                    if delta.abs() > 100 {
                        return Err(DesktopError::invalid(
                            field,
                            format!("{delta} is outside -100..=100"),
                        ));
                    }
                    if delta != 0 {
                        let b = if delta < 0 { neg } else { pos };
                        args.extend([
                            "click".into(),
                            "--repeat".into(),
                            delta.abs().to_string(),
                            b.to_string(),
                        ]);
                    }
                }
            }
        }
        if !args.is_empty() {
            self.xdotool(&d, &args).await?;
        }
        self.position(&d).await
    }

    pub async fn type_text(&self, text: &str, delay_ms: Option<u32>) -> Result<(), DesktopError> {
        let d = self.display()?;
        if text.len() > TEXT_CAP {
            return Err(DesktopError::invalid(
                "text",
                format!("longer than {TEXT_CAP} bytes"),
            ));
        }
        let delay = delay_ms.unwrap_or(12);
        if delay > 1000 {
            return Err(DesktopError::invalid(
                "delayMs",
                format!("{delay} is outside 0..=1000"),
            ));
        }
        if text.is_empty() {
            return Ok(());
        }
        // A character the keyboard map lacks is typed by binding a scratch keycode, pressing it,
        // waiting half the delay and unbinding it: a client that reads the event only after the
        // unbinding (a loaded machine) drops the character. Such characters get a longer delay,
        // in chunks that each stay well inside the tool's timeout.
        for (run, ascii) in runs(text) {
            let (delay, chunk) = if ascii {
                (delay, usize::MAX)
            } else {
                (delay.max(UNMAPPED_DELAY_MS), UNMAPPED_CHUNK)
            };
            let chars: Vec<char> = run.chars().collect();
            for part in chars.chunks(chunk.min(chars.len()).max(1)) {
                let part: String = part.iter().collect();
                self.xdotool(
                    &d,
                    &[
                        "type".into(),
                        "--delay".into(),
                        delay.to_string(),
                        "--".into(),
                        part,
                    ],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// `verb` is `key`, `keydown` or `keyup`; `key` is an X keysym name, or `+`-joined names.
    pub async fn key(&self, verb: &str, key: &str, mods: &[&str]) -> Result<(), DesktopError> {
        let d = self.display()?;
        check_key(key)?;
        let mut chord: Vec<&str> = mods.to_vec();
        chord.push(key);
        self.xdotool(&d, &[verb.into(), "--".into(), chord.join("+")])
            .await
            .map(|_| ())
    }
}

/// A key name: X keysym names joined by `+` (`ctrl+c`), each letters, digits and `_`, or one
/// character.
pub fn check_key(key: &str) -> Result<(), DesktopError> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key.split('+').all(|p| {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                || p.chars().count() == 1
        });
    if ok && !key.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(DesktopError::invalid(
            "key",
            format!("{key:?} is not an X key name (e.g. Return, a, ctrl+c, F5)"),
        ))
    }
}

#[derive(Debug, Clone)]
pub struct MousePosition {
    pub x: i64,
    pub y: i64,
    pub screen: Option<i64>,
    pub window: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub enum MouseAction {
    Move {
        x: i64,
        y: i64,
    },
    Click {
        x: i64,
        y: i64,
        button: u8,
        count: i64,
    },
    Down {
        at: Option<(i64, i64)>,
        button: u8,
    },
    Up {
        at: Option<(i64, i64)>,
        button: u8,
    },
    Drag {
        from: (i64, i64),
        to: (i64, i64),
        button: u8,
    },
    Scroll {
        x: i64,
        y: i64,
        dx: i64,
        dy: i64,
    },
}

fn shell_vars(out: &str) -> std::collections::HashMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `clipboard`, `primary` or `secondary`.
pub fn check_selection(s: Option<&str>) -> Result<&'static str, DesktopError> {
    match s.unwrap_or("clipboard") {
        "clipboard" => Ok("clipboard"),
        "primary" => Ok("primary"),
        "secondary" => Ok("secondary"),
        other => Err(DesktopError::invalid(
            "selection",
            format!("{other:?} is not clipboard, primary or secondary"),
        )),
    }
}

impl DesktopService {
    pub async fn clipboard_get(&self, selection: &'static str) -> Result<String, DesktopError> {
        let d = self.display()?;
        match self
            .run(
                &d,
                "xclip",
                &["-o".into(), "-selection".into(), selection.into()],
                TEXT_CAP * 16,
            )
            .await
        {
            Ok((out, _)) => Ok(String::from_utf8_lossy(&out).into_owned()),
            // Nothing owns the selection (or it holds no text): empty.
            Err(DesktopError::Failed(m)) if m.contains("not available") => Ok(String::new()),
            Err(e) => Err(e),
        }
    }

    /// Puts `text` on the selection: an `xclip -quiet` child owns it (in the foreground, its
    /// output discarded, so nothing of it holds the request), kept until the next set or the
    /// desktop's stop; answered once a read gives the text back.
    pub async fn clipboard_set(
        &self,
        selection: &'static str,
        text: &str,
    ) -> Result<(), DesktopError> {
        let d = self.display()?;
        if text.len() > TEXT_CAP {
            return Err(DesktopError::invalid(
                "text",
                format!("longer than {TEXT_CAP} bytes"),
            ));
        }
        let xclip = self.tool("xclip")?;
        let name = format!("xclip-{selection}");
        self.drop_extra(&name).await;
        let spawned = self
            .supervisor()
            .start_with(
                SpawnSpec {
                    program: xclip,
                    args: ["-quiet", "-selection", selection, "-i"]
                        .iter()
                        .map(OsString::from)
                        .collect(),
                    env: vec![("DISPLAY".into(), d.name().into())],
                    cwd: self.cwd().to_path_buf(),
                    name: name.clone(),
                    agent: "desktop:xclip".into(),
                },
                ChildStdio::AllPipes,
            )
            .await
            .map_err(|e| DesktopError::Failed(e.to_string()))?;
        if let Some(o) = spawned.stdout {
            super::discard(o);
        }
        if let Some(e) = spawned.stderr {
            super::discard(e);
        }
        let handle = spawned.handle;
        if let Some(mut stdin) = spawned.stdin {
            use tokio::io::AsyncWriteExt as _;
            let wrote = tokio::time::timeout(TOOL_TIMEOUT, stdin.write_all(text.as_bytes())).await;
            if !matches!(wrote, Ok(Ok(()))) {
                handle.kill().await;
                return Err(DesktopError::Failed("cannot hand the text to xclip".into()));
            }
        }
        self.adopt(name, handle.clone())?;
        for _ in 0..100 {
            if handle.exit().is_some() {
                return Err(DesktopError::Failed(format!(
                    "xclip ended: {}",
                    handle.stderr_excerpt(500)
                )));
            }
            if self.clipboard_get(selection).await? == text {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(DesktopError::Failed(
            "the selection did not take the text within 2 s".into(),
        ))
    }

    /// Starts `app` (a name found in `PATH`, or an absolute path) on the display; with `wait`,
    /// waits up to 10 s for a window of its process.
    pub async fn launch(
        &self,
        app: &str,
        args: &[String],
        wait: bool,
    ) -> Result<(String, u32, Option<String>), DesktopError> {
        let d = self.display()?;
        let program = if app.starts_with('/') {
            Some(std::path::PathBuf::from(app)).filter(|p| p.is_file())
        } else if app.is_empty() || app.contains('/') {
            None
        } else {
            super::which(&d.env, app)
        }
        .ok_or_else(|| DesktopError::NotFound(format!("no program {app:?} in PATH")))?;
        if args.len() > 256 || args.iter().map(String::len).sum::<usize>() > TEXT_CAP {
            return Err(DesktopError::invalid(
                "args",
                "at most 256 arguments, 64 KiB in all",
            ));
        }
        let id = self.next_id("desktop-app");
        let what = app.rsplit('/').next().unwrap_or(app).to_string();
        let handle = self
            .spawn(
                program,
                args.iter().map(OsString::from).collect(),
                &d.name(),
                id.clone(),
                &what,
            )
            .await?;
        let pid = handle.pid();
        self.adopt(id.clone(), handle.clone())?;
        let mut window = None;
        if wait {
            for _ in 0..100 {
                let (ids, _) = self.client_list(&d).await?;
                let (out, _) = self
                    .run(
                        &d,
                        "xdotool",
                        &["search".into(), "--pid".into(), pid.to_string()],
                        1 << 16,
                    )
                    .await
                    .unwrap_or_default();
                let mine: Vec<u64> = String::from_utf8_lossy(&out)
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect();
                if let Some(w) = ids.iter().find(|i| mine.contains(i)) {
                    window = Some(w.to_string());
                    break;
                }
                if handle.exit().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok((id, pid, window))
    }
}

/// `text` cut into runs of ASCII and of non-ASCII characters, in order, each with whether it is
/// ASCII.
fn runs(text: &str) -> Vec<(&str, bool)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut ascii = None;
    for (i, c) in text.char_indices() {
        let a = c.is_ascii();
        if ascii.is_some_and(|x| x != a) {
            out.push((&text[start..i], ascii.unwrap_or(true)));
            start = i;
        }
        ascii = Some(a);
    }
    if start < text.len() {
        out.push((&text[start..], ascii.unwrap_or(true)));
    }
    out
}

#[cfg(test)]
mod runs_tests {
    #[test]
    fn text_is_cut_into_ascii_and_other_runs() {
        assert_eq!(
            super::runs("héllo wörld"),
            vec![
                ("h", true),
                ("é", false),
                ("llo w", true),
                ("ö", false),
                ("rld", true)
            ]
        );
        assert_eq!(super::runs("ñú"), vec![("ñú", false)]);
        assert_eq!(super::runs("ab"), vec![("ab", true)]);
    }
}
