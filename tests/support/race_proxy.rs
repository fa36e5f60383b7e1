//! An HTTP/1.x proxy that lets a test land a write "between" two requests of the code under
//! test: when a request whose request line starts with a trigger arrives, the proxy first
//! sends its own raw request to the backend (and waits for the answer), then forwards the
//! client's. One request per connection: `Connection: close` is added to what is forwarded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A racing proxy on 127.0.0.1; stops accepting when dropped.
pub struct RaceProxy {
    /// `http://127.0.0.1:PORT`, where clients connect.
    pub url: String,
    raced: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl RaceProxy {
    /// Proxies to `backend`; before forwarding a request starting with `trigger`, sends
    /// `interloper` (a whole HTTP/1.0 request) to `backend` itself.
    pub async fn start(backend: SocketAddr, trigger: &str, interloper: Vec<u8>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let raced = Arc::new(AtomicUsize::new(0));
        let (count, trigger, interloper) = (Arc::clone(&raced), trigger.to_string(), interloper);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (count, trigger, interloper) =
                    (Arc::clone(&count), trigger.clone(), interloper.clone());
                tokio::spawn(async move {
                    let _ = relay(client, backend, &trigger, &interloper, &count).await;
                });
            }
        });
        Self { url, raced, accept }
    }

    /// How many times the interloper's request was sent.
    pub fn raced(&self) -> usize {
        self.raced.load(Ordering::SeqCst)
    }
}

impl Drop for RaceProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One request: read whole (head, then Content-Length bytes), raced if it matches, forwarded
/// with `Connection: close`, the answer copied back until the backend closes.
async fn relay(
    mut client: TcpStream,
    backend: SocketAddr,
    trigger: &str,
    interloper: &[u8],
    count: &AtomicUsize,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while request.len() < head_end + length {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    if head.starts_with(trigger) {
        let mut other = TcpStream::connect(backend).await?;
        other.write_all(interloper).await?;
        let mut answer = Vec::new();
        other.read_to_end(&mut answer).await?;
        count.fetch_add(1, Ordering::SeqCst);
    }
    // The head without its blank line, then one more header.
    let mut forwarded = head[..head_end - 2].to_string();
    forwarded.push_str("Connection: close\r\n\r\n");
    let mut server = TcpStream::connect(backend).await?;
    server.write_all(forwarded.as_bytes()).await?;
    server.write_all(&request[head_end..]).await?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer).await?;
    client.write_all(&answer).await
}
