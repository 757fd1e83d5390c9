//! The attach socket (`RUNTIME_DIR/attach`): the lean way into a host
//! session (DESIGN §8), which `mcpctl bridge` uses. D-Bus `Attach()`
//! gives the same session; this path costs a connect and two lines
//! instead of a D-Bus handshake, so a host's server starts in a few
//! milliseconds, and it can take the host's own stdin and stdout.
//!
//! The client sends one line, a JSON [`Request`], with two descriptors
//! attached (`SCM_RIGHTS`) when `stdio` is true. The daemon answers one
//! line, a [`Reply`]. Then:
//!
//! - without descriptors, the socket carries the session: MCP lines both
//!   ways, as on the socket of `Attach()`;
//! - with them (the host's stdin and stdout, pipes or sockets), the daemon
//!   reads the host's messages from the first and writes its own to the
//!   second, attaches the session's ledger (`super::ledger`: the host's
//!   requests in flight, for the client to fail if the daemon is killed)
//!   to its reply, and the socket is left for [`Control`] lines from the daemon:
//!   no process copies the session's bytes, so a host talks to mcpd as
//!   directly as it would to the server. The client holds the socket open
//!   while the session lasts; closing it ends the session.
//!
//! Every line is at most [`MAX_HEADER`] bytes.
//!
//! Both halves of the handshake are here: the client's ([`attach`],
//! blocking, for a bridge that has no async runtime while it waits) and
//! the daemon's framing ([`read_request`], [`read_more`],
//! [`send_reply`]), tested against each other; what the daemon decides
//! about a request (the server, the caller, the descriptors) is
//! `daemon::attach`'s.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The socket's file name in the runtime directory.
pub const SOCKET: &str = "attach";

/// The longest request or control line: a replayed `initialize` and the
/// bytes a bridge read from its host meanwhile (at most a message).
pub const MAX_HEADER: usize = 2 * super::wire::MAX_LINE;

/// The attach socket of a runtime directory.
pub fn socket(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET)
}

/// What a client asks for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The server's unit name.
    pub server: String,
    /// Two descriptors come with this line: the host's input, then its
    /// output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdio: bool,
    /// The host's `initialize` request of an earlier session (mcpd
    /// restarted): the daemon handles it as the session's first message
    /// and does not pass its answer on; the host is then told that the
    /// lists may have changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Value>,
    /// How many bytes follow this line, as they are: what the client read
    /// from the host and sent nowhere, which the session reads before
    /// anything else (with `stdio`; without, whatever follows the line is
    /// the session's anyway).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Request {
    /// A plain request for server `name`.
    pub fn new(name: &str) -> Self {
        Self {
            server: name.to_owned(),
            ..Self::default()
        }
    }
}

/// Why an attach was refused, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Refusal {
    NoSuchServer,
    AccessDenied,
    InvalidRequest,
    Failed,
}

/// The daemon's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reply {
    /// The session is attached.
    Attached,
    /// It is not: why.
    Refused { code: Refusal, message: String },
}

impl Reply {
    /// A refusal.
    pub fn refused(code: Refusal, message: impl Into<String>) -> Self {
        Self::Refused {
            code,
            message: message.into(),
        }
    }
}

/// What the daemon tells a client that handed over the host's stdio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Control {
    /// The host's `initialize` request, for a replay after mcpd restarts.
    Initialize(Value),
    /// The session is over for good: `None` when the host closed its
    /// input, else why mcpd ended it. The daemon closes the socket next.
    /// A socket that closes without this line means mcpd went away.
    End(Option<String>),
}

/// One line of JSON, newline included.
pub fn line<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Sends `bytes` on a blocking or non-blocking stream socket, with `fds`
/// attached to its first byte; returns how many bytes went (the rest is
/// for a plain write).
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    loop {
        match sendmsg(
            socket,
            &[io::IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads what `socket` has now into `buf` (appending), and the
/// descriptors that came with it into `fds`; `Ok(0)` at end of file.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = recv_into(socket, &mut chunk, fds)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// Reads at most `buf.len()` bytes of what `socket` has now into `buf`,
/// and the descriptors that came with them into `fds`; `Ok(0)` at end of
/// file.
pub fn recv_into(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(
            socket,
            &mut [io::IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => {}
            other => break other?,
        }
    };
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok(received.bytes)
}

/// What a descriptor handed over is: only pipes and stream sockets carry
/// a session (a file or a terminal cannot be waited on like one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pipe,
    Socket,
}

/// The kind of `fd`, or why it cannot carry a session.
pub fn kind(fd: impl AsFd) -> Result<Kind, String> {
    use rustix::fs::FileType;
    let stat = rustix::fs::fstat(fd).map_err(|e| format!("cannot inspect it: {e}"))?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Fifo => Ok(Kind::Pipe),
        FileType::Socket => Ok(Kind::Socket),
        other => Err(format!("it is a {other:?}, not a pipe or a socket")),
    }
}

/// How long the daemon may take to answer a client's request.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a client's attach did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No daemon answers on the socket, or it went away mid-handshake.
    #[error("{0}")]
    Unreachable(String),
    /// The daemon said no.
    #[error("{message}")]
    Refused { code: Refusal, message: String },
    /// The daemon's answer is not a [`Reply`].
    #[error("the daemon's answer is not understood: {0}")]
    NotUnderstood(serde_json::Error),
}

/// A session the daemon said yes to: its socket, and the ledger of the
/// host's requests in flight that came with the reply (stdio handed over;
/// `super::ledger`).
#[derive(Debug)]
pub struct Accepted {
    pub socket: std::os::unix::net::UnixStream,
    pub ledger: Option<OwnedFd>,
}

/// The client's half: connects to the attach socket at `path` and makes
/// `request`, with the host's stdin and stdout attached when `stdio` is
/// given and `pending` (the bytes the request announces) after the line.
/// Blocking; nothing of the session is read, and a daemon that stops
/// answering holds the caller at most [`REPLY_TIMEOUT`] per read or write.
pub fn attach(
    path: &Path,
    request: &Request,
    stdio: Option<[BorrowedFd<'_>; 2]>,
    pending: &[u8],
) -> Result<Accepted, AttachError> {
    use std::io::Write;
    let socket = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
        AttachError::Unreachable(match e.kind() {
            io::ErrorKind::NotFound => format!("no socket at {}", path.display()),
            io::ErrorKind::ConnectionRefused => {
                format!("no daemon listens on {}", path.display())
            }
            _ => format!("cannot connect to {}: {e}", path.display()),
        })
    })?;
    // A daemon that stops answering (out of descriptors, wedged) does not
    // hold the host's bridge for ever.
    let _ = socket.set_read_timeout(Some(REPLY_TIMEOUT));
    let _ = socket.set_write_timeout(Some(REPLY_TIMEOUT));
    // A daemon that goes away mid-handshake is one that cannot be reached.
    let failed = |e: io::Error| {
        AttachError::Unreachable(format!("attaching at {} failed: {e}", path.display()))
    };
    let mut line = line(request);
    line.extend_from_slice(pending);
    let fds = stdio.as_ref().map_or(&[][..], |fds| &fds[..]);
    let sent = send_with_fds(socket.as_fd(), &line, fds).map_err(failed)?;
    (&socket).write_all(&line[sent..]).map_err(failed)?;
    // The answer is one line; what may follow it is the session's, so
    // it is peeked at and only the line taken.
    let mut answer = Vec::new();
    let mut fds = Vec::new();
    loop {
        let mut peek = [0u8; 1024];
        let n = rustix::net::recv(&socket, &mut peek, rustix::net::RecvFlags::PEEK)
            .map_err(|e| failed(e.into()))?
            .0;
        if n == 0 {
            return Err(AttachError::Unreachable(
                "the daemon closed the connection".into(),
            ));
        }
        let take = memchr::memchr(b'\n', &peek[..n]).map_or(n, |at| at + 1);
        let mut chunk = vec![0u8; take];
        let mut got = 0;
        while got < take {
            match recv_into(socket.as_fd(), &mut chunk[got..], &mut fds) {
                Ok(0) => return Err(failed(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => got += n,
                Err(e) => return Err(failed(e)),
            }
        }
        answer.extend_from_slice(&chunk);
        if answer.ends_with(b"\n") {
            break;
        }
    }
    let _ = socket.set_read_timeout(None);
    let _ = socket.set_write_timeout(None);
    match serde_json::from_slice::<Reply>(&answer) {
        Ok(Reply::Attached) => Ok(Accepted {
            socket,
            ledger: fds.into_iter().next(),
        }),
        Ok(Reply::Refused { code, message }) => Err(AttachError::Refused { code, message }),
        Err(e) => Err(AttachError::NotUnderstood(e)),
    }
}

/// `op` on `stream` once it is ready for `interest` (tokio is told when
/// it was not after all, so the wait is a real one).
async fn when_ready<T>(
    stream: &UnixStream,
    interest: Interest,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    loop {
        stream.ready(interest).await?;
        match stream.try_io(interest, &mut op) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            other => return other,
        }
    }
}

/// One `recvmsg`, once the socket is readable.
async fn recv(stream: &UnixStream, buf: &mut Vec<u8>, fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    when_ready(stream, Interest::READABLE, || {
        recv_with_fds(stream.as_fd(), buf, fds)
    })
    .await
}

/// The daemon's half: reads the request line (without its newline), the
/// descriptors that came with it, and any bytes after it. A line longer
/// than [`MAX_HEADER`], or a client that closes before the line ends, is
/// an error.
pub async fn read_request(stream: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut fds = Vec::new();
    loop {
        let before = buf.len();
        if recv(stream, &mut buf, &mut fds).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed before its request ended",
            ));
        }
        if let Some(at) = memchr::memchr(b'\n', &buf[before..]) {
            let rest = buf.split_off(before + at + 1);
            buf.pop();
            return Ok((buf, fds, rest));
        }
        if buf.len() > MAX_HEADER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the request is longer than {MAX_HEADER} bytes"),
            ));
        }
    }
}

/// The daemon's half: reads until `buf` holds at least `count` bytes (the
/// request's `pending` bytes); descriptors that come meanwhile are closed.
pub async fn read_more(stream: &UnixStream, buf: &mut Vec<u8>, count: usize) -> io::Result<()> {
    let mut ignored = Vec::new();
    while buf.len() < count {
        if recv(stream, buf, &mut ignored).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// The daemon's half: writes the reply line, with `fds` on its first
/// byte.
pub async fn send_reply(
    stream: &UnixStream,
    reply: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut sent = when_ready(stream, Interest::WRITABLE, || {
        send_with_fds(stream.as_fd(), reply, fds)
    })
    .await?;
    while sent < reply.len() {
        sent += when_ready(stream, Interest::WRITABLE, || {
            rustix::io::write(stream, &reply[sent..]).map_err(io::Error::from)
        })
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_are_one_line_of_json() {
        let request = Request {
            server: "demo".into(),
            stdio: true,
            ..Request::default()
        };
        assert_eq!(line(&request), b"{\"server\":\"demo\",\"stdio\":true}\n");
        assert_eq!(
            serde_json::from_str::<Request>("{\"server\":\"demo\"}").expect("parse"),
            Request {
                server: "demo".into(),
                ..Request::default()
            }
        );
        assert!(serde_json::from_str::<Request>("{\"server\":\"demo\",\"x\":1}").is_err());
        assert_eq!(line(&Reply::Attached), b"\"attached\"\n");
        assert_eq!(
            line(&Reply::Refused {
                code: Refusal::NoSuchServer,
                message: "no server named x".into()
            }),
            b"{\"refused\":{\"code\":\"no-such-server\",\"message\":\"no server named x\"}}\n"
        );
        assert_eq!(line(&Control::End(None)), b"{\"end\":null}\n");
    }

    /// A daemon's half on a socket in a scratch directory: it reads one
    /// request, sends `answer` (with a pipe's end on its first byte when
    /// `ledger`), and returns what it read; the client's half runs on the
    /// blocking pool.
    async fn handshake(
        request: Request,
        stdio: bool,
        pending: &'static [u8],
        answer: &'static [u8],
        ledger: bool,
    ) -> (
        Result<Accepted, AttachError>,
        io::Result<(Vec<u8>, Vec<OwnedFd>, Vec<u8>)>,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = socket(dir.path());
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let daemon = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let mut read = read_request(&stream).await;
            if let Ok((header, _, rest)) = &mut read {
                let wanted = serde_json::from_slice::<Request>(header).map_or(0, |r| r.pending);
                read_more(&stream, rest, wanted)
                    .await
                    .expect("pending bytes");
            }
            let (r, _w) = rustix::pipe::pipe().expect("pipe");
            let fds = if ledger { vec![r.as_fd()] } else { Vec::new() };
            if !answer.is_empty() {
                send_reply(&stream, answer, &fds).await.expect("reply");
            }
            read
        });
        let client = tokio::task::spawn_blocking(move || {
            let (host_in, host_out) = rustix::pipe::pipe().expect("pipe");
            let stdio = stdio.then(|| [host_in.as_fd(), host_out.as_fd()]);
            let attached = attach(&path, &request, stdio, pending);
            if let Ok(attached) = &attached {
                // What followed the reply line is the session's.
                let mut after = [0u8; 6];
                std::io::Read::read_exact(&mut &attached.socket, &mut after).expect("session");
                assert_eq!(&after, b"hello\n");
            }
            attached
        });
        let attached = client.await.expect("client");
        (attached, daemon.await.expect("daemon"))
    }

    #[tokio::test]
    async fn the_client_and_the_daemon_halves_agree() {
        let stdio = Request {
            stdio: true,
            pending: 5,
            ..Request::new("demo")
        };
        let (attached, read) =
            handshake(stdio, true, b"ping\n", b"\"attached\"\nhello\n", true).await;
        let attached = attached.expect("attached");
        assert!(attached.ledger.is_some(), "the ledger came with the reply");
        let (header, fds, rest) = read.expect("request");
        assert_eq!(header, br#"{"server":"demo","stdio":true,"pending":5}"#);
        assert_eq!(fds.len(), 2, "the host's stdio");
        assert_eq!(rest, b"ping\n");

        let (attached, read) = handshake(
            Request::new("demo"),
            false,
            b"",
            b"\"attached\"\nhello\n",
            false,
        )
        .await;
        assert!(attached.expect("attached").ledger.is_none());
        let (header, fds, rest) = read.expect("request");
        assert_eq!(
            (header, fds.len(), rest),
            (br#"{"server":"demo"}"#.to_vec(), 0, Vec::new())
        );
    }

    #[tokio::test]
    async fn a_client_hears_why_it_was_not_attached() {
        let refused =
            b"{\"refused\":{\"code\":\"no-such-server\",\"message\":\"no server named x\"}}\n";
        let cases: [(&[u8], &str); 3] = [
            (refused, "refused NoSuchServer: no server named x"),
            (b"\"maybe\"\n", "not understood"),
            (b"", "unreachable: the daemon closed the connection"),
        ];
        for (answer, expected) in cases {
            let (attached, _) = handshake(Request::new("x"), false, b"", answer, false).await;
            let got = match attached {
                Ok(_) => "attached".to_owned(),
                Err(AttachError::Refused { code, message }) => {
                    format!("refused {code:?}: {message}")
                }
                Err(AttachError::NotUnderstood(_)) => "not understood".to_owned(),
                Err(AttachError::Unreachable(why)) => format!("unreachable: {why}"),
            };
            assert_eq!(
                got,
                expected,
                "answer {:?}",
                answer.escape_ascii().to_string()
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let nobody = attach(&socket(dir.path()), &Request::new("x"), None, b"");
        assert!(
            matches!(&nobody, Err(AttachError::Unreachable(why)) if why.starts_with("no socket at ")),
            "{nobody:?}"
        );
    }

    #[tokio::test]
    async fn the_daemon_refuses_to_read_a_request_without_end() {
        let (a, b) = UnixStream::pair().expect("pair");
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut a = a;
            // Fails once the daemon's half gave up and closed its end.
            let _ = a.write_all(&vec![b' '; MAX_HEADER + 2]).await;
        });
        let e = read_request(&b).await.expect_err("too long");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        drop(b);
        writer.await.expect("writer");

        let (a, b) = UnixStream::pair().expect("pair");
        {
            use tokio::io::AsyncWriteExt;
            let mut a = a;
            a.write_all(b"{\"server\":").await.expect("write");
        }
        let e = read_request(&b).await.expect_err("cut short");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn descriptors_travel_with_the_first_byte() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let (r, _w) = rustix::pipe::pipe().expect("pipe");
        let sent = send_with_fds(a.as_fd(), b"hello\n", &[r.as_fd(), r.as_fd()]).expect("send");
        assert_eq!(sent, 6);
        let (mut buf, mut fds) = (Vec::new(), Vec::new());
        recv_with_fds(b.as_fd(), &mut buf, &mut fds).expect("recv");
        assert_eq!(buf, b"hello\n");
        assert_eq!(fds.len(), 2);
        assert_eq!(kind(&fds[0]), Ok(Kind::Pipe));
        assert_eq!(kind(&a), Ok(Kind::Socket));
        let file = tempfile::tempfile().expect("file");
        assert!(kind(&file).is_err_and(|e| e.contains("not a pipe or a socket")));
    }
}
