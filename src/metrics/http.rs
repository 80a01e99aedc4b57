//! The HTTP request figures: `sandbox_agent_http_requests_total{route,method,status}` and
//! `sandbox_agent_http_request_duration_seconds{route,method}`.
//!
//! `route` is the route template axum matched (`/v1/acp/{serverId}`), never the raw path, so no
//! serverId, file path or process id becomes a label value. Every (route, method, status) cell
//! exists from the start in one flat table of atomics: recording a request is a lookup of the
//! template in a map built once, two index computations and three relaxed adds — no lock,
//! allocation or formatting per request.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use axum::extract::MatchedPath;
use axum::http::{Method, Request};

use super::Histogram;

/// Route label of a request no route matched (the 404 fallback).
pub const UNMATCHED: &str = "unmatched";

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "other",
];

/// Status slots: 100–101, 200–206, 300–308, 400–431, 500–511, and one for anything else.
const STATUS_SLOTS: usize = 2 + 7 + 9 + 32 + 12 + 1;

const HTTP_BOUNDS_US: &[u64] = &[
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];

pub struct HttpTable {
    routes: Vec<String>,
    index: HashMap<String, usize>,
    requests: Box<[AtomicU64]>,
    durations: Box<[Histogram]>,
}

static TABLE: OnceLock<HttpTable> = OnceLock::new();

/// Fixes the route templates (every path the router serves). The first call wins: the routes
/// are the same for every router a process builds.
pub fn init(templates: impl IntoIterator<Item = String>) {
    TABLE.get_or_init(|| {
        let mut routes = vec![UNMATCHED.to_string()];
        for t in templates {
            if !routes.contains(&t) {
                routes.push(t);
            }
        }
        let index = routes
            .iter()
            .enumerate()
            .map(|(i, r)| (r.clone(), i))
            .collect();
        let cells = routes.len() * METHODS.len();
        HttpTable {
            requests: (0..cells * STATUS_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            durations: (0..cells).map(|_| Histogram::new(HTTP_BOUNDS_US)).collect(),
            routes,
            index,
        }
    });
}

/// The route slot of a request (before it is handed on): its matched template's.
pub fn route_of<B>(req: &Request<B>) -> u32 {
    let (Some(t), Some(p)) = (TABLE.get(), req.extensions().get::<MatchedPath>()) else {
        return 0;
    };
    t.index.get(p.as_str()).copied().unwrap_or(0) as u32
}

/// The template of a route slot (`unmatched` for the fallback).
pub fn route_name(route: u32) -> &'static str {
    TABLE
        .get()
        .and_then(|t| t.routes.get(route as usize))
        .map_or(UNMATCHED, String::as_str)
}

fn method_slot(m: &Method) -> usize {
    match *m {
        Method::GET => 0,
        Method::POST => 1,
        Method::PUT => 2,
        Method::DELETE => 3,
        Method::PATCH => 4,
        Method::HEAD => 5,
        Method::OPTIONS => 6,
        Method::CONNECT => 7,
        _ => 8,
    }
}

fn status_slot(s: u16) -> usize {
    match s {
        100..=101 => (s - 100) as usize,
        200..=206 => 2 + (s - 200) as usize,
        300..=308 => 9 + (s - 300) as usize,
        400..=431 => 18 + (s - 400) as usize,
        500..=511 => 50 + (s - 500) as usize,
        _ => STATUS_SLOTS - 1,
    }
}

fn slot_status(i: usize) -> Option<u16> {
    Some(match i {
        0..=1 => 100 + i as u16,
        2..=8 => 200 + (i - 2) as u16,
        9..=17 => 300 + (i - 9) as u16,
        18..=49 => 400 + (i - 18) as u16,
        50..=61 => 500 + (i - 50) as u16,
        _ => return None,
    })
}

/// One answered request.
pub fn record(route: u32, method: &Method, status: u16, took: Duration) {
    let Some(t) = TABLE.get() else { return };
    let cell = route as usize * METHODS.len() + method_slot(method);
    if let Some(c) = t.requests.get(cell * STATUS_SLOTS + status_slot(status)) {
        c.fetch_add(1, Relaxed);
    }
    if let Some(h) = t.durations.get(cell) {
        h.observe(took);
    }
}

/// A non-zero request count: route, method, status.
pub struct RequestCount {
    pub route: String,
    pub method: &'static str,
    pub status: String,
    pub count: u64,
}

/// A non-empty duration histogram: route, method, (sum, count, buckets).
pub struct DurationRow {
    pub route: String,
    pub method: &'static str,
    pub sum: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

/// Every cell that has seen a request (untouched cells are not exposed: a route never called has
/// no series, as with any labelled counter).
pub fn snapshot() -> (Vec<RequestCount>, Vec<DurationRow>) {
    let Some(t) = TABLE.get() else {
        return (Vec::new(), Vec::new());
    };
    let mut counts = Vec::new();
    let mut durations = Vec::new();
    for (r, route) in t.routes.iter().enumerate() {
        for (m, method) in METHODS.iter().enumerate() {
            let cell = r * METHODS.len() + m;
            let h = &t.durations[cell];
            if h.count() == 0 {
                continue;
            }
            let (sum, count, buckets) = h.snapshot();
            durations.push(DurationRow {
                route: route.clone(),
                method,
                sum,
                count,
                buckets,
            });
            for s in 0..STATUS_SLOTS {
                let n = t.requests[cell * STATUS_SLOTS + s].load(Relaxed);
                if n > 0 {
                    counts.push(RequestCount {
                        route: route.clone(),
                        method,
                        status: slot_status(s).map_or("other".to_string(), |c| c.to_string()),
                        count: n,
                    });
                }
            }
        }
    }
    (counts, durations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_slots_round_trip() {
        for s in [
            100, 101, 200, 204, 206, 304, 400, 404, 429, 431, 500, 503, 511,
        ] {
            assert_eq!(slot_status(status_slot(s)), Some(s), "{s}");
        }
        assert_eq!(slot_status(status_slot(599)), None);
        assert_eq!(slot_status(status_slot(207)), None);
    }
}
