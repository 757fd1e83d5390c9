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

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
