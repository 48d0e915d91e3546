//! The process's log writer, and the access log line written straight into it.
//!
//! Every log line (tracing's events and the access log) is appended to one in-memory buffer
//! under a short lock; a writer thread takes the whole buffer every `DEFAULT_FLUSH_MS`, or at
//! once when it passes `EAGER_BYTES`, and writes it to stderr in one `write`. A request never
//! waits on stderr (a slow pipe, a terminal, a full disk) and never pays a syscall or a thread
//! wake-up for its line. When the buffer holds `DEFAULT_MAX_BUFFER_BYTES` (the writer cannot
//! keep up) further lines are dropped and counted (`portico_log_lines_dropped_total`), never
//! queued without bound. One buffer for both kinds of line keeps each line whole: two writers
//! on one pipe could interleave the halves of a write larger than `PIPE_BUF`.
//!
//! The access line is formatted here rather than through `tracing`'s formatter: one pre-sized
//! append with a per-second cached timestamp prefix, in exactly the text and JSON shapes the
//! `tracing` formatter gives every other line (README, "Logs"). The access log with one
//! `write` per line and the generic formatter cost ~15 % of a pass-through request's CPU
//! (README, "Logs"; docs/benchmarks/history.md, the run of 2026-12-04 night).

use std::cell::RefCell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a line may wait in the buffer before the writer thread writes it.
pub const DEFAULT_FLUSH_MS: u64 = 20;
/// The most the buffer holds before lines are dropped (and counted).
pub const DEFAULT_MAX_BUFFER_BYTES: usize = 8 << 20;
/// A buffer this full wakes the writer thread before its next tick.
const EAGER_BYTES: usize = 256 << 10;

struct Inner {
    buf: Mutex<Vec<u8>>,
    wake: Condvar,
    stop: AtomicBool,
    dropped: AtomicU64,
}

/// A handle on the log buffer (cheap to clone).
#[derive(Clone)]
pub struct LogSink {
    inner: Arc<Inner>,
}

/// Stops the writer thread when dropped, after it wrote everything buffered.
pub struct SinkGuard {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

static GLOBAL: OnceLock<(LogSink, AccessFormat)> = OnceLock::new();

/// The shape of access lines; the same as the `tracing` formatter's for other lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessFormat {
    Text,
    Json,
}

impl LogSink {
    /// A sink writing to `out` from its own thread (named `portico-log`).
    pub fn start(out: impl Write + Send + 'static) -> std::io::Result<(LogSink, SinkGuard)> {
        let inner = Arc::new(Inner {
            buf: Mutex::new(Vec::with_capacity(EAGER_BYTES)),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
        });
        let writer = inner.clone();
        let thread = std::thread::Builder::new()
            .name("portico-log".into())
            .spawn(move || write_loop(&writer, out))?;
        Ok((
            LogSink {
                inner: inner.clone(),
            },
            SinkGuard {
                inner,
                thread: Some(thread),
            },
        ))
    }

    /// Makes this sink the one the access log writes to (once per process; later calls are
    /// ignored).
    pub fn install(&self, format: AccessFormat) {
        let _ = GLOBAL.set((self.clone(), format));
    }

    /// Appends one line built by `line` (which must end it with `\n`); dropped and counted if
    /// the buffer is full.
    pub fn append(&self, line: impl FnOnce(&mut Vec<u8>)) {
        // A poisoned lock only means a thread panicked mid-append: the bytes are still bytes.
        let mut buf = self.inner.buf.lock().unwrap_or_else(|p| p.into_inner());
        let start = buf.len();
        if start >= DEFAULT_MAX_BUFFER_BYTES {
            drop(buf);
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        line(&mut buf);
        let eager = buf.len() >= EAGER_BYTES && start < EAGER_BYTES;
        drop(buf);
        if eager {
            self.inner.wake.notify_one();
        }
    }

    /// Lines dropped so far because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

fn write_loop(inner: &Inner, mut out: impl Write) {
    let mut spare = Vec::with_capacity(EAGER_BYTES);
    loop {
        let stopping = {
            let mut buf = inner.buf.lock().unwrap_or_else(|p| p.into_inner());
            if buf.len() < EAGER_BYTES && !inner.stop.load(Ordering::Acquire) {
                buf = inner
                    .wake
                    .wait_timeout(buf, Duration::from_millis(DEFAULT_FLUSH_MS))
                    .map(|(b, _)| b)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            std::mem::swap(&mut *buf, &mut spare);
            inner.stop.load(Ordering::Acquire)
        };
        if !spare.is_empty() {
            // Nowhere to report a failing stderr; the lines are gone either way.
            let _ = out.write_all(&spare);
            let _ = out.flush();
            spare.clear();
        }
        if stopping && inner.buf.lock().map_or(true, |b| b.is_empty()) {
            return;
        }
    }
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What `tracing`'s formatter writes into: each event arrives as one whole line.
pub struct SinkWriter<'a>(&'a LogSink);

impl Write for SinkWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.append(|buf| buf.extend_from_slice(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = SinkWriter<'a>;

    fn make_writer(&'a self) -> SinkWriter<'a> {
        SinkWriter(self)
    }
}

/// One request's access log fields. The labels are portico's own words (method labels, cache
/// outcomes, error reasons: ASCII identifiers); the route name and the traceparent are checked
/// and escaped as needed.
pub struct Access<'a> {
    pub method: &'static str,
    pub backend: &'a str,
    /// The tool a `tools/call` named (`-` for other requests).
    pub tool: &'a str,
    /// Who called: the authenticated principal and its team (`-` when none).
    pub principal: &'a str,
    pub team: &'a str,
    pub status: u16,
    pub duration_us: u64,
    pub passthrough: bool,
    pub cache: &'static str,
    pub error: &'static str,
    pub traceparent: &'a str,
}

impl Access<'_> {
    /// The bytes of the fields whose length varies (before any escaping).
    fn variable_len(&self) -> usize {
        self.backend.len()
            + self.tool.len()
            + self.principal.len()
            + self.team.len()
            + self.traceparent.len()
    }
}

/// Whether the log filter lets access lines (`portico::access`, INFO) through. Once a sink is
/// installed the filter (set up with it) is fixed for the process's life, so it is asked once,
/// not per request.
pub fn access_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let ask = || tracing::enabled!(target: "portico::access", tracing::Level::INFO);
    if GLOBAL.get().is_none() {
        return ask();
    }
    *ON.get_or_init(ask)
}

/// Writes `a` into the installed sink; `false` if none is installed (the caller logs through
/// `tracing` instead).
pub fn access(a: &Access<'_>) -> bool {
    let Some((sink, format)) = GLOBAL.get() else {
        return false;
    };
    let now = SystemTime::now();
    sink.append(|buf| match format {
        AccessFormat::Text => access_text(buf, now, a),
        AccessFormat::Json => access_json(buf, now, a),
    });
    true
}

/// `<timestamp>  INFO portico::access: method="…" backend="…" tool="…" principal="…" team="…"
/// status=200 duration_us=… passthrough=true cache="…" error="…" traceparent="…"` (string
/// fields `Debug`-quoted, as `tracing`'s text format writes them).
pub fn access_text(buf: &mut Vec<u8>, now: SystemTime, a: &Access<'_>) {
    buf.reserve(200 + a.variable_len());
    push_timestamp(buf, now);
    buf.extend_from_slice(b"  INFO portico::access: method=");
    push_label(buf, a.method);
    buf.extend_from_slice(b" backend=");
    push_debug_str(buf, a.backend);
    buf.extend_from_slice(b" tool=");
    push_debug_str(buf, a.tool);
    buf.extend_from_slice(b" principal=");
    push_debug_str(buf, a.principal);
    buf.extend_from_slice(b" team=");
    push_debug_str(buf, a.team);
    buf.extend_from_slice(b" status=");
    push_u64(buf, u64::from(a.status));
    buf.extend_from_slice(b" duration_us=");
    push_u64(buf, a.duration_us);
    buf.extend_from_slice(if a.passthrough {
        b" passthrough=true cache="
    } else {
        b" passthrough=false cache="
    });
    push_label(buf, a.cache);
    buf.extend_from_slice(b" error=");
    push_label(buf, a.error);
    buf.extend_from_slice(b" traceparent=");
    push_debug_str(buf, a.traceparent);
    buf.push(b'\n');
}

/// `{"timestamp":"…","level":"INFO","method":…,"target":"portico::access"}`: `tracing`'s JSON
/// format with the event's fields flattened.
pub fn access_json(buf: &mut Vec<u8>, now: SystemTime, a: &Access<'_>) {
    buf.reserve(240 + a.variable_len());
    buf.extend_from_slice(b"{\"timestamp\":\"");
    push_timestamp(buf, now);
    buf.extend_from_slice(b"\",\"level\":\"INFO\",\"method\":");
    push_label(buf, a.method);
    buf.extend_from_slice(b",\"backend\":");
    push_json_str(buf, a.backend);
    buf.extend_from_slice(b",\"tool\":");
    push_json_str(buf, a.tool);
    buf.extend_from_slice(b",\"principal\":");
    push_json_str(buf, a.principal);
    buf.extend_from_slice(b",\"team\":");
    push_json_str(buf, a.team);
    buf.extend_from_slice(b",\"status\":");
    push_u64(buf, u64::from(a.status));
    buf.extend_from_slice(b",\"duration_us\":");
    push_u64(buf, a.duration_us);
    buf.extend_from_slice(if a.passthrough {
        b",\"passthrough\":true,\"cache\":"
    } else {
        b",\"passthrough\":false,\"cache\":"
    });
    push_label(buf, a.cache);
    buf.extend_from_slice(b",\"error\":");
    push_label(buf, a.error);
    buf.extend_from_slice(b",\"traceparent\":");
    push_json_str(buf, a.traceparent);
    buf.extend_from_slice(b",\"target\":\"portico::access\"}\n");
}

fn push_u64(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// One of portico's own labels, quoted: the same in `Debug` and JSON, since a label is an
/// ASCII identifier (`debug_assert`ed; a label with a quote would be a bug here, not input).
fn push_label(buf: &mut Vec<u8>, s: &'static str) {
    debug_assert!(
        s.bytes()
            .all(|b| b > 0x20 && b < 0x7f && b != b'"' && b != b'\\')
    );
    buf.push(b'"');
    buf.extend_from_slice(s.as_bytes());
    buf.push(b'"');
}

/// A string as Rust's `Debug` writes it (what `tracing`'s text format shows).
fn push_debug_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        let _ = write!(buf, "{s:?}");
    }
}

/// A JSON string literal.
fn push_json_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        // Serializing a &str cannot fail.
        let _ = serde_json::to_writer(&mut *buf, s);
    }
}

/// RFC 3339 in UTC with microseconds (`2026-12-04T18:57:32.086630Z`), as `tracing`'s default
/// timer writes it. The part up to the seconds is kept per thread and rebuilt once a second.
fn push_timestamp(buf: &mut Vec<u8>, now: SystemTime) {
    thread_local! {
        static PREFIX: RefCell<(u64, [u8; 20])> = const { RefCell::new((u64::MAX, [0; 20])) };
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    PREFIX.with(|p| {
        let mut p = p.borrow_mut();
        if p.0 != secs {
            *p = (secs, seconds_prefix(secs));
        }
        buf.extend_from_slice(&p.1);
    });
    let micros = since.subsec_micros();
    let mut frac = *b"000000Z";
    let mut m = micros;
    for i in (0..6).rev() {
        frac[i] = b'0' + (m % 10) as u8;
        m /= 10;
    }
    buf.extend_from_slice(&frac);
}

/// The UTC calendar date and time of `secs` after the Unix epoch (proleptic Gregorian, the
/// era-based civil-from-days algorithm: 400-year cycles of 146,097 days), as
/// `(year, month, day, hour, minute, second)`. Also the status page's clock (`status::page`).
pub fn civil(secs: u64) -> (i64, u64, u64, u64, u64, u64) {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month as u64,
        day as u64,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
    )
}

/// `YYYY-MM-DDTHH:MM:SS.` for `secs` after the Unix epoch (UTC).
fn seconds_prefix(secs: u64) -> [u8; 20] {
    let (y, m, d, h, mi, s) = civil(secs);
    let mut out = [0u8; 20];
    let mut put = |at: usize, v: u64, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y.clamp(0, 9999) as u64, 4);
    put(5, m, 2);
    put(8, d, 2);
    put(11, h, 2);
    put(14, mi, 2);
    put(17, s, 2);
    out[4] = b'-';
    out[7] = b'-';
    out[10] = b'T';
    out[13] = b':';
    out[16] = b':';
    out[19] = b'.';
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, micros: u32) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(u64::from(micros))
    }

    #[test]
    fn timestamps_match_rfc3339_with_micros() {
        for (secs, micros, want) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 5, "2000-02-29T00:00:00.000005Z"),
            (1_796_409_452, 86_630, "2026-12-04T18:37:32.086630Z"),
            (4_102_444_799, 999_999, "2099-12-31T23:59:59.999999Z"),
        ] {
            let mut buf = Vec::new();
            push_timestamp(&mut buf, at(secs, micros));
            assert_eq!(String::from_utf8(buf).unwrap(), want);
        }
    }

    fn sample<'a>(backend: &'a str, traceparent: &'a str) -> Access<'a> {
        Access {
            method: "tools/call",
            backend,
            tool: "echo",
            principal: "alice",
            team: "-",
            status: 200,
            duration_us: 1001,
            passthrough: true,
            cache: "-",
            error: "",
            traceparent,
        }
    }

    #[test]
    fn text_lines_have_the_tracing_shape() {
        let mut buf = Vec::new();
        access_text(&mut buf, at(1_796_409_452, 86_630), &sample("bench", ""));
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "2026-12-04T18:37:32.086630Z  INFO portico::access: method=\"tools/call\" \
             backend=\"bench\" tool=\"echo\" principal=\"alice\" team=\"-\" status=200 \
             duration_us=1001 passthrough=true cache=\"-\" error=\"\" traceparent=\"\"\n"
        );
        // Quotes and control characters are escaped as Debug escapes them.
        let mut buf = Vec::new();
        access_text(&mut buf, at(0, 0), &sample("a\"b\n", ""));
        assert!(
            String::from_utf8(buf)
                .unwrap()
                .contains(r#"backend="a\"b\n""#)
        );
    }

    #[test]
    fn json_lines_parse_and_carry_every_field() {
        let mut buf = Vec::new();
        access_json(
            &mut buf,
            at(1_796_409_452, 1),
            &sample("we\"ird\u{1}", "00-x"),
        );
        assert_eq!(buf.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["timestamp"], "2026-12-04T18:37:32.000001Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "portico::access");
        assert_eq!(v["backend"], "we\"ird\u{1}");
        assert_eq!(v["tool"], "echo");
        assert_eq!(v["principal"], "alice");
        assert_eq!(v["team"], "-");
        assert_eq!(v["status"], 200);
        assert_eq!(v["duration_us"], 1001);
        assert_eq!(v["passthrough"], true);
        assert_eq!(v["traceparent"], "00-x");
    }

    /// Collects what the writer thread writes.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_written_whole_and_flushed_at_exit() {
        let out = Shared::default();
        let (sink, guard) = LogSink::start(out.clone()).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        sink.append(|b| {
                            let _ = writeln!(b, "thread {t} line {i}");
                        });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 4000);
        assert!(text.lines().all(|l| l.starts_with("thread ")));
        assert_eq!(sink.dropped(), 0);
    }

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_growing() {
        // A writer that never returns keeps the buffer full.
        struct Stuck;
        impl Write for Stuck {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                std::thread::park();
                Ok(0)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (sink, guard) = LogSink::start(Stuck).unwrap();
        let line = vec![b'x'; 64 * 1024];
        for _ in 0..(2 * DEFAULT_MAX_BUFFER_BYTES / line.len()) {
            sink.append(|b| b.extend_from_slice(&line));
        }
        assert!(sink.dropped() > 0);
        assert!(sink.inner.buf.lock().unwrap().len() <= DEFAULT_MAX_BUFFER_BYTES + line.len());
        // The stuck writer thread is left behind (it is parked forever); don't join it.
        std::mem::forget(guard);
    }
}
