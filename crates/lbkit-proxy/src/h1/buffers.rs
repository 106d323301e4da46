//! The buffers of one exchange, lent by the thread while a request is served.

use std::cell::RefCell;

use super::wire::Hdr;

/// Spare exchange buffers kept per thread (enough for the requests in flight on a busy worker;
/// more are dropped when given back).
const SPARE_BUFFERS: usize = 512;

/// Buffers larger than this are not kept (one large answer should not pin its memory).
const MAX_KEPT_BUFFER: usize = 256 * 1024;

thread_local! {
    static SPARE: RefCell<Vec<Buffers>> = const { RefCell::new(Vec::new()) };
}

/// The buffers of one exchange: lent by the thread for the time a request is served, so an
/// idle keep-alive connection holds none of them (nginx's model; ≈ 20 KiB per connection
/// otherwise).
#[derive(Debug, Default)]
pub(super) struct Buffers {
    /// The request as sent upstream.
    pub(super) upstream: Vec<u8>,
    /// Bytes read from the upstream.
    pub(super) response: Vec<u8>,
    /// Bytes for the client.
    pub(super) output: Vec<u8>,
    pub(super) resp_headers: Vec<Hdr>,
}

/// Buffers for one exchange: spare ones of this thread, or new (empty) ones.
pub(super) fn lend() -> Buffers {
    SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
}

/// Return an exchange's buffers to this thread.
pub(super) fn give_back(mut b: Buffers) {
    let big = [
        b.upstream.capacity(),
        b.response.capacity(),
        b.output.capacity(),
    ]
    .into_iter()
    .any(|c| c > MAX_KEPT_BUFFER);
    if big {
        return;
    }
    b.upstream.clear();
    b.response.clear();
    b.output.clear();
    b.resp_headers.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_BUFFERS {
            s.push(b);
        }
    });
}

/// Keep at least `free` bytes of spare capacity (no zeroing: reads fill it).
pub(super) fn reserve(buf: &mut Vec<u8>, free: usize) {
    if buf.capacity() - buf.len() < free {
        buf.reserve(free);
    }
}
