//! A backend run by a hostile tenant: a plain HTTP server on loopback that answers every request
//! the same way, either with an endless body or with a fixed status and body (for forged error
//! messages). It stands in for a Vault server or an AWS endpoint that a SecretStore names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the server answers.
#[derive(Clone, Debug)]
pub enum Answer {
    /// `200 OK`, chunked, and bytes until the client hangs up (at most 3 GiB).
    Endless,
    /// `200 OK` announcing a 3 GiB `content-length`, then bytes until the client hangs up.
    HugeLength,
    /// This status and JSON body.
    Fixed(u16, String),
}

/// A running hostile backend; stops when dropped.
pub struct Hostile {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    requests: Arc<AtomicUsize>,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Most bytes one answer streams.
const MAX_STREAM: u64 = 3 << 30;

impl Hostile {
    /// Starts a server answering every request with `answer`.
    pub async fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let (r, s) = (Arc::clone(&requests), Arc::clone(&sent));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (answer, r, s) = (answer.clone(), Arc::clone(&r), Arc::clone(&s));
                tokio::spawn(async move {
                    let _ = serve(stream, &answer, &r, &s).await;
                });
            }
        });
        Self {
            url,
            requests,
            sent,
            task,
        }
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Body bytes written so far, over all answers.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

/// A KV v2 answer of `keys` keys `{"k000000":"vvv...",...}`, each value `value_len` bytes:
/// ~14 bytes a key with 1-byte values (14 MB for a million, under the 16 MiB byte cap).
pub fn many_keys_answer(keys: usize, value_len: usize) -> String {
    let value = "v".repeat(value_len);
    let mut data = String::with_capacity(keys * (13 + value_len) + 200);
    data.push_str(r#"{"data":{"data":{"#);
    for i in 0..keys {
        if i > 0 {
            data.push(',');
        }
        data.push_str(&format!("\"k{i:06}\":\"{value}\""));
    }
    data.push_str(
        r#"},"metadata":{"created_time":"2026-11-28T00:00:00Z","deletion_time":"","custom_metadata":null,"destroyed":false,"version":1}},"lease_id":"","lease_duration":0,"renewable":false,"request_id":"r"}"#,
    );
    data
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (headers and a `content-length` body) and answers it; keeps the
/// connection for further requests.
async fn serve(
    mut stream: TcpStream,
    answer: &Answer,
    requests: &AtomicUsize,
    sent: &AtomicU64,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        // Headers.
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < end + length {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..end + length);
        requests.fetch_add(1, Ordering::SeqCst);
        match answer {
            Answer::Fixed(status, body) => {
                let head = format!(
                    "HTTP/1.1 {status} Hostile\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n",
                    body.len()
                );
                stream.write_all(head.as_bytes()).await?;
                stream.write_all(body.as_bytes()).await?;
            }
            Answer::Endless => {
                let chunk = vec![b' '; 64 << 10];
                let framed = [
                    format!("{:x}\r\n", chunk.len()).into_bytes(),
                    chunk,
                    b"\r\n".to_vec(),
                ]
                .concat();
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                return stream_forever(&mut stream, head, &framed, sent).await;
            }
            Answer::HugeLength => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {MAX_STREAM}\r\n\r\n"
                );
                return stream_forever(&mut stream, &head, &vec![b' '; 64 << 10], sent).await;
            }
        }
    }
}

/// Writes `head`, then `piece` again and again until the client hangs up or [`MAX_STREAM`]
/// bytes are out.
async fn stream_forever(
    stream: &mut TcpStream,
    head: &str,
    piece: &[u8],
    sent: &AtomicU64,
) -> std::io::Result<()> {
    stream.write_all(head.as_bytes()).await?;
    let mut total = 0;
    while total < MAX_STREAM {
        stream.write_all(piece).await?;
        total += piece.len() as u64;
        sent.fetch_add(piece.len() as u64, Ordering::SeqCst);
    }
    Ok(())
}
