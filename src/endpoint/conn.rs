//! What one connection of the endpoint costs and how long it may hold on
//! (issue 55): a write that makes no progress ends it ([`Stalled`]), and
//! a request body is read into one buffer within [`MAX_BODY`] and the
//! daemon's [`BUDGET`] of bytes in flight ([`read_body`], [`budgeted`]).

use super::*;

/// Whether a connection ended because a write made no progress
/// ([`Stalled`]).
pub(super) fn stalled(error: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// A connection whose writes fail once one has made no progress for
/// [`read_timeout`]: a client that stops reading an answer or a stream
/// loses its connection, and the answer's memory goes with it (issue 55,
/// D4). Reads are hyper's (its header deadline) and the body's.
pub(super) struct Stalled {
    stream: tokio::net::TcpStream,
    /// Armed when a write could not proceed; disarmed by progress.
    since: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Stalled {
    pub(super) fn new(stream: tokio::net::TcpStream) -> Self {
        Self {
            stream,
            since: None,
        }
    }

    /// `polled`, a write's outcome: progress disarms the deadline; no
    /// progress arms it, and past it the write fails.
    pub(super) fn deadline<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.since = None;
            return polled;
        }
        let since = self
            .since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(read_timeout())));
        if since.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing of an answer in time",
            )));
        }
        std::task::Poll::Pending
    }
}

impl tokio::io::AsyncRead for Stalled {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Stalled {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write(cx, buf);
        self.deadline(cx, polled)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_flush(cx);
        self.deadline(cx, polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Why a request body was not read.
pub(super) enum BodyError {
    /// Past [`MAX_BODY`].
    TooLarge,
    /// Past the daemon's [`BUDGET`].
    Busy,
    Read(hyper::Error),
}

/// Reads a request body into one buffer as its frames arrive, whatever
/// their size (a body sent one byte per chunk takes its length, not a
/// `Bytes` per byte), within [`MAX_BODY`] and the daemon's [`BUDGET`]
/// (the permits returned hold its share until dropped).
pub(super) async fn read_body(
    mut body: Incoming,
    announced: Option<usize>,
    budget: &Arc<tokio::sync::Semaphore>,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), BodyError> {
    let mut buf = Vec::with_capacity(announced.unwrap_or(0).min(1 << 20));
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        // The buffer's room, as it grows, is what is taken.
        let room = (buf.len() + data.len()).max(buf.capacity());
        let taken = held.as_ref().map_or(0, |p| p.num_permits());
        if room > taken {
            let more = Arc::clone(budget)
                .try_acquire_many_owned(
                    u32::try_from(room - taken).map_err(|_| BodyError::TooLarge)?,
                )
                .map_err(|_| BodyError::Busy)?;
            match &mut held {
                Some(permit) => permit.merge(more),
                None => held = Some(more),
            }
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf, held))
}

/// `503`: the daemon's [`BUDGET`] of bytes in flight is spent.
pub(super) fn busy() -> Response<Body> {
    let mut response = rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::ServerDown,
        &format!(
            "the endpoint holds {} MiB of requests and answers in flight: try again",
            BUDGET >> 20
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `bytes` as a body whose memory holds `permit` of the daemon's
/// [`BUDGET`] until the last of it is written (or the connection goes).
pub(super) fn budgeted(bytes: Bytes, permit: tokio::sync::OwnedSemaphorePermit) -> Bytes {
    struct Owned(Bytes, #[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);
    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    Bytes::from_owner(Owned(bytes, permit))
}
