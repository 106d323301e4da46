//! The recorder: a bounded lock-free queue filled by the call path, drained by one writer
//! thread into a rotating pair of files.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use lbkit_core::trace::{AttemptRecord, TraceSink};
use lbkit_core::{Balancer, Strategy};

use crate::format::{
    header, put_str, RawAttempt, TraceOutcome, FLAG_HEDGE, FLAG_RETRY, HEADER_LEN, KIND_ENDPOINT,
    KIND_STREAM,
};
use crate::{previous_segment, TraceError};

/// Records the call path can have waiting for the writer; past it, records are dropped.
pub const QUEUE_CAPACITY: usize = 16_384;
/// How often the writer drains the queue.
pub const DRAIN_PERIOD: Duration = Duration::from_millis(20);
/// The smallest `max_bytes` accepted (two segments of 32 KiB).
pub const MIN_MAX_BYTES: u64 = 64 * 1024;
/// The largest `max_bytes` accepted (1 TiB).
pub const MAX_MAX_BYTES: u64 = 1 << 40;

/// Where and how much to record: the proxy's `[service.NAME.trace]` table and the tower
/// builder's `trace` take the same three fields.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceConfig {
    /// The trace file (its older segment is `PATH.1`).
    pub path: PathBuf,
    /// Share of requests recorded, in `(0, 1]` (default 0.01).
    pub sample_rate: f64,
    /// Most bytes on disk over both segments, at least [`MIN_MAX_BYTES`] (default 64 MiB).
    pub max_bytes: u64,
    /// Wait for room when the queue is full instead of dropping the record: for offline
    /// producers that must not lose a record (the simulator's `--record`), never for a call
    /// path. Default false.
    pub lossless: bool,
}

// === impl TraceConfig ===

impl TraceConfig {
    /// Record 1 % of the requests into `path`, in at most 64 MiB.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        TraceConfig {
            path: path.into(),
            sample_rate: 0.01,
            max_bytes: 64 << 20,
            lossless: false,
        }
    }

    /// Wait for room instead of dropping records (see [`lossless`](Self::lossless)).
    pub fn with_lossless(mut self, lossless: bool) -> Self {
        self.lossless = lossless;
        self
    }

    /// Set the share of requests recorded.
    pub fn with_sample_rate(mut self, rate: f64) -> Self {
        self.sample_rate = rate;
        self
    }

    /// Set the most bytes on disk.
    pub fn with_max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Check the fields.
    ///
    /// # Errors
    /// An empty path, a sample rate outside `(0, 1]`, `max_bytes` outside
    /// [`MIN_MAX_BYTES`]`..=1 TiB`.
    pub fn validate(&self) -> Result<(), TraceError> {
        if self.path.as_os_str().is_empty() {
            return Err(TraceError::Config {
                field: "path",
                reason: "must name a file".into(),
            });
        }
        if !(self.sample_rate > 0.0 && self.sample_rate <= 1.0) {
            return Err(TraceError::Config {
                field: "sample_rate",
                reason: format!("must be within (0, 1] (got {})", self.sample_rate),
            });
        }
        if !(MIN_MAX_BYTES..=MAX_MAX_BYTES).contains(&self.max_bytes) {
            return Err(TraceError::Config {
                field: "max_bytes",
                reason: format!(
                    "must be within {MIN_MAX_BYTES}..={MAX_MAX_BYTES} (got {})",
                    self.max_bytes
                ),
            });
        }
        Ok(())
    }
}

/// What a recorder did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecorderStats {
    /// Attempts written.
    pub written: u64,
    /// Attempts dropped because the queue was full (the writer fell behind).
    pub dropped: u64,
    /// Attempts lost to write errors.
    pub lost: u64,
    /// Bytes written, over every segment.
    pub bytes: u64,
    /// Segments started after the first (rotations).
    pub rotations: u64,
}

enum Control {
    Stream {
        id: u32,
        service: String,
        strategy: String,
        sample_rate: f64,
    },
    Flush(Sender<()>),
    Stop,
}

struct Shared {
    queue: ArrayQueue<AttemptRecord>,
    control: Sender<Control>,
    next_stream: AtomicU32,
    written: AtomicU64,
    dropped: AtomicU64,
    lost: AtomicU64,
    bytes: AtomicU64,
    rotations: AtomicU64,
    lossless: bool,
}

impl TraceSink for Shared {
    fn register(&self, service: &str, strategy: &str, sample_rate: f64) -> u32 {
        let id = self.next_stream.fetch_add(1, Relaxed);
        // Sent before any record of the stream can be pushed: the writer, having popped such a
        // record, finds the definition in the channel.
        let _ = self.control.send(Control::Stream {
            id,
            service: service.to_owned(),
            strategy: strategy.to_owned(),
            sample_rate,
        });
        id
    }

    #[inline]
    fn record(&self, record: AttemptRecord) {
        let Err(mut back) = self.queue.push(record) else {
            return;
        };
        if !self.lossless {
            self.dropped.fetch_add(1, Relaxed);
            return;
        }
        while let Err(r) = self.queue.push(back) {
            back = r;
            std::thread::yield_now();
        }
    }
}

/// Writes sampled attempts to a bounded, rotating trace file. Dropping it drains what is
/// queued, flushes and stops the writer thread.
pub struct Recorder {
    shared: Arc<Shared>,
    control: Sender<Control>,
    sample_rate: f64,
    path: PathBuf,
    writer: Option<JoinHandle<()>>,
}

// === impl Recorder ===

impl Recorder {
    /// Start recording into `config.path` (an existing file there becomes `PATH.1`).
    ///
    /// # Errors
    /// An invalid config; the file cannot be created.
    pub fn open(config: &TraceConfig) -> Result<Recorder, TraceError> {
        config.validate()?;
        let file = Segment::start(&config.path)?;
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(QUEUE_CAPACITY),
            control: tx.clone(),
            next_stream: AtomicU32::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            bytes: AtomicU64::new(HEADER_LEN as u64),
            rotations: AtomicU64::new(0),
            lossless: config.lossless,
        });
        let mut writer = Writer {
            shared: shared.clone(),
            path: config.path.clone(),
            limit: config.max_bytes / 2,
            segment: Some(file),
            streams: HashMap::new(),
            defined_streams: Vec::new(),
            endpoints: HashMap::new(),
            buf: Vec::with_capacity(256),
            dirty: false,
            stopping: false,
            acks: Vec::new(),
        };
        let handle = std::thread::Builder::new()
            .name("lbkit-trace".into())
            .spawn(move || writer.run(&rx))
            .map_err(|e| TraceError::io(&config.path, e))?;
        Ok(Recorder {
            shared,
            control: tx,
            sample_rate: config.sample_rate,
            path: config.path.clone(),
            writer: Some(handle),
        })
    }

    /// The sink to give a balancer's tracer.
    pub fn sink(&self) -> Arc<dyn TraceSink> {
        self.shared.clone()
    }

    /// The configured share of requests recorded.
    pub fn sample_rate(&self) -> f64 {
        self.sample_rate
    }

    /// The trace file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `balancer`, recording its requests to `service` at the configured rate.
    pub fn attach<S: Strategy>(&self, balancer: Balancer<S>, service: &str) -> Balancer<S> {
        balancer.with_tracer(self.sink(), service, self.sample_rate)
    }

    /// Write everything queued so far and flush the file; returns when done (or after 10 s if
    /// the writer is stuck on the disk).
    pub fn flush(&self) {
        let (ack, done) = mpsc::channel();
        if self.control.send(Control::Flush(ack)).is_ok() {
            let _ = done.recv_timeout(Duration::from_secs(10));
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> RecorderStats {
        let s = &self.shared;
        RecorderStats {
            written: s.written.load(Relaxed),
            dropped: s.dropped.load(Relaxed),
            lost: s.lost.load(Relaxed),
            bytes: s.bytes.load(Relaxed),
            rotations: s.rotations.load(Relaxed),
        }
    }
}

impl Drop for Recorder {
    /// Write what is queued, flush, stop the writer thread. Tracers that outlive the recorder
    /// (a balancer kept elsewhere) then fill the queue and count their records as dropped.
    fn drop(&mut self) {
        let _ = self.control.send(Control::Stop);
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("path", &self.path)
            .field("sample_rate", &self.sample_rate)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The file being written and its size.
struct Segment {
    out: BufWriter<File>,
    len: u64,
}

impl Segment {
    /// Move an existing file at `path` to `PATH.1` and start a new segment there.
    fn start(path: &Path) -> Result<Segment, TraceError> {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            std::fs::rename(path, previous_segment(path)).map_err(|e| TraceError::io(path, e))?;
        }
        let file = File::create(path).map_err(|e| TraceError::io(path, e))?;
        let mut out = BufWriter::with_capacity(64 * 1024, file);
        out.write_all(&header())
            .map_err(|e| TraceError::io(path, e))?;
        Ok(Segment {
            out,
            len: HEADER_LEN as u64,
        })
    }
}

struct Writer {
    shared: Arc<Shared>,
    path: PathBuf,
    /// Most bytes in one segment.
    limit: u64,
    segment: Option<Segment>,
    streams: HashMap<u32, (String, String, f64)>,
    /// Streams defined in the current segment.
    defined_streams: Vec<u32>,
    /// Endpoint ids of the current segment, by address.
    endpoints: HashMap<String, u32>,
    buf: Vec<u8>,
    dirty: bool,
    /// A stop was met while looking for definitions.
    stopping: bool,
    /// Flush requests to answer after the current drain.
    acks: Vec<Sender<()>>,
}

impl Writer {
    fn run(&mut self, rx: &Receiver<Control>) {
        loop {
            match rx.recv_timeout(DRAIN_PERIOD) {
                Ok(Control::Stream {
                    id,
                    service,
                    strategy,
                    sample_rate,
                }) => {
                    self.streams.insert(id, (service, strategy, sample_rate));
                }
                Ok(Control::Flush(a)) => self.acks.push(a),
                Ok(Control::Stop) | Err(RecvTimeoutError::Disconnected) => self.stopping = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.drain(rx);
            if self.dirty || !self.acks.is_empty() || self.stopping {
                self.flush();
            }
            for a in self.acks.drain(..) {
                let _ = a.send(());
            }
            if self.stopping {
                return;
            }
        }
    }

    /// Write every queued record.
    fn drain(&mut self, rx: &Receiver<Control>) {
        while let Some(record) = self.shared.queue.pop() {
            if !self.streams.contains_key(&record.stream) {
                self.take_definitions(rx);
            }
            self.write(&record);
        }
    }

    /// Stream definitions waiting in the channel. A flush request or a stop met here is kept
    /// for the loop, which answers it once the drain under way is written and flushed.
    fn take_definitions(&mut self, rx: &Receiver<Control>) {
        while let Ok(c) = rx.try_recv() {
            match c {
                Control::Stream {
                    id,
                    service,
                    strategy,
                    sample_rate,
                } => {
                    self.streams.insert(id, (service, strategy, sample_rate));
                }
                Control::Flush(ack) => self.acks.push(ack),
                Control::Stop => self.stopping = true,
            }
        }
    }

    fn write(&mut self, r: &AttemptRecord) {
        self.encode(r);
        let fits = |s: &Segment, n: usize| s.len + n as u64 <= self.limit;
        if let Some(seg) = &self.segment {
            if !fits(seg, self.buf.len()) && seg.len > HEADER_LEN as u64 {
                self.rotate();
                self.encode(r);
            }
        }
        let Some(seg) = &mut self.segment else {
            self.shared.lost.fetch_add(1, Relaxed);
            return;
        };
        match seg.out.write_all(&self.buf) {
            Ok(()) => {
                seg.len += self.buf.len() as u64;
                self.dirty = true;
                self.shared.written.fetch_add(1, Relaxed);
                self.shared.bytes.fetch_add(self.buf.len() as u64, Relaxed);
            }
            Err(e) => self.failed(&e),
        }
    }

    /// Put `r`, with the definitions it needs in this segment, into `buf`.
    fn encode(&mut self, r: &AttemptRecord) {
        self.buf.clear();
        if !self.defined_streams.contains(&r.stream) {
            let (service, strategy, rate) = self
                .streams
                .get(&r.stream)
                .map_or(("?", "?", 0.0), |(a, b, c)| (a.as_str(), b.as_str(), *c));
            self.buf.push(KIND_STREAM);
            self.buf.extend_from_slice(&r.stream.to_le_bytes());
            put_str(&mut self.buf, service);
            put_str(&mut self.buf, strategy);
            self.buf.extend_from_slice(&rate.to_le_bytes());
            self.defined_streams.push(r.stream);
        }
        let address = r.endpoint.address();
        let endpoint = match self.endpoints.get(address) {
            Some(&id) => id,
            None => {
                let id = self.endpoints.len() as u32;
                self.endpoints.insert(address.to_owned(), id);
                self.buf.push(KIND_ENDPOINT);
                self.buf.extend_from_slice(&id.to_le_bytes());
                put_str(&mut self.buf, address);
                id
            }
        };
        let mut flags = 0;
        if r.attempt > 0 {
            flags |= FLAG_RETRY;
        }
        if r.hedge {
            flags |= FLAG_HEDGE;
        }
        RawAttempt {
            picked_at_ns: r.picked_at.as_nanos(),
            latency_ns: r
                .finished_at
                .as_nanos()
                .saturating_sub(r.picked_at.as_nanos()),
            request: r.request,
            stream: r.stream,
            endpoint,
            in_flight: r.in_flight,
            attempt: u16::try_from(r.attempt).unwrap_or(u16::MAX),
            outcome: TraceOutcome::from(r.outcome).code(),
            flags,
        }
        .put(&mut self.buf);
    }

    /// `PATH` becomes `PATH.1`; a new `PATH` starts with no definitions.
    fn rotate(&mut self) {
        self.flush();
        self.segment = None;
        self.defined_streams.clear();
        self.endpoints.clear();
        match Segment::start(&self.path) {
            Ok(s) => {
                self.segment = Some(s);
                self.shared.rotations.fetch_add(1, Relaxed);
                self.shared.bytes.fetch_add(HEADER_LEN as u64, Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "lbkit trace: cannot start a new segment; records are lost until one starts")
            }
        }
    }

    fn flush(&mut self) {
        if let Some(seg) = &mut self.segment {
            if let Err(e) = seg.out.flush() {
                let e = TraceError::io(&self.path, e);
                tracing::warn!(error = %e, "lbkit trace: flush failed");
            }
        }
        self.dirty = false;
    }

    fn failed(&mut self, e: &std::io::Error) {
        let lost = self.shared.lost.fetch_add(1, Relaxed);
        if lost.is_power_of_two() || lost == 0 {
            tracing::warn!(path = %self.path.display(), error = %e, lost = lost + 1, "lbkit trace: write failed; the record is lost");
        }
    }
}
