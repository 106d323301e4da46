//! A TCP relay whose connections can go silent: [`Relay::freeze`] stops every connection open
//! at that moment from moving bytes either way while keeping both sockets open, as a host that
//! vanished behind a network partition looks to its peers (no `FIN`, no reset, no answer);
//! [`Relay::cut`] closes them, as a crash of the target does, while the relay keeps listening
//! (a test of a target that comes back then needs no second bind of its port, which another
//! socket of a busy machine may hold meanwhile). Connections made after either are relayed as
//! before.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A relay on a loopback port in front of one address. Stops on drop (its connections too).
#[derive(Debug)]
pub struct Relay {
    /// The address to give clients instead of the target's.
    pub addr: SocketAddr,
    /// Freezes so far; a connection freezes when this passes the count it was made under.
    freezes: watch::Sender<u64>,
    /// Cuts so far, the same way.
    cuts: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Relay {
    /// A relay to `target`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("its address");
        let (freezes, watching) = watch::channel(0);
        let (cuts, cut_watch) = watch::channel(0);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue; // dropping the client's socket refuses it
                };
                let (mut frozen, mut cut) = (watching.clone(), cut_watch.clone());
                let made_under = *frozen.borrow_and_update();
                let cut_under = *cut.borrow_and_update();
                connections.spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = async { tokio::join!(copy(&mut cr, &mut sw), copy(&mut sr, &mut cw)) } => {}
                        () = async { drop(frozen.wait_for(|&n| n > made_under).await) } => {
                            // Silent until cut, both sockets held open.
                            drop(cut.wait_for(|&n| n > cut_under).await);
                        }
                        () = async { drop(cut.wait_for(|&n| n > cut_under).await) } => {}
                    }
                });
            }
        });
        Relay {
            addr,
            freezes,
            cuts,
            task,
        }
    }

    /// Make every connection open now go silent (see the module docs).
    pub fn freeze(&self) {
        self.freezes.send_modify(|n| *n += 1);
    }

    /// Close every connection open now, both sides (see the module docs).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Move bytes from `from` to `to` until either ends, then close `to`'s writing side.
async fn copy(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}
