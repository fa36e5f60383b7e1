//! The CSI socket's connections, watched by the runtime for reads only.
//!
//! A socket registered for writes too (what `tokio::net::UnixStream` does) gets an
//! edge-triggered "writable" event each time the peer reads what was written to it: a unix
//! socket signals freed buffer space on every read. Each of those events woke a parked runtime
//! worker that found nothing to do, after every answer and every h2 acknowledgement, just when
//! kubelet's thread wants a CPU to read the answer (2.1 context switches of the agent per warm
//! publish, 1.5 without them: docs/benchmarks.md). A CSI answer is a few hundred bytes and fits
//! the socket buffer, so a write almost never has to wait: here a connection is registered for
//! reads only, and only a write that would block registers a duplicate of the descriptor for
//! writability, dropped again once the write went through. A read that leaves room in h2's
//! buffer has emptied the socket, so the next read waits for epoll instead of being made and
//! answered EAGAIN (one system call less per request). Nobody asks who the peer is (the socket
//! is 0600), so no peer address or credentials are read either. kubelet dials a connection for
//! every call, so a connection is accepted non-blocking in one `accept4(2)` rather than made
//! non-blocking by a second system call.
//!
//! Not for TLS or TCP: kubelet reaches CSI drivers on a unix socket only.

use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

/// Connections accepted on a listening unix socket, each a [`Connection`].
pub struct Incoming {
    listener: AsyncFd<UnixListener>,
}

impl Incoming {
    /// Accepts on `listener` (made non-blocking here); must be called within the runtime.
    pub fn new(listener: UnixListener) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener: register(listener, Interest::READABLE)?,
        })
    }
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let mut ready = ready!(self.listener.poll_read_ready(cx))?;
            if let Ok(accepted) = ready.try_io(|listener| accept_non_blocking(listener.get_ref())) {
                return Poll::Ready(Some(accepted.and_then(Connection::new)));
            }
        }
    }
}

/// Accepts one connection, already non-blocking and close-on-exec.
fn accept_non_blocking(listener: &UnixListener) -> io::Result<UnixStream> {
    // libc rather than a crate feature (rustix's or nix's `net`): a dependency's changed features
    // change the symbol names of every crate above it, which makes agent/link's code layout stale.
    loop {
        // SAFETY: the listener's descriptor is open for the call; a null address and length are
        // what accept4(2) takes for "the peer's address is not wanted".
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            return Ok(unsafe { UnixStream::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        // As std's accept: a signal that interrupted the call is not the caller's error.
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One accepted connection: reads wait on the runtime, writes are made directly.
pub struct Connection {
    stream: AsyncFd<UnixStream>,
    /// A duplicate of the descriptor, registered for writability only while a write would block.
    writable: Option<AsyncFd<UnixStream>>,
    /// How many writes had to wait for room, for tests to see that the waiting path ran.
    #[cfg(test)]
    waits: u32,
    /// How many `read(2)` calls were made, for tests to see that a drained socket is not read.
    #[cfg(test)]
    reads: u32,
}

impl Connection {
    /// Watches `stream`, which must be non-blocking already.
    fn new(stream: UnixStream) -> io::Result<Self> {
        Ok(Self {
            stream: register(stream, Interest::READABLE)?,
            writable: None,
            #[cfg(test)]
            waits: 0,
            #[cfg(test)]
            reads: 0,
        })
    }

    /// Runs `write` until it does not block, waiting for writability in between.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&UnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            if let Some(writable) = &self.writable {
                let mut ready = ready!(writable.poll_write_ready(cx))?;
                let Ok(written) = ready.try_io(|fd| write(fd.get_ref())) else {
                    continue;
                };
                drop(ready);
                // The buffer had room again: back to reads only.
                self.writable = None;
                return Poll::Ready(written);
            }
            match write(self.stream.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Registering reports writability that arrived since the failed write, so
                    // no wake-up can be missed in between.
                    let duplicate = self.stream.get_ref().try_clone()?;
                    self.writable = Some(register(duplicate, Interest::WRITABLE)?);
                    #[cfg(test)]
                    {
                        self.waits += 1;
                    }
                }
                done => return Poll::Ready(done),
            }
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // h2 hands over a fresh, uninitialised 8 KiB buffer for every read; zeroing it first (what
        // `Read::read` would need) is work on every request, so the kernel writes into it
        // directly, as tokio's own sockets do.
        // SAFETY: only a pointer and a length are taken here; nothing is de-initialised.
        let unfilled = unsafe { buf.unfilled_mut() };
        let (into, room) = (unfilled.as_mut_ptr().cast::<libc::c_void>(), unfilled.len());
        let this = self.get_mut();
        loop {
            let mut ready = ready!(this.stream.poll_read_ready(cx))?;
            let read = ready.try_io(|fd| {
                // SAFETY: `into` points to `room` writable bytes of `buf`, which outlives the call.
                let read = unsafe { libc::read(fd.as_raw_fd(), into, room) };
                usize::try_from(read).map_err(|_| io::Error::last_os_error())
            });
            #[cfg(test)]
            {
                this.reads += 1;
            }
            match read {
                Ok(Ok(read)) => {
                    // A read that left room in the buffer emptied the socket. Without this, the
                    // next poll (h2 reads until Pending, so there always is one) would be one more
                    // `read(2)` per request, answered EAGAIN, before the request is handled. Data
                    // arriving after the read is not missed: epoll reports it, and tokio keeps the
                    // readiness an event newer than this read's has set.
                    if read > 0 && read < room {
                        ready.clear_ready();
                    }
                    // SAFETY: the kernel has written the first `read` bytes.
                    unsafe { buf.assume_init(read) };
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |mut stream| stream.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |mut stream| stream.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Nothing is buffered here: every write went to the socket.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.stream.get_ref().shutdown(Shutdown::Write))
    }
}

/// Registers `io` (std's `UnixListener` or `UnixStream`) with the runtime for `interest` only;
/// must be called within the runtime.
fn register<T: AsRawFd>(io: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: the callers pass std sockets, which own their descriptor. The `AsyncFd` owns `io`
    // and hands out shared references only, so the descriptor stays open and the same until it
    // is dropped.
    unsafe { AsyncFd::register_with_interest(io, interest) }.map_err(|e| e.into_parts().1)
}

impl Connected for Connection {
    /// Nothing: no handler asks who is calling (the socket is 0600, so only root can call).
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::pin::Pin;
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    use super::{Connection, Incoming};

    /// The events the runtime's epoll instances watch `fd` for (`None`: not registered).
    fn epoll_events(fd: i32) -> Option<u32> {
        let mut found = None;
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let is_epoll = std::fs::read_link(entry.path())
                .is_ok_and(|l| l.to_string_lossy() == "anon_inode:[eventpoll]");
            if !is_epoll {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                entry.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            for line in info.lines() {
                let mut words = line.split_whitespace();
                if words.next() == Some("tfd:") && words.next() == Some(&fd.to_string()) {
                    let events = words.skip_while(|w| *w != "events:").nth(1).unwrap();
                    found = Some(u32::from_str_radix(events, 16).unwrap());
                }
            }
        }
        found
    }

    /// A connection on one end of a socket pair, made non-blocking as an accepted one is.
    fn non_blocking(stream: UnixStream) -> Connection {
        stream.set_nonblocking(true).unwrap();
        Connection::new(stream).unwrap()
    }

    const EPOLLIN: u32 = 0x1;
    const EPOLLOUT: u32 = 0x4;

    #[tokio::test]
    async fn an_accepted_connection_is_watched_for_reads_only_and_answers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let mut incoming = Incoming::new(UnixListener::bind(&path).unwrap()).unwrap();
        let mut client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut server = incoming.next().await.unwrap().unwrap();

        let events = epoll_events(server.stream.as_raw_fd()).expect("registered");
        assert_eq!(events & (EPOLLIN | EPOLLOUT), EPOLLIN, "{events:#x}");
        // Accepted non-blocking and close-on-exec, by the accept itself.
        let fd = server.stream.get_ref();
        assert!(
            rustix::fs::fcntl_getfl(fd)
                .unwrap()
                .contains(rustix::fs::OFlags::NONBLOCK)
        );
        assert!(
            rustix::io::fcntl_getfd(fd)
                .unwrap()
                .contains(rustix::io::FdFlags::CLOEXEC)
        );

        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        server.write_all(b"pong").await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(server.waits, 0);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"pong");
        assert!(server.writable.is_none());
    }

    #[tokio::test]
    async fn a_read_that_empties_the_socket_is_not_followed_by_one_that_finds_nothing() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut conn = non_blocking(ours);
        peer.write_all(b"request").unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 7);
        assert_eq!(conn.reads, 1);
        // The socket is empty: asking again waits for epoll instead of reading.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut again = tokio::io::ReadBuf::new(&mut buf);
        assert!(
            Pin::new(&mut conn)
                .poll_read(&mut cx, &mut again)
                .is_pending()
        );
        assert_eq!(conn.reads, 1);
        // What arrives later is still read, and a read that fills the buffer keeps reading.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            peer.write_all(&[7u8; 100]).unwrap();
            peer
        });
        let mut got = Vec::new();
        while got.len() < 100 {
            let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
                .await
                .expect("data written after the socket was emptied was never read")
                .unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, [7u8; 100]);
        drop(writer.join().unwrap());
        // End of stream stays readable.
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_would_block_waits_for_room_and_then_stops_watching_for_it() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut conn = non_blocking(ours);
        // Far more than a unix socket buffers, so writes block until the peer reads.
        let sent: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                std::thread::sleep(Duration::from_millis(1));
                match peer.read(&mut chunk).unwrap() {
                    0 => return got,
                    n => got.extend_from_slice(&chunk[..n]),
                }
            }
        });
        conn.write_all(&sent).await.unwrap();
        assert!(conn.waits > 0, "the socket never filled up");
        assert!(conn.writable.is_none());
        let events = epoll_events(conn.stream.as_raw_fd()).expect("registered");
        assert_eq!(events & EPOLLOUT, 0, "{events:#x}");
        conn.shutdown().await.unwrap();
        assert_eq!(reader.join().unwrap(), sent);
    }
}
