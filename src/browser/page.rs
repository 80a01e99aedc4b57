//! Operations on a page: navigation (with a wait), screenshots, the page's text and markdown
//! (computed in the page by a bounded, iterative walk of the DOM), and the accessibility
//! snapshot (`Accessibility.getFullAXTree`, made into a compact preorder list with the depth of
//! each node, built with an explicit stack and capped in nodes and depth).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::cdp::{Session, Tab};
use super::{BrowserError, Endpoint};

/// Longest URL accepted.
pub const MAX_URL: usize = 8192;
/// Largest screenshot returned (bytes of the image).
pub const MAX_SCREENSHOT: usize = 16 << 20;
/// Tallest (and widest) full-page capture in CSS pixels; a longer page is cut there.
pub const MAX_FULL_PAGE_SIDE: f64 = 16_384.0;
/// Most characters of text or markdown returned (the rest is cut, `truncated: true`).
pub const MAX_TEXT: usize = 2_000_000;
/// Most nodes and deepest level of an accessibility snapshot.
pub const MAX_AX_NODES: usize = 5000;
pub const MAX_AX_DEPTH: usize = 64;

/// Checks a URL to open: `http`, `https`, `about:` and `data:` only (`file:`, `javascript:`,
/// `chrome:` and the rest are refused: the daemon's file API is the way to files, and a browser
/// URL must not run script or reach the browser's internal pages).
pub fn check_url(url: &str) -> Result<(), BrowserError> {
    if url.len() > MAX_URL {
        return Err(BrowserError::invalid(
            "url",
            format!("longer than {MAX_URL} bytes"),
        ));
    }
    let parsed =
        reqwest::Url::parse(url).map_err(|e| BrowserError::invalid("url", e.to_string()))?;
    match parsed.scheme() {
        "http" | "https" if parsed.host_str().is_some() => Ok(()),
        "about" | "data" => Ok(()),
        s => Err(BrowserError::invalid(
            "url",
            format!("scheme {s:?} is not allowed (http, https, about, data)"),
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitUntil {
    /// Answer once the navigation was committed.
    Commit,
    DomContentLoaded,
    Load,
}

/// Navigates `tab` to `url` and waits up to `timeout` for `wait`.
pub async fn navigate(
    ep: &Endpoint,
    tab: &Tab,
    url: &str,
    wait: WaitUntil,
    timeout: Duration,
) -> Result<Tab, BrowserError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut s = Session::connect(ep, &tab.id).await?;
    let r = s
        .call("Page.navigate", json!({"url": url}), timeout)
        .await?;
    if let Some(err) = r.get("errorText").and_then(Value::as_str) {
        s.close().await;
        return Err(BrowserError::Failed(format!(
            "navigation to {url} failed: {err}"
        )));
    }
    let want = match wait {
        WaitUntil::Commit => None,
        WaitUntil::DomContentLoaded => Some(["interactive", "complete"].as_slice()),
        WaitUntil::Load => Some(["complete"].as_slice()),
    };
    if let Some(want) = want {
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                s.close().await;
                return Err(BrowserError::Timeout(format!(
                    "{url} did not finish loading in {} ms",
                    timeout.as_millis()
                )));
            }
            let state = eval(&mut s, "document.readyState", left).await?;
            if state.as_str().is_some_and(|st| want.contains(&st)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let info = eval(
        &mut s,
        "JSON.stringify([location.href, document.title])",
        Duration::from_secs(5),
    )
    .await?;
    s.close().await;
    let pair: Vec<String> = info
        .as_str()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    Ok(Tab {
        id: tab.id.clone(),
        url: pair.first().cloned().unwrap_or_default(),
        title: pair.get(1).cloned().unwrap_or_default(),
    })
}

/// Evaluates `expr` in the page and returns its value (by value).
async fn eval(s: &mut Session, expr: &str, timeout: Duration) -> Result<Value, BrowserError> {
    let r = s
        .call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
            timeout,
        )
        .await?;
    if let Some(ex) = r.get("exceptionDetails") {
        let text = ex
            .pointer("/exception/description")
            .or_else(|| ex.get("text"))
            .and_then(Value::as_str)
            .unwrap_or("exception");
        return Err(BrowserError::Failed(format!("the page threw: {text}")));
    }
    Ok(r.pointer("/result/value").cloned().unwrap_or(Value::Null))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
}

/// A screenshot of the tab's viewport, or with `full_page` of the whole document (its content
/// size from `Page.getLayoutMetrics`, captured beyond the viewport, each side cut at
/// `MAX_FULL_PAGE_SIDE`).
pub async fn screenshot(
    ep: &Endpoint,
    tab: &Tab,
    format: ImageFormat,
    quality: Option<u32>,
    full_page: bool,
) -> Result<Vec<u8>, BrowserError> {
    let mut s = Session::connect(ep, &tab.id).await?;
    let r = capture(&mut s, format, quality, full_page).await;
    s.close().await;
    let data = r?
        .get("data")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| BrowserError::Failed("Page.captureScreenshot returned no data".into()))?;
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| BrowserError::Failed(format!("screenshot data: {e}")))?;
    if bytes.len() > MAX_SCREENSHOT {
        return Err(BrowserError::Failed(format!(
            "the screenshot is larger than {MAX_SCREENSHOT} bytes"
        )));
    }
    Ok(bytes)
}

async fn capture(
    s: &mut Session,
    format: ImageFormat,
    quality: Option<u32>,
    full_page: bool,
) -> Result<Value, BrowserError> {
    let mut params =
        json!({"format": match format { ImageFormat::Png => "png", ImageFormat::Jpeg => "jpeg" }});
    if let (ImageFormat::Jpeg, Some(q)) = (format, quality) {
        params["quality"] = json!(q);
    }
    if full_page {
        let m = s
            .call("Page.getLayoutMetrics", json!({}), Duration::from_secs(10))
            .await?;
        let size = m.get("cssContentSize").or_else(|| m.get("contentSize"));
        let side = |k: &str| {
            size.and_then(|v| v.get(k))
                .and_then(Value::as_f64)
                .filter(|v| v.is_finite() && *v >= 1.0)
                .map(|v| v.ceil().min(MAX_FULL_PAGE_SIDE))
                .ok_or_else(|| {
                    BrowserError::Failed("Page.getLayoutMetrics gave no content size".into())
                })
        };
        let (width, height) = (side("width")?, side("height")?);
        params["captureBeyondViewport"] = json!(true);
        params["clip"] = json!({"x": 0, "y": 0, "width": width, "height": height, "scale": 1});
    }
    s.call("Page.captureScreenshot", params, Duration::from_secs(30))
        .await
}

/// The page's text (`innerText` of the body) or markdown, at most `MAX_TEXT` characters.
pub async fn content(
    ep: &Endpoint,
    tab: &Tab,
    markdown: bool,
) -> Result<(String, bool), BrowserError> {
    let expr = if markdown {
        format!("({MARKDOWN_JS})({MAX_TEXT})")
    } else {
        format!(
            "(() => {{ const t = (document.body ? document.body.innerText : '') || ''; \
             return JSON.stringify([t.slice(0, {MAX_TEXT}), t.length > {MAX_TEXT}]); }})()"
        )
    };
    let mut s = Session::connect(ep, &tab.id).await?;
    let r = eval(&mut s, &expr, Duration::from_secs(30)).await;
    s.close().await;
    let v = r?;
    let (text, truncated): (String, bool) =
        v.as_str()
            .and_then(|t| serde_json::from_str(t).ok())
            .ok_or_else(|| BrowserError::Failed("the page's content could not be read".into()))?;
    Ok((text, truncated))
}

/// Markdown of the document, written in the page: a walk of the DOM with an explicit stack
/// (never recursion), headings, paragraphs, links, list items, code blocks, images' alt text;
/// scripts, styles and hidden elements skipped; returns `[markdown, truncated]` as JSON.
const MARKDOWN_JS: &str = r#"(max) => {
  const out = []; let size = 0; let cut = false;
  const push = (s) => { if (cut) return; if (size + s.length > max) { out.push(s.slice(0, max - size)); size = max; cut = true; } else { out.push(s); size += s.length; } };
  const skip = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','SVG','HEAD','IFRAME','CANVAS']);
  const block = new Set(['P','DIV','SECTION','ARTICLE','MAIN','HEADER','FOOTER','NAV','ASIDE','TABLE','TR','UL','OL','FORM','BLOCKQUOTE','FIGURE']);
  const root = document.body || document.documentElement;
  if (!root) return JSON.stringify(['', false]);
  const stack = [[root, false]];
  let pre = 0;
  while (stack.length && !cut) {
    const [node, closing] = stack.pop();
    if (typeof node === 'string') { push(node); continue; }
    if (node.nodeType === 3) {
      const t = pre ? node.textContent : node.textContent.replace(/\s+/g, ' ');
      if (t.trim() || pre) push(t);
      continue;
    }
    if (node.nodeType !== 1) continue;
    const tag = node.tagName.toUpperCase();
    if (closing) {
      if (tag === 'PRE') { pre--; push('\n```\n\n'); }
      else if (tag === 'A') push('](' + (node.href || '') + ')');
      else if (/^H[1-6]$/.test(tag) || block.has(tag) || tag === 'LI') push('\n\n');
      else if (tag === 'STRONG' || tag === 'B') push('**');
      else if (tag === 'EM' || tag === 'I') push('_');
      else if (tag === 'CODE' && !pre) push('`');
      else if (tag === 'TD' || tag === 'TH') push(' | ');
      continue;
    }
    if (skip.has(tag) || node.hidden || node.getAttribute('aria-hidden') === 'true') continue;
    if (/^H[1-6]$/.test(tag)) push('\n\n' + '#'.repeat(+tag[1]) + ' ');
    else if (tag === 'LI') push('\n- ');
    else if (tag === 'BR') { push('\n'); continue; }
    else if (tag === 'HR') { push('\n\n---\n\n'); continue; }
    else if (tag === 'IMG') { const alt = node.getAttribute('alt'); if (alt) push('![' + alt + ']'); continue; }
    else if (tag === 'PRE') { pre++; push('\n\n```\n'); }
    else if (tag === 'A') push('[');
    else if (tag === 'STRONG' || tag === 'B') push('**');
    else if (tag === 'EM' || tag === 'I') push('_');
    else if (tag === 'CODE' && !pre) push('`');
    else if (block.has(tag)) push('\n\n');
    else if (tag === 'INPUT' || tag === 'TEXTAREA') { push('[' + (node.value || node.placeholder || '') + ']'); continue; }
    stack.push([node, true]);
    const kids = node.childNodes;
    for (let i = kids.length - 1; i >= 0; i--) stack.push([kids[i], false]);
  }
  const md = out.join('').replace(/[ \t]+\n/g, '\n').replace(/\n{3,}/g, '\n\n').trim();
  return JSON.stringify([md, cut]);
}"#;

/// One node of an accessibility snapshot.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct AxNode {
    /// Chromium's AX node id (stable while the page does not change).
    pub id: String,
    /// Depth below the root (0).
    pub depth: u32,
    pub role: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The DOM node behind it, when there is one.
    #[serde(rename = "backendNodeId", skip_serializing_if = "Option::is_none")]
    pub backend_node_id: Option<u64>,
}

/// The tab's accessibility tree as a preorder list (ignored and unnamed generic nodes are left
/// out, their children lifted), at most `max_nodes` nodes and `max_depth` levels.
pub async fn accessibility(
    ep: &Endpoint,
    tab: &Tab,
    max_nodes: usize,
    max_depth: usize,
) -> Result<(Vec<AxNode>, bool), BrowserError> {
    let mut s = Session::connect(ep, &tab.id).await?;
    let r = s
        .call(
            "Accessibility.getFullAXTree",
            json!({}),
            Duration::from_secs(30),
        )
        .await;
    s.close().await;
    let r = r?;
    let nodes = r
        .get("nodes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok(compact(&nodes, max_nodes, max_depth))
}

fn text_of(v: &Value, key: &str) -> Option<String> {
    let x = v.get(key)?.get("value")?;
    match x {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// Makes the compact preorder list out of CDP's flat node list, iteratively.
pub fn compact(nodes: &[Value], max_nodes: usize, max_depth: usize) -> (Vec<AxNode>, bool) {
    let by_id: HashMap<&str, &Value> = nodes
        .iter()
        .filter_map(|n| Some((n.get("nodeId")?.as_str()?, n)))
        .collect();
    let roots: Vec<&Value> = nodes
        .iter()
        .filter(|n| {
            n.get("parentId")
                .and_then(Value::as_str)
                .is_none_or(|p| !by_id.contains_key(p))
        })
        .collect();
    let mut out = Vec::new();
    let mut truncated = false;
    let mut seen = std::collections::HashSet::new();
    // (node, depth in the output)
    let mut stack: Vec<(&Value, u32)> = roots.into_iter().rev().map(|n| (n, 0)).collect();
    while let Some((n, depth)) = stack.pop() {
        let Some(id) = n.get("nodeId").and_then(Value::as_str) else {
            continue;
        };
        if !seen.insert(id) {
            continue; // a cycle or a node listed twice
        }
        let role = text_of(n, "role").unwrap_or_default();
        let name = text_of(n, "name").unwrap_or_default();
        let ignored = n.get("ignored").and_then(Value::as_bool).unwrap_or(false);
        let boring = ignored
            || (name.is_empty()
                && matches!(role.as_str(), "generic" | "none" | "InlineTextBox" | ""));
        let child_depth = if boring { depth } else { depth + 1 };
        if !boring {
            if out.len() >= max_nodes {
                truncated = true;
                break;
            }
            out.push(AxNode {
                id: id.to_string(),
                depth,
                role,
                name,
                value: text_of(n, "value"),
                backend_node_id: n.get("backendDOMNodeId").and_then(Value::as_u64),
            });
        }
        if child_depth as usize >= max_depth {
            if n.get("childIds")
                .and_then(Value::as_array)
                .is_some_and(|c| !c.is_empty())
            {
                truncated = true;
            }
            continue;
        }
        if let Some(kids) = n.get("childIds").and_then(Value::as_array) {
            for k in kids.iter().rev() {
                if let Some(c) = k.as_str().and_then(|k| by_id.get(k)) {
                    stack.push((c, child_depth));
                }
            }
        }
    }
    (out, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        for ok in [
            "http://127.0.0.1:1/a",
            "https://example.com",
            "about:blank",
            "data:text/html,hi",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "chrome://settings",
            "nope",
            "http://",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert!(check_url(&format!("http://a/{}", "x".repeat(MAX_URL))).is_err());
    }

    #[test]
    fn compact_is_iterative_and_capped() {
        // A chain 100,000 deep: no recursion, cut at the depth cap.
        let n = 100_000;
        let nodes: Vec<Value> = (0..n)
            .map(|i| {
                let mut v = json!({"nodeId": i.to_string(), "role": {"value": "group"}, "name": {"value": format!("n{i}")}, "childIds": [(i + 1).to_string()]});
                if i > 0 {
                    v["parentId"] = json!((i - 1).to_string());
                }
                v
            })
            .collect();
        let (out, cut) = compact(&nodes, MAX_AX_NODES, MAX_AX_DEPTH);
        assert!(cut);
        assert_eq!(out.len(), MAX_AX_DEPTH);
        assert_eq!(out.last().map(|n| n.depth), Some(MAX_AX_DEPTH as u32 - 1));
        let (out, cut) = compact(&nodes, 10, usize::MAX);
        assert!(cut);
        assert_eq!(out.len(), 10);
        // A cycle ends.
        let cyc = vec![
            json!({"nodeId": "a", "role": {"value": "x"}, "childIds": ["b"]}),
            json!({"nodeId": "b", "parentId": "a", "role": {"value": "y"}, "childIds": ["a"]}),
        ];
        let (out, _) = compact(&cyc, 100, 100);
        assert_eq!(out.len(), 2);
    }
}
