//! An HTTP/2 client that writes its frames by hand (RFC 9113), for attack tests: what a
//! well-behaved client library never sends — streams reset a round trip after they opened,
//! a zero flow-control window, frames out of order — goes on the wire exactly as the test says.
//!
//! ```no_run
//! # async fn demo(addr: std::net::SocketAddr) -> std::io::Result<()> {
//! use lbkit_testkit::h2raw::{RawH2, GOAWAY};
//! let mut h2 = RawH2::connect(addr, &[]).await?;
//! let id = h2.request("GET", "/", true).await?;
//! h2.reset(id, 0x8).await?; // CANCEL
//! while let Some(frame) = h2.next_frame().await {
//!     if frame.kind == GOAWAY { break; }
//! }
//! # Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Frame types (RFC 9113 §6).
pub const DATA: u8 = 0;
/// `HEADERS`.
pub const HEADERS: u8 = 1;
/// `RST_STREAM`.
pub const RST_STREAM: u8 = 3;
/// `SETTINGS`.
pub const SETTINGS: u8 = 4;
/// `PING`.
pub const PING: u8 = 6;
/// `GOAWAY`.
pub const GOAWAY: u8 = 7;
/// `WINDOW_UPDATE`.
pub const WINDOW_UPDATE: u8 = 8;
/// `CONTINUATION`.
pub const CONTINUATION: u8 = 9;

/// `SETTINGS_INITIAL_WINDOW_SIZE`.
pub const INITIAL_WINDOW_SIZE: u16 = 4;

/// Error codes (RFC 9113 §7).
pub const CANCEL: u32 = 0x8;
/// `ENHANCE_YOUR_CALM`.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame as the server sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Its type.
    pub kind: u8,
    /// Its flags.
    pub flags: u8,
    /// Its stream.
    pub stream: u32,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a `GOAWAY` or `RST_STREAM`.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            GOAWAY => 4,
            RST_STREAM => 0,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Whether it ends its stream (`END_STREAM` on `HEADERS` or `DATA`).
    pub fn ends_stream(&self) -> bool {
        matches!(self.kind, DATA | HEADERS) && self.flags & 0x1 != 0
    }
}

/// A connection that speaks raw frames. The server's `SETTINGS` are acknowledged and its
/// `PING`s answered on their own; every frame the server sends is also handed to the test
/// ([`next_frame`](Self::next_frame)), and `None` once it closed.
#[derive(Debug)]
pub struct RawH2 {
    out: mpsc::UnboundedSender<Vec<u8>>,
    frames: mpsc::UnboundedReceiver<Frame>,
    next_stream: u32,
    authority: String,
    /// Whether the server's `PING`s are answered.
    pongs: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RawH2 {
    /// Connect to `addr` and send the preface and a `SETTINGS` frame with `settings`.
    ///
    /// # Errors
    /// When the connection cannot be made.
    pub async fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> io::Result<RawH2> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (mut rd, mut wr) = tcp.into_split();
        let (out, mut outgoing) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(bytes) = outgoing.recv().await {
                if wr.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        });
        let (tx, frames) = mpsc::unbounded_channel();
        let answers = out.clone();
        let pongs = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let answering = pongs.clone();
        tokio::spawn(async move {
            while let Ok(frame) = read_frame(&mut rd).await {
                let ack = frame.flags & 0x1 != 0;
                let pong = answering.load(std::sync::atomic::Ordering::Relaxed);
                if frame.kind == SETTINGS && !ack {
                    let _ = answers.send(encode(SETTINGS, 0x1, 0, &[]));
                } else if frame.kind == PING && !ack && pong {
                    let _ = answers.send(encode(PING, 0x1, 0, &frame.payload));
                }
                if tx.send(frame).is_err() {
                    break;
                }
            }
        });
        let mut first = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let payload: Vec<u8> = settings
            .iter()
            .flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes()))
            .collect();
        first.extend(encode(SETTINGS, 0, 0, &payload));
        send(&out, first)?;
        Ok(RawH2 {
            out,
            frames,
            next_stream: 1,
            authority: addr.to_string(),
            pongs,
        })
    }

    /// Open a stream: `HEADERS` for `method` on `path`, ending the stream when `end`. Returns
    /// its id.
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn request(&mut self, method: &str, path: &str, end: bool) -> io::Result<u32> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut block = Vec::new();
        for (name, value) in [
            (":method", method),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority.as_str()),
        ] {
            literal(&mut block, name, value);
        }
        // END_HEADERS, and END_STREAM when asked.
        let flags = 0x4 | u8::from(end);
        send(&self.out, encode(HEADERS, flags, id, &block))?;
        Ok(id)
    }

    /// Stop answering the server's `PING`s (a graceful `GOAWAY` then waits for its round trip
    /// before it names the last stream it took).
    pub fn stop_answering_pings(&self) {
        self.pongs
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// `RST_STREAM` for `stream` with `code`.
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn reset(&mut self, stream: u32, code: u32) -> io::Result<()> {
        send(
            &self.out,
            encode(RST_STREAM, 0, stream, &code.to_be_bytes()),
        )
    }

    /// `PING` with `data`.
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn ping(&mut self, data: [u8; 8]) -> io::Result<()> {
        send(&self.out, encode(PING, 0, 0, &data))
    }

    /// `WINDOW_UPDATE` of `stream` (0: the connection) by `n`.
    ///
    /// # Errors
    /// When the connection is gone.
    pub async fn window_update(&mut self, stream: u32, n: u32) -> io::Result<()> {
        send(
            &self.out,
            encode(WINDOW_UPDATE, 0, stream, &n.to_be_bytes()),
        )
    }

    /// Send `bytes` as they are (frames of the test's own making: [`encode`]).
    ///
    /// # Errors
    /// When the connection is gone.
    pub fn raw(&mut self, bytes: Vec<u8>) -> io::Result<()> {
        send(&self.out, bytes)
    }

    /// The next frame the server sent; `None` once the connection closed.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        self.frames.recv().await
    }

    /// Frames until one matches `what`, which is returned; `None` when the connection closed
    /// first.
    pub async fn until(&mut self, mut what: impl FnMut(&Frame) -> bool) -> Option<Frame> {
        while let Some(frame) = self.next_frame().await {
            if what(&frame) {
                return Some(frame);
            }
        }
        None
    }
}

fn send(out: &mpsc::UnboundedSender<Vec<u8>>, bytes: Vec<u8>) -> io::Result<()> {
    out.send(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "connection gone"))
}

/// A frame's bytes: the 9-byte head, then `payload`.
pub fn encode(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a frame under 16 MB");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend((stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK "literal header field without indexing — new name" with short, plain strings
/// (RFC 7541 §6.2.2): nothing is added to the dynamic table.
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0);
    for s in [name, value] {
        let len = u8::try_from(s.len()).ok().filter(|&n| n < 127);
        block.push(len.expect("a string under 127 bytes"));
        block.extend_from_slice(s.as_bytes());
    }
}

async fn read_frame(rd: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Frame> {
    let mut head = [0u8; 9];
    rd.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; len];
    rd.read_exact(&mut payload).await?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        stream,
        payload,
    })
}
