//! An in-memory stream pair: what a socket pair is to two tasks of one
//! daemon, without the kernel. The aggregate's task (DESIGN §14) reaches
//! each member unit's sessions through one ([`super::host::HostLink::Memory`]),
//! so a message crosses no system call and no poll on its way in the
//! daemon: its writer's [`TryWrite`] appends to a buffer and wakes the
//! reader's task, whose [`Source`] takes everything there.
//!
//! It behaves as the socket did for everything built on it: each
//! direction holds at most `limit` bytes (past it a write takes what fits
//! and then would block, so the [`Outbox`](super::outbox::Outbox) in front
//! queues and bounds the rest as for a slow peer); a dropped writer is the
//! reader's end of file once it has read what was written; a dropped
//! reader makes writes fail as a closed pipe's.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio_util::bytes::BytesMut;

use super::lines::Source;
use super::outbox::TryWrite;

/// One direction's buffer and who waits on it.
#[derive(Debug)]
struct Channel {
    buf: Mutex<BytesMut>,
    limit: usize,
    /// The reader's task, woken by a write and by the writer's end.
    reader: AtomicWaker,
    /// Writers waiting for room ([`TryWrite::writable`]).
    room: tokio::sync::Notify,
    /// The writer is gone: what is left is the last of it.
    written: AtomicBool,
    /// The reader is gone: writes fail.
    unread: AtomicBool,
}

/// The writing end of one direction.
#[derive(Debug)]
pub struct Writer(Arc<Channel>);

/// The reading end of one direction.
#[derive(Debug)]
pub struct Reader(Arc<Channel>);

/// One end of a pair: what it reads and what it writes.
#[derive(Debug)]
pub struct End {
    pub read: Reader,
    pub write: Writer,
}

/// One direction: its writer and its reader, holding at most `limit`
/// bytes (an HTTP session's requests to its unit, whose answers come
/// back another way: [`super::host::HostLink::Direct`]).
pub fn channel(limit: usize) -> (Writer, Reader) {
    let channel = Arc::new(Channel {
        buf: Mutex::new(BytesMut::new()),
        limit: limit.max(1),
        reader: AtomicWaker::new(),
        room: tokio::sync::Notify::new(),
        written: AtomicBool::new(false),
        unread: AtomicBool::new(false),
    });
    (Writer(Arc::clone(&channel)), Reader(channel))
}

/// Two connected ends, each direction holding at most `limit` bytes.
pub fn pair(limit: usize) -> (End, End) {
    let (a_write, b_read) = channel(limit);
    let (b_write, a_read) = channel(limit);
    (
        End {
            read: a_read,
            write: a_write,
        },
        End {
            read: b_read,
            write: b_write,
        },
    )
}

impl Writer {
    /// The reader sees the end now, after what it has not read yet.
    fn end(&self) {
        self.0.written.store(true, Ordering::Release);
        self.0.reader.wake();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.end();
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.unread.store(true, Ordering::Release);
        // A writer waiting for room learns there will be none.
        self.0.room.notify_waiters();
    }
}

impl TryWrite for Writer {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        let channel = &*self.0;
        if channel.unread.load(Ordering::Acquire) || channel.written.load(Ordering::Acquire) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let taken = {
            let mut buf = channel.buf.lock().map_err(|_| io::ErrorKind::BrokenPipe)?;
            let room = channel.limit.saturating_sub(buf.len());
            if room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let taken = room.min(bytes.len());
            buf.extend_from_slice(&bytes[..taken]);
            taken
        };
        channel.reader.wake();
        Ok(taken)
    }

    async fn writable(&self) -> io::Result<()> {
        let channel = &*self.0;
        loop {
            let notified = channel.room.notified();
            tokio::pin!(notified);
            // Registered before looking: a read in between still wakes it.
            notified.as_mut().enable();
            if channel.unread.load(Ordering::Acquire) {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            let full = channel
                .buf
                .lock()
                .map(|buf| buf.len() >= channel.limit)
                .unwrap_or(false);
            if !full {
                return Ok(());
            }
            notified.await;
        }
    }

    /// As a socket's shutdown: the reader sees the end after what it has
    /// not read yet, and writes fail.
    fn shutdown(&self) {
        self.end();
    }
}

impl Source for Reader {
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let channel = &*self.0;
        channel.reader.register(cx.waker());
        let Ok(mut pending) = channel.buf.lock() else {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        if pending.is_empty() {
            // Looked at under the lock a write appends under.
            let ended = channel.written.load(Ordering::Acquire);
            drop(pending);
            return if ended {
                Poll::Ready(Ok(0))
            } else {
                Poll::Pending
            };
        }
        let n = pending.len();
        if buf.is_empty() {
            // The reader's buffer becomes the bytes written: no copy.
            std::mem::swap(buf, &mut *pending);
        } else {
            buf.extend_from_slice(&pending);
            pending.clear();
        }
        drop(pending);
        channel.room.notify_waiters();
        Poll::Ready(Ok(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_arrive_in_order_and_the_writers_end_is_the_readers_end_of_file() {
        let (mut a, b) = pair(64);
        b.write.try_write(b"one\n").expect("write");
        b.write.try_write(b"two\n").expect("write");
        let mut buf = BytesMut::new();
        assert_eq!(a.read.fill(&mut buf).await.expect("read"), 8);
        assert_eq!(&buf[..], b"one\ntwo\n");
        drop(b);
        let mut more = BytesMut::new();
        assert_eq!(a.read.fill(&mut more).await.expect("end"), 0);
        // The other direction: a's writes fail once b's reader is gone.
        let err = a.write.try_write(b"x").expect_err("closed");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn a_full_direction_takes_what_fits_and_then_would_block_until_read() {
        let (mut a, b) = pair(4);
        assert_eq!(b.write.try_write(b"abcdef").expect("write"), 4);
        let err = b.write.try_write(b"ef").expect_err("full");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let writable = {
            let w = &b.write;
            async move { w.writable().await }
        };
        tokio::pin!(writable);
        assert!(
            futures_util::poll!(writable.as_mut()).is_pending(),
            "no room yet"
        );
        let mut buf = BytesMut::new();
        assert_eq!(a.read.fill(&mut buf).await.expect("read"), 4);
        writable.await.expect("room after the read");
        assert_eq!(b.write.try_write(b"ef").expect("write"), 2);
        // The reader leaving wakes a writer waiting for room.
        assert_eq!(b.write.try_write(b"ghij").expect("write"), 2);
        let waiting = {
            let w = &b.write;
            async move { w.writable().await }
        };
        tokio::pin!(waiting);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        drop(a);
        assert_eq!(
            waiting.await.expect_err("gone").kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    #[tokio::test]
    async fn a_shut_down_writer_is_read_to_its_end() {
        let (mut a, b) = pair(64);
        b.write.try_write(b"last\n").expect("write");
        b.write.shutdown();
        assert!(b.write.try_write(b"more").is_err());
        let mut buf = BytesMut::new();
        assert_eq!(a.read.fill(&mut buf).await.expect("read"), 5);
        assert_eq!(a.read.fill(&mut BytesMut::new()).await.expect("end"), 0);
    }
}
