//! A recording TCP proxy for tests: forwards every connection to a backend on loopback and keeps
//! a copy of what clients sent, so a test can check what actually went over the wire (e.g. that
//! STS received the pod's token) when the backend itself does not say.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy on 127.0.0.1; stops accepting when dropped.
pub struct TeeProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    sent: Arc<Mutex<Vec<u8>>>,
    accept: JoinHandle<()>,
}

impl TeeProxy {
    /// Proxies to `backend`.
    pub async fn start(backend: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&sent);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(backend).await {
                        relay(client, server, record).await;
                    }
                });
            }
        });
        Self { addr, sent, accept }
    }

    /// Everything clients have sent so far, as text (lossy).
    pub fn sent_text(&self) -> String {
        String::from_utf8_lossy(&self.sent.lock().unwrap()).into_owned()
    }
}

impl Drop for TeeProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways until either side closes, recording the client's bytes.
async fn relay(client: TcpStream, server: TcpStream, record: Arc<Mutex<Vec<u8>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}
