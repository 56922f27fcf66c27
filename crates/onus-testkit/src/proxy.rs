//! A loopback TCP proxy that can freeze: while frozen it accepts and reads but forwards nothing,
//! so the connections through it hang the way a partitioned network or a stuck middlebox makes
//! them hang (no reset, no error: the kernel even acknowledges what the client sends). It can
//! also cut: close every connection through it and refuse new ones, as a database that went
//! away does, until it is restored.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; dropped, it stops accepting (open connections end with their peers).
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    frozen: Arc<watch::Sender<bool>>,
    cut: Arc<watch::Sender<bool>>,
    accept: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let frozen = Arc::new(watch::Sender::new(false));
        let cut = Arc::new(watch::Sender::new(false));
        let (f, c) = (frozen.clone(), cut.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *c.borrow() {
                    drop(client); // cut: refused at once
                    continue;
                }
                let (f, c) = (f.clone(), c.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::spawn(pipe(cr, sw, f.subscribe(), c.subscribe()));
                        tokio::spawn(pipe(sr, cw, f.subscribe(), c.subscribe()));
                    }
                });
            }
        });
        Ok(TcpProxy {
            addr,
            frozen,
            cut,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding, in both directions, on every connection (new ones too).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again (what was read meanwhile is delivered).
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Closes every connection through the proxy and closes new ones at once, until
    /// [`TcpProxy::restore`]: the database is gone.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Accepts and forwards new connections again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = cut.wait_for(|c| *c) => return, // both halves dropped: the connection closes
        };
        tokio::select! {
            r = frozen.wait_for(|f| !*f) => if r.is_err() { break },
            _ = cut.wait_for(|c| *c) => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
