//! The attach socket (`RUNTIME_DIR/attach`; the protocol is in
//! [`crate::mux::attach`]): host sessions without D-Bus, for
//! `mcpctl bridge`. Access is that of D-Bus `Attach()` (the socket's mode,
//! and on the system instance root or group `mcpd` by `SO_PEERCRED`);
//! the session is accounted to the peer's uid and pid.
//!
//! Each client gets [`HANDSHAKE_TIMEOUT`] to send its request; a bad one
//! (not JSON, an unknown server, descriptors that are not pipes or
//! sockets) gets a refusal naming the problem and is closed, touching no
//! session. It runs the daemon's one accept loop
//! ([`crate::sockets::accept_loop`]), so failed accepts back off as the
//! private socket's do.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use crate::model::{Shared, UnitError};
use crate::mux::aggregate::Target;
use crate::mux::attach::{
    self, Kind, MAX_HEADER, Refusal, Reply, Request, read_more, read_request, send_reply,
};
use crate::mux::ledger::Ledger;
use crate::mux::method::Method;
use crate::sockets::Log;
use crate::supervisor::{Caller, HostInput, HostLink, HostOutput};

/// How long a client may take to send its request.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The socket, served while this lives; removed when it is dropped.
#[derive(Debug)]
pub struct AttachSocket {
    accept: JoinHandle<()>,
    path: PathBuf,
}

impl Drop for AttachSocket {
    fn drop(&mut self) {
        self.accept.abort();
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(target: "mcpd::daemon", "cannot remove {}: {e}", self.path.display());
        }
    }
}

/// Binds the attach socket in `runtime_dir` and serves it.
pub fn start(shared: &Arc<Shared>, runtime_dir: &Path) -> io::Result<AttachSocket> {
    let path = attach::socket(runtime_dir);
    let listener = crate::sockets::bind(&path)?;
    crate::sockets::secure_socket(&path, shared.instance)?;
    let accept = tokio::spawn(crate::sockets::accept_loop(
        listener,
        path.clone(),
        Log::Daemon,
        Arc::downgrade(shared),
        None,
        |stream, shared| {
            tokio::spawn(serve(stream, shared));
        },
    ));
    Ok(AttachSocket { accept, path })
}

async fn serve(stream: UnixStream, shared: Arc<Shared>) {
    let caller = match stream.peer_cred() {
        Ok(cred) => Caller {
            uid: Some(cred.uid()),
            pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
            ..Caller::default()
        },
        Err(_) => Caller::default(),
    };
    // Who may attach does not depend on the request: nothing of a caller
    // who may not is read.
    let instance = shared.instance;
    if let Err(why) = crate::sockets::may_control_async(instance, caller.uid).await {
        refuse(stream, caller, &Reply::refused(Refusal::AccessDenied, why)).await;
        return;
    }
    let read = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&stream)).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => {
            tracing::debug!(target: "mcpd::daemon", pid = ?caller.pid, "attach socket: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(target: "mcpd::daemon", pid = ?caller.pid, "attach socket: no request within {}", humantime::format_duration(HANDSHAKE_TIMEOUT));
            return;
        }
    };
    let (header, fds, mut pending) = read;
    let (destination, prepared) = match judge(&shared, &header, fds, caller.clone()) {
        Ok(judged) => judged,
        Err(reply) => {
            refuse(stream, caller, &reply).await;
            return;
        }
    };
    if let Prepared::Stdio(.., count) = &prepared {
        let count = *count;
        let more = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_more(&stream, &mut pending, count));
        if !matches!(more.await, Ok(Ok(()))) {
            tracing::debug!(target: "mcpd::daemon", pid = ?caller.pid, "attach socket: the request's bytes did not come");
            return;
        }
        if pending.len() != count {
            let message = format!(
                "{} bytes follow the request, not the {count} it says",
                pending.len()
            );
            refuse(
                stream,
                caller,
                &Reply::refused(Refusal::InvalidRequest, message),
            )
            .await;
            return;
        }
    }
    // A handed-over session's ledger goes with the reply (a bridge that
    // does not take it loses nothing but the ledger; a session without
    // one is as it was before ledgers).
    let ledger = match &prepared {
        Prepared::Stdio(..) => match Ledger::create() {
            Ok(made) => Some(made),
            Err(e) => {
                tracing::warn!(target: "mcpd::daemon", pid = ?caller.pid, "attach socket: no ledger for the session (its requests in flight are lost if mcpd is killed): {e}");
                None
            }
        },
        Prepared::Socket => None,
    };
    let reply = attach::line(&Reply::Attached);
    let fds: Vec<_> = ledger.iter().map(|(_, fd)| fd.as_fd()).collect();
    if send_reply(&stream, &reply, &fds).await.is_err() {
        return;
    }
    drop(fds);
    let link = match prepared {
        Prepared::Socket => HostLink::Socket { stream, pending },
        Prepared::Stdio(input, output, replay, _) => HostLink::Stdio {
            input,
            output,
            control: stream,
            replay,
            pending,
            // The bridge holds the descriptor; the mapping is enough here.
            ledger: ledger.map(|(ledger, _)| Box::new(ledger)),
        },
    };
    match destination {
        Destination::Unit(supervisor) => supervisor.attach(link, caller),
        Destination::Aggregate(target) => {
            if let Err(why) = crate::aggregate::attach(&shared, target, link, caller.clone()) {
                // The group emptied between the check and now.
                tracing::warn!(target: "mcpd::daemon", pid = ?caller.pid, "attach socket: {why}");
            }
        }
    }
}

/// Where a session goes: one unit's sessions, or an aggregate over
/// several (DESIGN §14).
enum Destination {
    Unit(crate::supervisor::Supervisor),
    Aggregate(Target),
}

async fn refuse(mut stream: UnixStream, caller: Caller, reply: &Reply) {
    if let Reply::Refused { message, .. } = reply {
        tracing::debug!(target: "mcpd::daemon", pid = ?caller.pid, "attach socket: refused: {message}");
    }
    let _ = stream.write_all(&attach::line(reply)).await;
    let _ = stream.shutdown().await;
}

/// A session ready to attach: on the socket, or on the host's stdio with
/// this many bytes of the host's to come first.
enum Prepared {
    Socket,
    Stdio(HostInput, HostOutput, Option<serde_json::Value>, usize),
}

/// Judges a request: the server, the caller's access, the descriptors.
fn judge(
    shared: &Shared,
    header: &[u8],
    mut fds: Vec<OwnedFd>,
    caller: Caller,
) -> Result<(Destination, Prepared), Reply> {
    let request: Request = serde_json::from_slice(header).map_err(|e| {
        Reply::refused(
            Refusal::InvalidRequest,
            format!("not an attach request: {e}"),
        )
    })?;
    let target =
        Target::parse(&request.server).map_err(|e| Reply::refused(Refusal::InvalidRequest, e))?;
    // A name that is not there is refused with what there is.
    let groups = matches!(target, Target::Group(_));
    let destination = if target.is_aggregate() {
        let members = shared.members(&target).map_err(|e| {
            let choices = shared.choices(groups);
            Reply::refused(Refusal::NoSuchServer, format!("{e}; {choices}"))
        })?;
        if members.is_empty() {
            return Err(Reply::refused(
                Refusal::NoSuchServer,
                format!("{}: no unit runs", target.label()),
            ));
        }
        Destination::Aggregate(target)
    } else {
        Destination::Unit(shared.supervisor(&request.server).map_err(|e| match e {
            UnitError::NoSuchServer(name) => Reply::refused(
                Refusal::NoSuchServer,
                format!("no unit {name}; {}", shared.choices(false)),
            ),
            invalid @ UnitError::Invalid { .. } => {
                Reply::refused(Refusal::Failed, invalid.to_string())
            }
        })?)
    };
    if let Some(replay) = &request.replay
        && (replay.get("method").and_then(|m| m.as_str()) != Some(Method::Initialize.as_str())
            || replay.get("id").is_none_or(serde_json::Value::is_null))
    {
        return Err(Reply::refused(
            Refusal::InvalidRequest,
            "replay: expected an initialize request with an id",
        ));
    }
    if !request.stdio {
        if !fds.is_empty() {
            return Err(Reply::refused(
                Refusal::InvalidRequest,
                "descriptors came with a request without \"stdio\"",
            ));
        }
        if request.replay.is_some() {
            return Err(Reply::refused(
                Refusal::InvalidRequest,
                "replay: only with \"stdio\" (a client on the socket replays itself)",
            ));
        }
        return Ok((destination, Prepared::Socket));
    }
    if fds.len() != 2 {
        return Err(Reply::refused(
            Refusal::InvalidRequest,
            format!(
                "\"stdio\" needs two descriptors (the host's input and output); {} came",
                fds.len()
            ),
        ));
    }
    let output = fds
        .pop()
        .ok_or_else(|| Reply::refused(Refusal::Failed, "no output"))?;
    let input = fds
        .pop()
        .ok_or_else(|| Reply::refused(Refusal::Failed, "no input"))?;
    let bad = |which: &str, why: String| {
        Reply::refused(
            Refusal::InvalidRequest,
            format!("the host's {which}: {why}"),
        )
    };
    let input = match attach::kind(&input).map_err(|e| bad("input", e))? {
        Kind::Pipe => HostInput::Pipe(
            tokio::net::unix::pipe::Receiver::from_owned_fd(input)
                .map_err(|e| bad("input", e.to_string()))?,
        ),
        Kind::Socket => {
            HostInput::Socket(stream_socket(input, &caller).map_err(|e| bad("input", e))?)
        }
    };
    let output = match attach::kind(&output).map_err(|e| bad("output", e))? {
        Kind::Pipe => HostOutput::Pipe(
            tokio::net::unix::pipe::Sender::from_owned_fd(output)
                .map_err(|e| bad("output", e.to_string()))?,
        ),
        Kind::Socket => {
            HostOutput::Socket(stream_socket(output, &caller).map_err(|e| bad("output", e))?)
        }
    };
    if request.pending > MAX_HEADER {
        return Err(Reply::refused(
            Refusal::InvalidRequest,
            format!("more than {MAX_HEADER} pending bytes"),
        ));
    }
    Ok((
        destination,
        Prepared::Stdio(input, output, request.replay, request.pending),
    ))
}

/// A handed-over socket, if it is a Unix stream socket whose other end
/// is the caller's own (as a host's socketpair is): the daemon never
/// writes, with its credentials, to a peer the caller merely connected to.
fn stream_socket(fd: OwnedFd, caller: &Caller) -> Result<UnixStream, String> {
    use rustix::net::sockopt;
    let kind = sockopt::socket_type(&fd).map_err(|e| e.to_string())?;
    let domain = sockopt::socket_domain(&fd).map_err(|e| e.to_string())?;
    if kind != rustix::net::SocketType::STREAM || domain != rustix::net::AddressFamily::UNIX {
        return Err("a socket that is not a Unix stream socket".into());
    }
    let peer = sockopt::socket_peercred(&fd).map_err(|e| e.to_string())?;
    if Some(peer.uid.as_raw()) != caller.uid {
        return Err(format!(
            "a socket whose other end belongs to uid {}, not the caller",
            peer.uid.as_raw()
        ));
    }
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    UnixStream::from_std(socket).map_err(|e| e.to_string())
}
