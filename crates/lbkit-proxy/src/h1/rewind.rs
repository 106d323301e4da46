//! The stream hyper gets when the fast path hands a connection over.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::watchdog::Activity;

/// A connection whose first bytes were already read: they are read again first. What hyper
/// gets when the fast path hands a connection over.
///
/// A write that cannot progress for `stall` fails with `TimedOut` (nginx's `send_timeout`: the
/// limit is between two successive writes, not on the whole answer), so a client that stops
/// reading does not pin the connection, nor the upstream connection its answer streams from.
/// Every byte read or written counts in the connection's [`Activity`], for its watchdog.
#[derive(Debug)]
pub(crate) struct Rewind {
    read: Bytes,
    stream: TcpStream,
    stall: Duration,
    /// The stall timer, made at the first write that waits and reset at each later one.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether a write is waiting (the timer runs).
    waiting: bool,
    activity: Arc<Activity>,
}

impl Rewind {
    pub(crate) fn new(
        read: Bytes,
        stream: TcpStream,
        stall: Duration,
        activity: Arc<Activity>,
    ) -> Self {
        Rewind {
            read,
            stream,
            stall,
            timer: None,
            waiting: false,
            activity,
        }
    }

    /// The outcome of a write attempt: progress disarms the stall timer, waiting arms it, and
    /// waiting past `stall` is an error.
    fn stalled<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.waiting = false;
            return polled;
        }
        let timer = match (&mut self.timer, self.waiting) {
            (Some(timer), true) => timer,
            (slot, _) => {
                self.waiting = true;
                let deadline = Instant::now() + self.stall;
                match slot {
                    Some(timer) => {
                        timer.as_mut().reset(deadline);
                        timer
                    }
                    None => slot.insert(Box::pin(tokio::time::sleep_until(deadline))),
                }
            }
        };
        if timer.as_mut().poll(cx).is_ready() {
            self.waiting = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no data for the route timeout",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.has_remaining() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read[..n]);
            this.read.advance(n);
            this.activity.moved(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.activity.moved(buf.filled().len() - before);
        polled
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            this.activity.moved(n);
        }
        this.stalled(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.activity.moved(n);
        }
        this.stalled(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
