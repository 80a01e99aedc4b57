//! The window operations: the window manager's client list (`xprop`), each window's title and
//! geometry, and focus, move and resize (`xdotool`).

use super::*;

#[derive(Debug, Clone)]
pub struct Window {
    pub id: String,
    pub title: String,
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
    pub active: bool,
}

/// A window id as the API spells it: decimal, or `0x` hex.
fn parse_window_id(id: &str) -> Result<u64, DesktopError> {
    let n = match id.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => id.parse().ok(),
    };
    n.filter(|n| *n > 0 && *n <= u64::from(u32::MAX))
        .ok_or_else(|| DesktopError::NotFound(format!("no window {id:?}")))
}

impl DesktopService {
    /// The window manager's client windows (`_NET_CLIENT_LIST`), with their titles and
    /// geometry.
    pub async fn windows(&self) -> Result<Vec<Window>, DesktopError> {
        let d = self.display()?;
        let (ids, active) = self.client_list(&d).await?;
        let mut out = Vec::new();
        for id in ids {
            if let Ok(w) = self.window_info(&d, id, active).await {
                out.push(w);
            }
        }
        Ok(out)
    }

    pub(super) async fn client_list(
        &self,
        d: &Display,
    ) -> Result<(Vec<u64>, Option<u64>), DesktopError> {
        let (out, _) = self
            .run(
                d,
                "xprop",
                &[
                    "-root".into(),
                    "-notype".into(),
                    "_NET_CLIENT_LIST".into(),
                    "_NET_ACTIVE_WINDOW".into(),
                ],
                1 << 20,
            )
            .await?;
        let text = String::from_utf8_lossy(&out);
        let ids_of = |prefix: &str| -> Vec<u64> {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .map(|l| {
                    l.split(['#', ','])
                        .skip(1)
                        .filter_map(|s| {
                            u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
                        })
                        .filter(|n| *n != 0)
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok((
            ids_of("_NET_CLIENT_LIST:"),
            ids_of("_NET_ACTIVE_WINDOW:").first().copied(),
        ))
    }

    async fn window_info(
        &self,
        d: &Display,
        id: u64,
        active: Option<u64>,
    ) -> Result<Window, DesktopError> {
        let sid = id.to_string();
        let geo = self
            .xdotool(
                d,
                &["getwindowgeometry".into(), "--shell".into(), sid.clone()],
            )
            .await
            .map_err(|_| DesktopError::NotFound(format!("no window {sid}")))?;
        let v = shell_vars(&geo);
        let title = self
            .xdotool(d, &["getwindowname".into(), sid.clone()])
            .await
            .unwrap_or_default();
        let num = |k: &str| v.get(k).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok(Window {
            id: sid,
            title: title.trim_end_matches('\n').to_string(),
            x: num("X"),
            y: num("Y"),
            width: num("WIDTH"),
            height: num("HEIGHT"),
            active: active == Some(id),
        })
    }

    pub async fn focused_window(&self) -> Result<Window, DesktopError> {
        let d = self.display()?;
        let (_, active) = self.client_list(&d).await?;
        let id = active.ok_or_else(|| DesktopError::NotFound("no window has the focus".into()))?;
        self.window_info(&d, id, Some(id)).await
    }

    /// Focuses, moves or resizes a managed window and reads it back.
    pub async fn window_op(&self, id: &str, op: WindowOp) -> Result<Window, DesktopError> {
        let d = self.display()?;
        let n = parse_window_id(id)?;
        let (ids, _) = self.client_list(&d).await?;
        if !ids.contains(&n) {
            return Err(DesktopError::NotFound(format!("no window {id:?}")));
        }
        let sid = n.to_string();
        let args: Vec<String> = match op {
            WindowOp::Focus => vec!["windowactivate".into(), "--sync".into(), sid],
            WindowOp::Move { x, y } => {
                let lim = 4 * i64::from(crate::desktop::MAX_SIDE);
                if x.abs() > lim || y.abs() > lim {
                    return Err(DesktopError::invalid(
                        "x",
                        format!("x and y must be within ±{lim}"),
                    ));
                }
                vec![
                    "windowmove".into(),
                    "--sync".into(),
                    sid,
                    x.to_string(),
                    y.to_string(),
                ]
            }
            WindowOp::Resize { width, height } => {
                for (f, v) in [("width", width), ("height", height)] {
                    if !(1..=i64::from(crate::desktop::MAX_SIDE)).contains(&v) {
                        return Err(DesktopError::invalid(
                            f,
                            format!("{v} is outside 1..={}", crate::desktop::MAX_SIDE),
                        ));
                    }
                }
                vec![
                    "windowsize".into(),
                    "--sync".into(),
                    sid,
                    width.to_string(),
                    height.to_string(),
                ]
            }
        };
        self.xdotool(&d, &args).await?;
        let (_, active) = self.client_list(&d).await?;
        self.window_info(&d, n, active).await
    }
}

#[derive(Debug, Clone, Copy)]
pub enum WindowOp {
    Focus,
    Move { x: i64, y: i64 },
    Resize { width: i64, height: i64 },
}
