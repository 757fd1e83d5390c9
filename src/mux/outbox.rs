//! [`Outbox`], the writer of a descriptor that one task sends lines to
//! without waiting (a child's stdin, a host's socket), and [`Refused`],
//! why it would not take a message.
//!
//! What the descriptor takes now is written at once; the rest is queued in
//! order for a writer task, up to a limit (`Refused::Full`, or
//! `Refused::Closed` once a write failed). The writer task and its channel
//! are made the first time a message has to wait, so an idle session's
//! outboxes hold neither. `send_slice` takes bytes the caller keeps, copied
//! only if they wait.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use super::message::Message;

/// A descriptor written to without waiting (pipes, sockets).
pub trait TryWrite: Send + Sync + 'static {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize>;
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Ends the stream both ways now, where it can be (a socket): the
    /// peer sees the end at once, and a write waiting for it fails.
    fn shutdown(&self) {}
}

macro_rules! try_write_sink {
    ($t:ty) => {
        impl TryWrite for $t {
            fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
                <$t>::try_write(self, bytes)
            }
            async fn writable(&self) -> io::Result<()> {
                <$t>::writable(self).await
            }
        }
    };
}

macro_rules! try_write_socket {
    ($t:ty, $stream:ident) => {
        impl TryWrite for $t {
            fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
                <$t>::try_write(self, bytes)
            }
            async fn writable(&self) -> io::Result<()> {
                <$t>::writable(self).await
            }
            fn shutdown(&self) {
                use std::os::fd::AsFd;
                let _ = rustix::net::shutdown($stream(self).as_fd(), rustix::net::Shutdown::Both);
            }
        }
    };
}

fn half_stream(half: &tokio::net::unix::OwnedWriteHalf) -> &tokio::net::UnixStream {
    half.as_ref()
}

fn whole_stream(stream: &tokio::net::UnixStream) -> &tokio::net::UnixStream {
    stream
}

try_write_sink!(tokio::net::unix::pipe::Sender);
try_write_socket!(tokio::net::unix::OwnedWriteHalf, half_stream);
try_write_socket!(tokio::net::UnixStream, whole_stream);

/// Why a message could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// More than the limit is waiting: the reader is not reading.
    Full,
    /// The connection failed or was closed.
    Closed,
}

/// Writes lines to a descriptor from one task without waiting on it: what
/// the descriptor takes now is written at once (no task switch on the way
/// to the peer), the rest is queued for a writer task, and then everything
/// queues behind it, so order is kept. Dropping the outbox closes the
/// descriptor once the queue is written. The writer task and its queue
/// are made the first time a message has to wait: most outboxes (an idle
/// host session's) never need them.
#[derive(Debug)]
pub struct Outbox<W> {
    sink: Arc<W>,
    /// Messages queued or being written by the writer task.
    queued: Arc<AtomicUsize>,
    /// The bytes of those queued behind the one being written.
    bytes: Arc<AtomicUsize>,
    /// The writer task's queue, once there is one.
    queue: std::sync::OnceLock<mpsc::UnboundedSender<Vec<u8>>>,
    /// Where a failed write is told (given to the writer task).
    failed: Option<mpsc::WeakUnboundedSender<Result<Message, String>>>,
    limit: usize,
    /// The bytes that may wait behind a message being written
    /// ([`Outbox::bounded_in_bytes`]).
    byte_limit: usize,
    /// The writer task, once there is one: it ends once the outbox is
    /// dropped and its queue written (or a write failed).
    writer: std::sync::OnceLock<tokio::task::JoinHandle<()>>,
    /// Woken each time the writer task wrote a message
    /// ([`Outbox::notify_drained`]).
    drained: Option<Arc<tokio::sync::Notify>>,
}

impl<W: TryWrite> Outbox<W> {
    /// An outbox that refuses more than `limit` waiting messages;
    /// `failed` (a server connection's channel of
    /// [`Incoming`](super::wire::Incoming), written out here so that the
    /// outbox does not depend on the wire built on it) hears of a failed
    /// write (once).
    pub fn new(
        sink: W,
        limit: usize,
        failed: Option<mpsc::WeakUnboundedSender<Result<Message, String>>>,
    ) -> Self {
        Self {
            sink: Arc::new(sink),
            queued: Arc::new(AtomicUsize::new(0)),
            bytes: Arc::new(AtomicUsize::new(0)),
            queue: std::sync::OnceLock::new(),
            failed,
            limit,
            byte_limit: usize::MAX,
            writer: std::sync::OnceLock::new(),
            drained: None,
        }
    }

    /// Wakes `drained` each time a message that waited has been written
    /// (whoever held back a peer until the queue drains).
    pub fn notify_drained(mut self, drained: Arc<tokio::sync::Notify>) -> Self {
        self.drained = Some(drained);
        self
    }

    /// The writer task's queue, the task started the first time.
    fn queue(&self) -> &mpsc::UnboundedSender<Vec<u8>> {
        self.queue.get_or_init(|| {
            let (queue, rx) = mpsc::unbounded_channel::<Vec<u8>>();
            let writer = tokio::spawn(write_queue(
                Arc::clone(&self.sink),
                rx,
                Arc::clone(&self.queued),
                Arc::clone(&self.bytes),
                self.failed.clone(),
                self.drained.clone(),
            ));
            let _ = self.writer.set(writer);
            queue
        })
    }

    /// Also refuses a message once `bytes` wait behind the one being
    /// written (the first message queued is always taken: a peer reading
    /// slowly gets one answer of any size).
    pub fn bounded_in_bytes(mut self, bytes: usize) -> Self {
        self.byte_limit = bytes;
        self
    }

    /// The writer task, to wait for what is queued to be written after the
    /// outbox is dropped (or to abort it).
    pub fn take_writer(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        self.writer.take()
    }

    /// Messages waiting to be written (the one being written included),
    /// and the bytes of those behind it.
    pub fn backlog(&self) -> (usize, usize) {
        (
            self.queued.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Writes `bytes` now if the descriptor takes them, else queues them.
    pub fn send(&self, mut bytes: Vec<u8>) -> Result<(), Refused> {
        match self.write_now(&bytes)? {
            None => Ok(()),
            Some(written) => {
                bytes.drain(..written);
                self.enqueue(bytes)
            }
        }
    }

    /// [`Outbox::send`] of bytes the caller keeps: copied only if they
    /// must wait.
    pub fn send_slice(&self, bytes: &[u8]) -> Result<(), Refused> {
        match self.write_now(bytes)? {
            None => Ok(()),
            Some(written) => self.enqueue(bytes[written..].to_vec()),
        }
    }

    /// Writes what the descriptor takes now, if nothing waits: `None`
    /// once all of `bytes` is written, else how much was (the rest to
    /// queue); refused when closed, or full.
    fn write_now(&self, bytes: &[u8]) -> Result<Option<usize>, Refused> {
        let queued = self.queued.load(Ordering::Relaxed);
        if queued >= usize::MAX / 4 {
            return Err(Refused::Closed);
        }
        if queued == 0 {
            let mut written = 0;
            loop {
                match self.sink.try_write(&bytes[written..]) {
                    Ok(n) => {
                        written += n;
                        if written == bytes.len() {
                            return Ok(None);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // WouldBlock, or an error the writer task will meet
                    // and report.
                    Err(_) => break,
                }
            }
            return Ok(Some(written));
        }
        if queued >= self.limit
            || self
                .bytes
                .load(Ordering::Relaxed)
                .saturating_add(bytes.len())
                > self.byte_limit
        {
            return Err(Refused::Full);
        }
        Ok(Some(0))
    }

    fn enqueue(&self, bytes: Vec<u8>) -> Result<(), Refused> {
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes.len(), Ordering::Relaxed);
        self.queue().send(bytes).map_err(|_| Refused::Closed)
    }
}

impl<W: TryWrite> Outbox<W> {
    /// Shuts the stream down both ways now, whatever is still queued
    /// ([`TryWrite::shutdown`]): the peer sees the end at once, and a
    /// writer task waiting for it to read fails and ends.
    pub fn shutdown(&self) {
        self.sink.shutdown();
    }
}

/// The writer task: writes what is queued, in order, until the outbox is
/// gone (its queue closed) or a write fails.
async fn write_queue<W: TryWrite>(
    writer: Arc<W>,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    count: Arc<AtomicUsize>,
    size: Arc<AtomicUsize>,
    failed: Option<mpsc::WeakUnboundedSender<Result<Message, String>>>,
    drained: Option<Arc<tokio::sync::Notify>>,
) {
    while let Some(bytes) = rx.recv().await {
        // Being written now: no longer waiting behind it.
        size.fetch_sub(bytes.len(), Ordering::Relaxed);
        if let Err(e) = write_all(&*writer, &bytes).await {
            // A closed pipe is the peer going away: its reader
            // sees the end of file.
            if e.kind() != io::ErrorKind::BrokenPipe
                && let Some(incoming) = failed.as_ref().and_then(|f| f.upgrade())
            {
                let _ = incoming.send(Err(format!("cannot write to the server: {e}")));
            }
            // Further sends are refused as closed.
            count.store(usize::MAX / 2, Ordering::Relaxed);
            if let Some(drained) = &drained {
                drained.notify_one();
            }
            return;
        }
        count.fetch_sub(1, Ordering::Relaxed);
        if let Some(drained) = &drained {
            drained.notify_one();
        }
    }
}

async fn write_all<W: TryWrite>(sink: &W, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        sink.writable().await?;
        match sink.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::unix::pipe;

    /// What `rx` reads until its end.
    async fn read_all(mut rx: pipe::Receiver) -> Vec<u8> {
        let mut all = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut rx, &mut all)
            .await
            .expect("read");
        all
    }

    #[tokio::test]
    async fn an_outbox_writes_at_once_queues_the_rest_in_order_and_refuses_past_its_limit() {
        let (tx, rx) = pipe::pipe().expect("pipe");
        let outbox = Outbox::new(tx, 3, None);
        // One message larger than the pipe holds: part now, part queued.
        let big = vec![b'a'; 256 * 1024];
        outbox.send(big.clone()).expect("first");
        outbox.send(b"b\n".to_vec()).expect("behind it");
        // Bytes the caller keeps: copied to wait.
        outbox.send_slice(b"c\n").expect("behind it");
        assert_eq!(outbox.send(b"d\n".to_vec()), Err(Refused::Full));
        assert_eq!(outbox.send_slice(b"d\n"), Err(Refused::Full));
        drop(outbox);
        let all = read_all(rx).await;
        let mut want = big;
        want.extend_from_slice(b"b\nc\n");
        assert_eq!(all.len(), want.len());
        assert!(all == want, "in order, nothing lost, closed once written");
    }

    #[tokio::test]
    async fn an_outbox_starts_its_writer_task_only_when_a_message_must_wait() {
        let (tx, mut rx) = pipe::pipe().expect("pipe");
        let mut outbox = Outbox::new(tx, 3, None);
        // As a session's first message comes: after the reactor has seen
        // the descriptor (tokio writes nothing before).
        outbox.sink.writable().await.expect("writable");
        outbox.send(b"small\n".to_vec()).expect("written at once");
        assert!(outbox.take_writer().is_none(), "nothing waited: no task");
        let mut small = [0u8; 6];
        tokio::io::AsyncReadExt::read_exact(&mut rx, &mut small)
            .await
            .expect("read");
        assert_eq!(&small, b"small\n");
        outbox
            .send(vec![b'a'; 256 * 1024])
            .expect("more than the pipe holds");
        let writer = outbox.take_writer().expect("the rest waits for a task");
        drop(outbox);
        let mut all = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut rx, &mut all)
            .await
            .expect("read");
        assert_eq!(all.len(), 256 * 1024, "all of it, then the end");
        writer.await.expect("the task ends");
    }

    #[tokio::test]
    async fn an_outbox_bounded_in_bytes_counts_what_waits_behind_the_message_being_written() {
        let (tx, rx) = pipe::pipe().expect("pipe");
        let outbox = Outbox::new(tx, 1000, None).bounded_in_bytes(1 << 20);
        // larger than the bound and the pipe: taken, most of it queued,
        // and being written once the writer has it
        outbox.send(vec![b'a'; 4 << 20]).expect("the first");
        tokio::task::yield_now().await;
        assert_eq!(outbox.backlog(), (1, 0), "nothing behind it");
        // behind it, up to the bound
        outbox.send(vec![b'b'; 1 << 19]).expect("half the bound");
        outbox.send(vec![b'c'; 1 << 19]).expect("the bound");
        assert_eq!(outbox.send(vec![b'd'; 1]), Err(Refused::Full));
        drop(rx);
    }

    #[tokio::test]
    async fn bytes_the_caller_keeps_are_written_at_once_or_their_rest_queued() {
        let (tx, rx) = pipe::pipe().expect("pipe");
        let outbox = Outbox::new(tx, 10, None);
        // The first waits for the descriptor to be known writable.
        outbox.send_slice(b"first\n").expect("taken");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while outbox.backlog() != (0, 0) {
            assert!(tokio::time::Instant::now() < deadline, "never written");
            tokio::task::yield_now().await;
        }
        outbox.send_slice(b"now\n").expect("at once");
        assert_eq!(outbox.backlog(), (0, 0), "nothing waits");
        let big = vec![b'a'; 256 * 1024];
        outbox.send_slice(&big).expect("part now, the rest queued");
        assert_eq!(outbox.backlog().0, 1);
        outbox.send_slice(b"after\n").expect("behind it");
        drop(outbox);
        let all = read_all(rx).await;
        let mut want = b"first\nnow\n".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"after\n");
        assert!(all == want, "in order, nothing lost");
    }
}
