//! Idle limits of byte streams (upgraded tunnels, TCP relays): both sides count the bytes they
//! read into one counter, and a watcher ends the stream once it has not moved for the limit.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Resolves once `moved` has not changed for `idle` (checked every quarter of it).
pub(crate) async fn quiet_for(moved: &AtomicU64, idle: Duration) {
    let tick = (idle / 4).max(Duration::from_millis(1));
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seen, mut quiet) = (moved.load(Ordering::Relaxed), Duration::ZERO);
    loop {
        interval.tick().await;
        let now = moved.load(Ordering::Relaxed);
        if now == seen {
            quiet += tick;
            if quiet >= idle {
                return;
            }
        } else {
            (seen, quiet) = (now, Duration::ZERO);
        }
    }
}

/// One side of a tunnel, counting the bytes read from it into a counter both sides share.
pub(crate) struct Counted<'a, T> {
    io: T,
    moved: &'a AtomicU64,
}

impl<'a, T> Counted<'a, T> {
    pub(crate) fn new(io: T, moved: &'a AtomicU64) -> Self {
        Counted { io, moved }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<'_, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.moved.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<'_, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_is_quiet_after_idle_without_bytes() {
        let moved = AtomicU64::new(0);
        let idle = Duration::from_secs(60);
        let start = tokio::time::Instant::now();
        let watch = quiet_for(&moved, idle);
        tokio::pin!(watch);
        // Bytes at 50 s push the end to at least 110 s.
        let traffic = async {
            tokio::time::sleep(Duration::from_secs(50)).await;
            moved.fetch_add(10, Ordering::Relaxed);
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = &mut watch => {}
            () = traffic => unreachable!(),
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(110) && took <= Duration::from_secs(135),
            "{took:?}"
        );
    }
}
