//! A TCP shim in front of a real ZooKeeper server, for faults the server itself cannot be made
//! to show: [`ZkShim::older_than_3_6`] answers the requests ZooKeeper 3.6 added as a 3.4 or 3.5
//! server does (`UNIMPLEMENTED`, then the connection closed — `UnimplementedRequestProcessor`
//! in ZooKeeper's own source; the session lives on), and [`ZkShim::cut`] closes every
//! connection at once, as a network blip does (the sessions live on).
//!
//! It reads ZooKeeper's framing only (a 4-byte length before every packet, a request header of
//! `xid` and `type` after the first packet of a connection); everything else passes untouched.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

/// Request types ZooKeeper 3.6 and later added: multiRead, getEphemerals,
/// getAllChildrenNumber, setWatches2, addWatch, whoAmI.
const NEWER_OPS: [i32; 6] = [22, 103, 104, 105, 106, 107];
/// `KeeperException.Code.UNIMPLEMENTED`.
const UNIMPLEMENTED: i32 = -6;
/// Largest packet relayed (ZooKeeper's `jute.maxbuffer` default is about 1 MiB).
const MAX_PACKET: usize = 4 << 20;

/// A shim listening on a loopback port. Stops on drop.
#[derive(Debug)]
pub struct ZkShim {
    /// The address to give clients instead of the server's.
    pub addr: SocketAddr,
    refused: Arc<AtomicU64>,
    cut: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl ZkShim {
    /// A shim that passes everything through to `server` (`host:port`).
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(server: &str) -> io::Result<ZkShim> {
        ZkShim::spawn(server, false).await
    }

    /// A shim that makes `server` look older than 3.6 (see the module docs).
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn older_than_3_6(server: &str) -> io::Result<ZkShim> {
        ZkShim::spawn(server, true).await
    }

    async fn spawn(server: &str, old: bool) -> io::Result<ZkShim> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let refused = Arc::new(AtomicU64::new(0));
        let (cut, cuts) = watch::channel(0);
        let (server, count) = (server.to_owned(), refused.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(&server).await else {
                    continue;
                };
                let conn = Conn {
                    old,
                    refused: count.clone(),
                    cuts: cuts.clone(),
                };
                tokio::spawn(conn.relay(client, upstream));
            }
        });
        Ok(ZkShim {
            addr,
            refused,
            cut,
            task,
        })
    }

    /// Requests answered `UNIMPLEMENTED` so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// Close every connection open now (new ones are relayed as before).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for ZkShim {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

struct Conn {
    old: bool,
    refused: Arc<AtomicU64>,
    cuts: watch::Receiver<u64>,
}

impl Conn {
    async fn relay(mut self, client: TcpStream, upstream: TcpStream) {
        self.cuts.mark_unchanged();
        let (mut from_client, to_client) = client.into_split();
        let (mut from_server, mut to_server) = upstream.into_split();
        let to_client = Arc::new(Mutex::new(to_client));
        let zxid = Arc::new(AtomicI64::new(0));
        // Server to client, packet by packet, noting the last zxid for forged replies.
        let down = {
            let (to_client, zxid) = (to_client.clone(), zxid.clone());
            async move {
                let mut first = true;
                while let Ok(packet) = read_packet(&mut from_server).await {
                    // After the connect response: reply header = xid, zxid, err.
                    if !first && packet.len() >= 16 {
                        let z = i64::from_be_bytes(packet[8..16].try_into().expect("8 bytes"));
                        zxid.fetch_max(z, Ordering::SeqCst);
                    }
                    first = false;
                    if to_client.lock().await.write_all(&packet).await.is_err() {
                        break;
                    }
                }
            }
        };
        let up = async {
            let mut first = true;
            while let Ok(packet) = read_packet(&mut from_client).await {
                // After the connect request: request header = xid, type.
                if self.old && !first && packet.len() >= 12 {
                    let xid = i32::from_be_bytes(packet[4..8].try_into().expect("4 bytes"));
                    let op = i32::from_be_bytes(packet[8..12].try_into().expect("4 bytes"));
                    if NEWER_OPS.contains(&op) {
                        self.refused.fetch_add(1, Ordering::SeqCst);
                        let mut reply = Vec::with_capacity(20);
                        reply.extend_from_slice(&16u32.to_be_bytes());
                        reply.extend_from_slice(&xid.to_be_bytes());
                        reply.extend_from_slice(&zxid.load(Ordering::SeqCst).to_be_bytes());
                        reply.extend_from_slice(&UNIMPLEMENTED.to_be_bytes());
                        let mut w = to_client.lock().await;
                        let _ = w.write_all(&reply).await;
                        let _ = w.shutdown().await;
                        return;
                    }
                }
                first = false;
                if to_server.write_all(&packet).await.is_err() {
                    return;
                }
            }
        };
        let cut = self.cuts.changed();
        tokio::select! {
            () = down => {}
            () = up => {}
            _ = cut => {}
        }
        // Dropping both halves of both sockets closes the connections.
    }
}

/// One packet with its length prefix.
async fn read_packet<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_PACKET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "packet too large",
        ));
    }
    let mut packet = vec![0u8; 4 + n];
    packet[..4].copy_from_slice(&len);
    r.read_exact(&mut packet[4..]).await?;
    Ok(packet)
}
