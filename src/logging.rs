//! Logging setup (tracing). Under systemd, when stderr is the journal (`JOURNAL_STREAM` names
//! stderr's device and inode), events go to journald with structured fields; otherwise they are
//! written as text or JSON lines to stderr. Nothing of ours is ever written to stdout.
//!
//! **Invariant:** logging never blocks the thread that logs. Every event is formatted into a
//! bounded in-memory queue (`--log-queue` bytes) that one dedicated thread drains to stderr or
//! the journal socket; when the queue is full the event is dropped and counted, and the count is
//! logged as soon as the writer catches up. So a stderr pipe nobody reads, or a journald that
//! lags, costs log lines, never request handling. Agents' own output is rate-limited before it
//! gets here (`RateLimit`, used by `supervisor::stderr` and the ACP stdout reader).

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{Config, LogFormat};

/// True when fd 2 is the stream systemd connected to the journal.
fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match nix::sys::stat::fstat(std::io::stderr().as_fd()) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

/// The format actually used once `auto` is resolved.
pub fn resolve_format(config: &Config) -> LogFormat {
    match config.log_format {
        LogFormat::Auto if stderr_is_journal(config.systemd.journal_stream.as_deref()) => {
            LogFormat::Journald
        }
        LogFormat::Auto => LogFormat::Text,
        other => other,
    }
}

/// The queue between the threads that log and the one that writes.
struct Shared {
    state: Mutex<QueueState>,
    ready: Condvar,
    max_bytes: usize,
}

#[derive(Default)]
struct QueueState {
    records: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Records refused since the last notice.
    dropped: u64,
    closed: bool,
    /// True while the writer thread sleeps on the condvar with nothing queued: only the push
    /// that finds it so wakes it (one wake-up per batch, never one per record).
    parked: bool,
    /// How often the writer was woken (for the tests and the batching claim).
    wakeups: u64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // The lock is held only to move buffers in and out; a panic cannot leave it inconsistent.
        crate::sys::lock(&self.state)
    }

    /// Queues one formatted record, or drops and counts it when the queue is full.
    fn push(&self, record: Vec<u8>) {
        let mut st = self.lock();
        if st.closed || st.bytes + record.len() > self.max_bytes {
            st.dropped += 1;
            crate::metrics::log_record_dropped();
            return;
        }
        st.bytes += record.len();
        st.records.push_back(record);
        let wake = std::mem::take(&mut st.parked);
        drop(st);
        if wake {
            self.ready.notify_one();
        }
    }
}

/// Where the writer thread sends records.
enum Sink {
    Stderr {
        json: bool,
    },
    Journal(UnixDatagram),
    /// The tests' sink: counts the records written.
    #[cfg(test)]
    Count(Arc<std::sync::atomic::AtomicUsize>),
}

impl Sink {
    fn write_batch(&self, batch: &[Vec<u8>]) {
        match self {
            Sink::Stderr { .. } => {
                let mut err = std::io::stderr().lock();
                for r in batch {
                    // Nothing sensible to do when stderr itself fails (closed, EPIPE).
                    let _ = err.write_all(r);
                }
                let _ = err.flush();
            }
            Sink::Journal(sock) => {
                for r in batch {
                    let _ = sock.send(r);
                }
            }
            #[cfg(test)]
            Sink::Count(n) => {
                n.fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The record that reports `n` dropped records, in this sink's format.
    fn dropped_notice(&self, n: u64) -> Vec<u8> {
        let msg = format!("{n} log records dropped: the log writer could not keep up");
        match self {
            Sink::Stderr { json: true } => serde_json::json!({
                "level": "WARN",
                "target": "sandbox_agent::logging",
                "message": msg,
                "dropped": n,
            })
            .to_string()
            .into_bytes()
            .into_iter()
            .chain(*b"\n")
            .collect(),
            Sink::Stderr { json: false } => {
                format!(" WARN sandbox_agent::logging: {msg} dropped={n}\n").into_bytes()
            }
            Sink::Journal(_) => {
                let mut rec = Vec::new();
                journal_field(&mut rec, "PRIORITY", b"4");
                journal_field(&mut rec, "SYSLOG_IDENTIFIER", b"sandbox-agent");
                journal_field(&mut rec, "TARGET", b"sandbox_agent::logging");
                journal_field(&mut rec, "DROPPED", n.to_string().as_bytes());
                journal_field(&mut rec, "MESSAGE", msg.as_bytes());
                rec
            }
            #[cfg(test)]
            Sink::Count(_) => msg.into_bytes(),
        }
    }
}

/// After a batch of more than one record (records arrive faster than one at a time), the writer
/// waits this long before taking the next batch, so that under a steady stream of records it
/// wakes at most a few hundred times a second whatever the record rate. A lone record after a
/// quiet spell is written at once.
const LINGER: Duration = Duration::from_millis(2);

fn drain(shared: Arc<Shared>, sink: Sink) {
    loop {
        let (batch, dropped) = {
            let mut st = shared.lock();
            while st.records.is_empty() && st.dropped == 0 && !st.closed {
                st.parked = true;
                st = shared.ready.wait(st).unwrap_or_else(|e| e.into_inner());
                if !st.parked {
                    st.wakeups += 1;
                }
            }
            st.parked = false;
            if st.records.is_empty() && st.dropped == 0 && st.closed {
                return;
            }
            st.bytes = 0;
            (
                std::mem::take(&mut st.records),
                std::mem::take(&mut st.dropped),
            )
        };
        let batch: Vec<Vec<u8>> = batch.into();
        sink.write_batch(&batch);
        if dropped > 0 {
            sink.write_batch(&[sink.dropped_notice(dropped)]);
        }
        if batch.len() > 1 {
            std::thread::sleep(LINGER);
        }
    }
}

/// The `MakeWriter` of the fmt layers: each event is collected whole, then queued.
#[derive(Clone)]
struct QueueWriter(Arc<Shared>);

struct EventBuf {
    buf: Vec<u8>,
    shared: Arc<Shared>,
}

impl Write for EventBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventBuf {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.shared.push(std::mem::take(&mut self.buf));
        }
    }
}

impl<'a> MakeWriter<'a> for QueueWriter {
    type Writer = EventBuf;
    fn make_writer(&'a self) -> EventBuf {
        EventBuf {
            buf: Vec::new(),
            shared: self.0.clone(),
        }
    }
}

/// One journald native-protocol field: `NAME=value\n`, or the length-prefixed form when the value
/// holds a newline.
fn journal_field(rec: &mut Vec<u8>, name: &str, value: &[u8]) {
    rec.extend_from_slice(name.as_bytes());
    if memchr::memchr(b'\n', value).is_some() {
        rec.push(b'\n');
        rec.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        rec.push(b'=');
    }
    rec.extend_from_slice(value);
    rec.push(b'\n');
}

/// A tracing field name as a journal field name: upper case, `[A-Z0-9_]`, not starting with `_`
/// (reserved for trusted fields) or a digit.
fn journal_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c == '_' || c.is_ascii_digit()) {
        out.insert(0, 'F');
    }
    out
}

/// Journald output: each event becomes one native-protocol datagram, queued like the rest.
struct JournalLayer(Arc<Shared>);

struct JournalVisitor<'a>(&'a mut Vec<u8>);

impl Visit for JournalVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        journal_field(self.0, &journal_name(field.name()), value.as_bytes());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        journal_field(
            self.0,
            &journal_name(field.name()),
            format!("{value:?}").as_bytes(),
        );
    }
}

impl<S: tracing::Subscriber> Layer<S> for JournalLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let meta = event.metadata();
        let priority: &[u8] = match *meta.level() {
            tracing::Level::ERROR => b"3",
            tracing::Level::WARN => b"4",
            tracing::Level::INFO => b"5",
            tracing::Level::DEBUG => b"6",
            tracing::Level::TRACE => b"7",
        };
        let mut rec = Vec::with_capacity(256);
        journal_field(&mut rec, "PRIORITY", priority);
        journal_field(&mut rec, "SYSLOG_IDENTIFIER", b"sandbox-agent");
        journal_field(&mut rec, "TARGET", meta.target().as_bytes());
        event.record(&mut JournalVisitor(&mut rec));
        self.0.push(rec);
    }
}

/// `--log-format json`: one object per event, with `timestamp`, `level`, `target`, `message` and
/// the event's fields at the top level. Numbers and booleans stay JSON numbers and booleans, and
/// a field logged with `?` whose text is a list (`[1, 2]`, `["memory", "pids"]`) becomes a JSON
/// array, so log tools can query it as one instead of parsing a printed string.
struct JsonLines;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime;
        let meta = event.metadata();
        let mut timestamp = String::new();
        tracing_subscriber::fmt::time::SystemTime.format_time(
            &mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp),
        )?;
        let mut map = serde_json::Map::new();
        map.insert("timestamp".into(), timestamp.into());
        map.insert("level".into(), meta.level().as_str().into());
        event.record(&mut JsonFields(&mut map));
        map.insert("target".into(), meta.target().into());
        writeln!(writer, "{}", serde_json::Value::Object(map))
    }
}

struct JsonFields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl JsonFields<'_> {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        self.0.insert(field.name().to_string(), value);
    }
}

/// The JSON value of a field's `Debug` text: an array when the text is a list that reads as
/// JSON, else the text itself.
fn debug_value(name: &str, text: String) -> serde_json::Value {
    if name == "message" {
        return text.into();
    }
    // A set prints as `{"a", "b"}`: the same items in brackets.
    let as_list = match text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        Some(inner) => std::borrow::Cow::Owned(format!("[{inner}]")),
        None => std::borrow::Cow::Borrowed(text.as_str()),
    };
    if as_list.starts_with('[')
        && let Ok(v @ serde_json::Value::Array(_)) = serde_json::from_str(&as_list)
    {
        return v;
    }
    text.into()
}

impl Visit for JsonFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = debug_value(field.name(), format!("{value:?}"));
        self.put(field, v);
    }
}

/// The writer's queue, for `flush`.
static WRITER: std::sync::OnceLock<Arc<Shared>> = std::sync::OnceLock::new();

/// Waits (at most `timeout`) until every record queued so far has been written: for a reload,
/// whose `execve` ends the writer thread with whatever it still holds. Blocks the calling thread.
pub fn flush(timeout: Duration) -> bool {
    let Some(shared) = WRITER.get() else {
        return true;
    };
    let deadline = Instant::now() + timeout;
    loop {
        {
            let st = shared.lock();
            // Parked with nothing queued: the last batch is written.
            if st.records.is_empty() && st.dropped == 0 && (st.parked || st.closed) {
                return true;
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Keeps the writer thread; dropping it flushes what is queued (waiting at most a second, since
/// stderr may be a pipe nobody reads).
pub struct LogGuard {
    /// The trace exporter (flushed first when the guard goes, while the log still works).
    telemetry: Option<crate::telemetry::TelemetryGuard>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        drop(self.telemetry.take());
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
        let Some(t) = self.thread.take() else { return };
        let deadline = Instant::now() + Duration::from_secs(1);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

/// Installs the global subscriber and starts the writer thread. Falls back to text on stderr if
/// the journal is unreachable. Keep the guard until the process exits.
pub fn init(config: &Config) -> LogGuard {
    let mut filter =
        EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let shared = Arc::new(Shared {
        state: Mutex::new(QueueState::default()),
        ready: Condvar::new(),
        max_bytes: usize::try_from(config.log_queue).unwrap_or(usize::MAX),
    });
    let _ = WRITER.set(shared.clone());
    let mut format = resolve_format(config);
    let mut journal = None;
    if format == LogFormat::Journald {
        match UnixDatagram::unbound().and_then(|s| {
            s.connect(&config.journal_socket)?;
            Ok(s)
        }) {
            Ok(s) => journal = Some(s),
            Err(e) => {
                eprintln!(
                    "sandbox-agent: journald unavailable at {} ({e}); logging text to stderr",
                    config.journal_socket.display()
                );
                format = LogFormat::Text;
            }
        }
    }
    let sink = match journal {
        Some(s) => Sink::Journal(s),
        None => Sink::Stderr {
            json: format == LogFormat::Json,
        },
    };
    let writer = QueueWriter(shared.clone());
    let base = tracing_subscriber::registry();
    // The trace spans are made only while traces are on, whatever the log level.
    let (otel, telemetry) = match crate::telemetry::layer(config) {
        Some((layer, guard)) => {
            if let Ok(d) = format!("{}=info", crate::telemetry::TARGET).parse() {
                filter = filter.add_directive(d);
            }
            (Some(layer), Some(guard))
        }
        None => (None, None),
    };
    let registry = base.with(filter).with(otel);
    match format {
        LogFormat::Journald => registry.with(JournalLayer(shared.clone())).init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(JsonLines)
                    .with_writer(writer),
            )
            .init(),
        LogFormat::Text | LogFormat::Auto => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .init(),
    }
    let drain_shared = shared.clone();
    let thread = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || drain(drain_shared, sink))
        .ok();
    LogGuard {
        telemetry,
        shared,
        thread,
    }
}

/// A budget of lines and bytes per second (a token bucket holding at most one second's worth),
/// for output an agent controls: what is over budget is counted, not logged, and
/// `take_report` says how much was suppressed, at most once a second.
#[derive(Debug)]
pub struct RateLimit {
    lines_per_sec: f64,
    bytes_per_sec: f64,
    lines: f64,
    bytes: f64,
    last: Instant,
    dropped_lines: u64,
    dropped_bytes: u64,
    last_report: Instant,
}

impl RateLimit {
    pub fn new(lines_per_sec: u64, bytes_per_sec: u64) -> Self {
        let now = Instant::now();
        RateLimit {
            lines_per_sec: lines_per_sec as f64,
            bytes_per_sec: bytes_per_sec as f64,
            lines: lines_per_sec as f64,
            bytes: bytes_per_sec as f64,
            last: now,
            dropped_lines: 0,
            dropped_bytes: 0,
            last_report: now,
        }
    }

    /// True when a line of `len` bytes may be logged now (and takes it from the budget).
    pub fn admit(&mut self, len: usize) -> bool {
        let now = Instant::now();
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.lines = (self.lines + dt * self.lines_per_sec).min(self.lines_per_sec);
        self.bytes = (self.bytes + dt * self.bytes_per_sec).min(self.bytes_per_sec);
        let len = len as f64;
        if self.lines >= 1.0 && self.bytes >= len.min(self.bytes_per_sec) {
            self.lines -= 1.0;
            self.bytes -= len;
            true
        } else {
            self.dropped_lines += 1;
            self.dropped_bytes += len as u64;
            false
        }
    }

    /// Counts `n` lines of `bytes` bytes that were not even offered (read while over budget).
    pub fn drop_lines(&mut self, n: u64, bytes: u64) {
        self.dropped_lines += n;
        self.dropped_bytes += bytes;
    }

    /// True while no line would be admitted right now.
    pub fn exhausted(&mut self) -> bool {
        let dt = Instant::now()
            .saturating_duration_since(self.last)
            .as_secs_f64();
        self.lines + dt * self.lines_per_sec < 1.0
    }

    /// (lines, bytes) suppressed since the last report, when there are some and a second has
    /// passed since the last report (or `force`).
    pub fn take_report(&mut self, force: bool) -> Option<(u64, u64)> {
        if self.dropped_lines == 0 {
            return None;
        }
        let now = Instant::now();
        if !force && now.saturating_duration_since(self.last_report) < Duration::from_secs(1) {
            return None;
        }
        self.last_report = now;
        Some((
            std::mem::take(&mut self.dropped_lines),
            std::mem::take(&mut self.dropped_bytes),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts() {
        let shared = Shared {
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            max_bytes: 10,
        };
        shared.push(b"12345".to_vec());
        shared.push(b"12345".to_vec());
        shared.push(b"1".to_vec());
        let st = shared.lock();
        assert_eq!(st.records.len(), 2);
        assert_eq!(st.dropped, 1);
    }

    /// Records pushed from several threads as fast as they can are all written, and the writer is
    /// woken once per batch, not once per record.
    #[test]
    fn the_writer_wakes_once_per_batch() {
        let shared = Arc::new(Shared {
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            max_bytes: 64 << 20,
        });
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (shared, sink) = (shared.clone(), Sink::Count(written.clone()));
            std::thread::spawn(move || drain(shared, sink))
        };
        // Let the writer park first, so the first push has to wake it.
        while !shared.lock().parked {
            std::thread::yield_now();
        }
        const THREADS: usize = 4;
        const EACH: usize = 5_000;
        let pushers: Vec<_> = (0..THREADS)
            .map(|_| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        shared.push(format!("record {i}\n").into_bytes());
                    }
                })
            })
            .collect();
        for p in pushers {
            p.join().unwrap();
        }
        shared.lock().closed = true;
        shared.ready.notify_all();
        writer.join().unwrap();
        let st = shared.lock();
        assert_eq!(st.dropped, 0);
        assert_eq!(
            written.load(std::sync::atomic::Ordering::Relaxed),
            THREADS * EACH
        );
        assert!(st.wakeups >= 1, "the first push wakes the parked writer");
        assert!(
            st.wakeups <= (THREADS * EACH / 20) as u64,
            "{} wake-ups for {} records",
            st.wakeups,
            THREADS * EACH
        );
    }

    #[test]
    fn json_lines_print_lists_as_arrays() {
        use tracing_subscriber::fmt::MakeWriter;
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> MakeWriter<'a> for Buf {
            type Writer = Buf;
            fn make_writer(&'a self) -> Buf {
                self.clone()
            }
        }
        let buf = Buf::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .with_writer(buf.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            let dirs = vec!["/sys/fs/cgroup/memory/x".to_string()];
            tracing::warn!(
                pids = ?vec![1u32, 2],
                ?dirs,
                code = 3,
                ok = false,
                grace = ?Duration::from_secs(3),
                odd = ?["\u{1b}"],
                set = ?std::collections::BTreeSet::from(["memory", "pids"]),
                map = ?std::collections::BTreeMap::from([("a", 1)]),
                "[not a list] message"
            );
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
        assert_eq!(v["pids"], serde_json::json!([1, 2]), "{v}");
        assert_eq!(
            v["dirs"],
            serde_json::json!(["/sys/fs/cgroup/memory/x"]),
            "{v}"
        );
        assert_eq!(v["code"], 3, "{v}");
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["grace"], "3s", "{v}");
        assert!(v["odd"].is_string(), "not JSON, kept as text: {v}");
        assert_eq!(v["set"], serde_json::json!(["memory", "pids"]), "{v}");
        assert_eq!(v["map"], "{\"a\": 1}", "{v}");
        assert_eq!(v["message"], "[not a list] message", "{v}");
        assert_eq!(v["level"], "WARN", "{v}");
        assert!(v["timestamp"].is_string() && v["target"].is_string(), "{v}");
    }

    #[test]
    fn journal_fields() {
        let mut rec = Vec::new();
        journal_field(&mut rec, "MESSAGE", b"one");
        journal_field(&mut rec, "MESSAGE", b"a\nb");
        let mut expected = b"MESSAGE=one\nMESSAGE\n".to_vec();
        expected.extend_from_slice(&3u64.to_le_bytes());
        expected.extend_from_slice(b"a\nb\n");
        assert_eq!(rec, expected);
        assert_eq!(journal_name("server_id"), "SERVER_ID");
        assert_eq!(journal_name("_x"), "F_X");
        assert_eq!(journal_name("a.b"), "A_B");
    }

    #[test]
    fn rate_limit_admits_a_second_worth_then_counts() {
        let mut r = RateLimit::new(10, 1_000_000);
        let admitted = (0..100).filter(|_| r.admit(10)).count();
        assert!((10..=11).contains(&admitted), "{admitted}");
        let (lines, bytes) = r.take_report(true).expect("some dropped");
        assert_eq!(lines as usize, 100 - admitted);
        assert_eq!(bytes as usize, (100 - admitted) * 10);
        assert!(r.take_report(true).is_none());
        let mut b = RateLimit::new(1000, 100);
        assert!(b.admit(60));
        assert!(!b.admit(60), "the byte budget holds too");
    }
}
