//! `mcpctl bridge NAME`: a host's stdio MCP server that is a managed
//! server's host session (DESIGN §8), so any MCP host can use it.
//!
//! When stdin and stdout are pipes or sockets (as hosts start servers),
//! the bridge hands them to the daemon over the attach socket
//! (`crate::mux::attach`) and copies nothing: the daemon reads the host's
//! messages and writes its own directly, and the bridge only waits on the
//! socket. The daemon tells it the host's `initialize` request; when the
//! daemon goes away (restarted), the bridge reads the host's messages
//! itself, answering each request with an error at once, and attaches
//! again (backing off from 100 ms to 5 s, or at once for a request:
//! [`Reconnect`], the same for both modes),
//! handing over what it read and the `initialize` to replay: the daemon
//! initializes the new session with it, does not pass the answer on, and
//! tells the host the lists may have changed. Requests in flight when the
//! daemon went away are answered by the daemon as it stops, and what it
//! left unanswered (everything, when it was killed) by the bridge, from
//! the session's ledger (`mux::ledger`: the requests the daemon took and
//! had not answered, which came with the attach reply).
//!
//! Otherwise (a terminal, a file), or when the attach socket cannot be
//! reached but D-Bus can, it copies lines between stdio and the session's
//! socket, reading of each message only its `id` and `method`: it keeps
//! the host's `initialize` request and the host's unanswered requests, so
//! that when the daemon goes away those requests fail at once and the
//! `initialize` exchange is replayed on the next session (its answer not
//! passed on).
//!
//! With no daemon at the start, or one that refuses the session (no such
//! unit or group), it answers the host's requests at once with an error
//! that says why (for no daemon: the instance, where it looked and how to
//! start it), and exits when the host closes its end; it waits (up to
//! `WAIT_FOR_STARTING`) only for a daemon that is starting: one that holds
//! its instance's lock but does not answer yet. A daemon back without the
//! server ends the bridge with exit code 4.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::dbus::Client;
use crate::mux::attach::{self, Accepted, AttachError, Control, Request};
use crate::mux::error::ErrorCode;
use crate::mux::method::Method;
use crate::unit::Instance;

use super::client::CtlError;

/// A line on stderr for whoever reads it; a host that closed the bridge's
/// stderr does not stop the bridge (`eprintln!` would panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "mcpctl bridge: {}", format_args!($($arg)*));
    }};
}
use super::exit;

/// The parts of a message the bridge looks at.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// An id as the daemon writes it back (compact JSON).
fn id_key(id: &RawValue) -> Option<String> {
    let id: Value = serde_json::from_str(id.get()).ok()?;
    (!id.is_null()).then(|| id.to_string())
}

/// What becomes of a line from the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The host gets it.
    Pass,
    /// The answer to a replayed `initialize`.
    Swallow,
    /// The replayed `initialize` was refused.
    Reattach,
}

/// What the bridge knows of the host's session.
#[derive(Debug, Default)]
struct Session {
    /// The host's `initialize` request, to replay after a re-attach.
    initialize: Option<Vec<u8>>,
    /// The id of a replayed `initialize`, whose answer the host must not see.
    swallow: Option<String>,
    /// The host's requests not answered yet.
    pending: HashSet<String>,
}

impl Session {
    /// A line from the host, on its way to the daemon.
    fn host_line(&mut self, line: &[u8]) {
        let Ok(head) = serde_json::from_slice::<Head>(line) else {
            return;
        };
        match (head.method.as_deref(), head.id.and_then(id_key)) {
            (Some(method), Some(id)) => {
                if method == Method::Initialize.as_str() {
                    self.initialize = Some(line.to_vec());
                }
                self.pending.insert(id);
            }
            (Some(method), None) if method == Method::Cancelled.as_str() => {
                // A cancelled request gets no answer.
                let cancelled = head
                    .params
                    .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                    .map(|p| p["requestId"].to_string());
                if let Some(id) = cancelled {
                    self.pending.remove(&id);
                }
            }
            _ => {}
        }
    }

    /// A line from the daemon: whether the host gets it.
    fn daemon_line(&mut self, line: &[u8]) -> Verdict {
        let Ok(head) = serde_json::from_slice::<Head>(line) else {
            return Verdict::Pass;
        };
        if head.method.is_none()
            && let Some(id) = head.id.and_then(id_key)
        {
            if self.swallow.as_ref() == Some(&id) {
                self.swallow = None;
                // A refused replay leaves the new session uninitialized:
                // attach again later rather than fail every request.
                let refused =
                    serde_json::from_slice::<Value>(line).is_ok_and(|m| m.get("error").is_some());
                return if refused {
                    Verdict::Reattach
                } else {
                    Verdict::Swallow
                };
            }
            self.pending.remove(&id);
        }
        Verdict::Pass
    }

    /// The daemon is gone: every unanswered request fails now, with the
    /// outage error the daemon answers while a server is down.
    fn lost(&mut self, why: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for id in self.pending.drain() {
            ErrorCode::ServerDown
                .error(why)
                .write_line(Some(&id), &mut out);
        }
        self.swallow = None;
        out
    }
}

/// Why attaching failed.
enum Failed {
    /// No daemon answers, on the attach socket or D-Bus: why, for each.
    Unreachable(String),
    /// A daemon answered and said no, or the session cannot be used.
    Refused(CtlError),
}

impl From<Failed> for CtlError {
    fn from(failed: Failed) -> Self {
        match failed {
            Failed::Unreachable(why) => CtlError::failure(why),
            Failed::Refused(e) => e,
        }
    }
}

/// Attaches to server `name` for copying: the attach socket, else D-Bus
/// `Attach()` (the connection is not kept).
async fn try_attach(instance: Instance, name: &str) -> Result<UnixStream, Failed> {
    let path = attach_socket(instance);
    let socket = match attach::attach(&path, &Request::new(name), None, &[]) {
        Ok(accepted) => accepted.socket,
        Err(AttachError::Unreachable(socket)) => {
            let client = Client::connect(instance)
                .await
                .map_err(|e| Failed::Unreachable(format!("{socket}; {e}")))?;
            let attached = client.attach(name).await;
            std::os::unix::net::UnixStream::from(attached.map_err(|e| Failed::Refused(e.into()))?)
        }
        Err(refused) => return Err(Failed::Refused(refused.into())),
    };
    let failed = |e: std::io::Error| {
        Failed::Refused(CtlError::failure(format!("cannot use the session: {e}")))
    };
    socket.set_nonblocking(true).map_err(failed)?;
    UnixStream::from_std(socket).map_err(failed)
}

async fn attach(instance: Instance, name: &str) -> Result<UnixStream, CtlError> {
    Ok(try_attach(instance, name).await?)
}

fn attach_socket(instance: Instance) -> std::path::PathBuf {
    crate::mux::attach::socket(&instance.runtime_dir())
}

/// Reads one line into `buf` (kept across cancellations: a partial line
/// stays there); false at end of file or on an error.
async fn read_line<R: AsyncRead + Unpin>(from: &mut BufReader<R>, buf: &mut Vec<u8>) -> bool {
    match from.read_until(b'\n', buf).await {
        Ok(0) | Err(_) => false,
        Ok(_) => true,
    }
}

async fn write<W: AsyncWrite + Unpin>(to: &mut W, bytes: &[u8]) -> bool {
    to.write_all(bytes).await.is_ok() && to.flush().await.is_ok()
}

/// One attached session's halves.
struct Attached {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Attached {
    fn new(socket: UnixStream) -> Self {
        let (read, write) = socket.into_split();
        Self {
            read: BufReader::new(read),
            write,
        }
    }
}

/// The first wait before attaching again once the daemon went away.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between two tries to attach again.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// How the bridge attaches again once the daemon went away, one policy
/// for both modes (handed over and copying; `man/mcpctl.1`): at once when
/// the host sends a request (which has been failed already, so its try
/// does not lengthen the wait), else after [`Reconnect::delay`], which
/// starts at [`FIRST_RETRY`] and doubles after each try that fails by
/// itself (or a new session that refused the replayed `initialize`), up
/// to [`MAX_RETRY`]; it tries for as long as the host stays. The first
/// failure of an outage is said on stderr once, and the return after it.
#[derive(Debug)]
struct Reconnect {
    delay: Duration,
    complained: bool,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self {
            delay: FIRST_RETRY,
            complained: false,
        }
    }
}

impl Reconnect {
    /// How long to wait before the next try, unless a request comes.
    fn delay(&self) -> Duration {
        self.delay
    }

    /// A try that was due failed: the next wait is twice as long.
    fn wait_longer(&mut self) {
        self.delay = (self.delay * 2).min(MAX_RETRY);
    }

    /// Attached again: the next outage starts from the first wait.
    fn reset(&mut self) {
        self.delay = FIRST_RETRY;
    }

    /// A try failed: said once per outage.
    fn complain(&mut self, name: &str, why: &str) {
        if !self.complained {
            say!("cannot attach to {name} again: {why}; retrying");
            self.complained = true;
        }
    }

    /// Attached again: said when the outage was.
    fn attached(&mut self, name: &str) {
        if self.complained {
            say!("attached to {name} again");
            self.complained = false;
        }
    }
}

/// Attaches again after the daemon went away, and replays the host's
/// `initialize` exchange on the new session (its answer is not passed on);
/// the host is told the tools may have changed.
async fn reattach<W: AsyncWrite + Unpin>(
    instance: Instance,
    name: &str,
    session: &mut Session,
    host_out: &mut W,
) -> Result<Attached, CtlError> {
    let mut link = Attached::new(attach(instance, name).await?);
    if let Some(init) = &session.initialize {
        session.swallow = serde_json::from_slice::<Head>(init)
            .ok()
            .and_then(|h| h.id.and_then(id_key));
        let initialized = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";
        if !(write(&mut link.write, init).await && write(&mut link.write, initialized).await) {
            return Err(CtlError::failure("the new session closed at once"));
        }
        let changed = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n";
        // A host that is gone is noticed by the pump.
        let _ = write(host_out, changed).await;
    }
    Ok(link)
}

type HostIn = Box<dyn AsyncRead + Unpin + Send>;
type HostOut = Box<dyn AsyncWrite + Unpin + Send>;

/// The host's end: stdin and stdout as non-blocking pipes or sockets when
/// they are (as hosts start servers), so copying needs no thread; tokio's
/// blocking stdio otherwise (a terminal, a file).
fn host_stdio() -> (HostIn, HostOut) {
    use rustix::fs::FileType;
    use std::os::fd::AsFd;
    let kind = |fd: std::os::fd::BorrowedFd<'_>| {
        rustix::fs::fstat(fd)
            .ok()
            .map(|st| FileType::from_raw_mode(st.st_mode))
    };
    let stdin = std::io::stdin();
    let input: HostIn = match (kind(stdin.as_fd()), stdin.as_fd().try_clone_to_owned()) {
        (Some(FileType::Fifo), Ok(fd)) => match tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
        {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        (Some(FileType::Socket), Ok(fd)) => match socket(fd) {
            Some(socket) => Box::new(socket),
            None => Box::new(tokio::io::stdin()),
        },
        _ => Box::new(tokio::io::stdin()),
    };
    let stdout = std::io::stdout();
    let output: HostOut = match (kind(stdout.as_fd()), stdout.as_fd().try_clone_to_owned()) {
        (Some(FileType::Fifo), Ok(fd)) => match tokio::net::unix::pipe::Sender::from_owned_fd(fd) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        (Some(FileType::Socket), Ok(fd)) => match socket(fd) {
            Some(socket) => Box::new(socket),
            None => Box::new(tokio::io::stdout()),
        },
        _ => Box::new(tokio::io::stdout()),
    };
    (input, output)
}

fn socket(fd: std::os::fd::OwnedFd) -> Option<UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true).ok()?;
    UnixStream::from_std(socket).ok()
}

/// Serves `name` on stdin/stdout until the host closes stdin. While the
/// daemon holds the host's stdio this blocks on one socket and needs no
/// async runtime; one is made for copying, or when the daemon went away.
/// No daemon, or one that refuses the session (no such unit or group):
/// the host is told why at once ([`tell`]), with no wait it would sit
/// through.
pub fn run(instance: Instance, name: &str) -> Result<u8, CtlError> {
    // A daemon that holds its instance's lock is starting (its sockets
    // come next): it is waited for, a bounded moment. With none, no wait.
    let deadline = std::time::Instant::now() + WAIT_FOR_STARTING;
    let mut delay = FIRST_RETRY;
    let started = loop {
        match start(instance, name) {
            Err(Unserved::Down(_))
                if starting(instance) && std::time::Instant::now() + delay < deadline =>
            {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            started => break started,
        }
    };
    match started {
        Ok(done) => done,
        Err(Unserved::Down(why)) => {
            let fix = match instance {
                Instance::User => "systemctl --user start mcpd",
                Instance::System => "systemctl start mcpd",
            };
            let message = match runs_elsewhere(instance) {
                Some(dir) => format!(
                    "mcpd ({} instance) is not running where this bridge looked: {why}; it runs with runtime directory {dir}: set MCPD_RUNTIME_DIR={dir} in the host's entry for {name} (mcpctl connect writes it)",
                    instance.as_str(),
                    dir = dir.display()
                ),
                None => format!(
                    "mcpd ({} instance) is not running: {why}, so server {name} cannot be reached; start it with `{fix}`",
                    instance.as_str()
                ),
            };
            runtime()?.block_on(tell(&message, exit::FAILURE))
        }
        Err(Unserved::Refused(e)) => {
            let message = format!("mcpd cannot serve {name}: {}", e.message);
            runtime()?.block_on(tell(&message, e.code))
        }
    }
}

/// The runtime directory of a daemon of `instance` that runs elsewhere than
/// where this process looks (its state directory names it, and its attach
/// socket is there).
fn runs_elsewhere(instance: Instance) -> Option<std::path::PathBuf> {
    let noted = instance
        .state_dir()
        .join(crate::unit::instance::RUNTIME_BREADCRUMB);
    let bytes = std::fs::read(noted).ok()?;
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::FileTypeExt;
    let dir = std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes));
    if dir == instance.runtime_dir() {
        return None;
    }
    let socket = std::fs::metadata(attach::socket(&dir)).ok()?;
    socket.file_type().is_socket().then_some(dir)
}

/// How long a bridge waits for a daemon that is starting.
const WAIT_FOR_STARTING: Duration = Duration::from_secs(5);

/// Whether a daemon of `instance` runs though its sockets do not answer
/// yet: it is starting. The lock in its runtime directory names the pid
/// of the last daemon that took it, and that process is an `mcpd` still.
/// (The lock itself is not tried: a bridge holding it even for a moment
/// would keep a daemon from starting.)
fn starting(instance: Instance) -> bool {
    let lock = instance.runtime_dir().join("mcpd.lock");
    let Some(pid) = std::fs::read_to_string(lock)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
    else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "mcpd")
}

/// Why a bridge has no session to serve.
enum Unserved {
    /// No daemon answers: why.
    Down(String),
    /// The daemon said no (no such unit or group, access denied).
    Refused(CtlError),
}

/// Attaches to `name` and serves the session; `Err` when there is none.
fn start(instance: Instance, name: &str) -> Result<Result<u8, CtlError>, Unserved> {
    use std::os::fd::AsFd;
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let handable = crate::mux::attach::kind(stdin.as_fd()).is_ok()
        && crate::mux::attach::kind(stdout.as_fd()).is_ok();
    let mut replay = None;
    if handable {
        let path = attach_socket(instance);
        match attach::attach(
            &path,
            &Request {
                stdio: true,
                ..Request::new(name)
            },
            Some([stdin.as_fd(), stdout.as_fd()]),
            &[],
        ) {
            Ok(accepted) => {
                return Ok(match watch_blocking(accepted.socket, &mut replay) {
                    Ended::Done(None) => Ok(exit::OK),
                    Ended::Done(Some(why)) => {
                        say!("mcpd ended the session: {why}");
                        Ok(exit::FAILURE)
                    }
                    Ended::Lost => {
                        let ledger = accepted.ledger;
                        runtime().and_then(|rt| rt.block_on(handed(instance, name, replay, ledger)))
                    }
                });
            }
            // Perhaps D-Bus reaches it.
            Err(AttachError::Unreachable(_)) => {}
            Err(refused) => return Err(Unserved::Refused(refused.into())),
        }
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return Ok(Err(e)),
    };
    match rt.block_on(try_attach(instance, name)) {
        Ok(socket) => Ok(rt.block_on(copy(instance, name, Attached::new(socket)))),
        Err(Failed::Refused(e)) => Err(Unserved::Refused(e)),
        Err(Failed::Unreachable(why)) => Err(Unserved::Down(why)),
    }
}

/// There is no session: the host's requests (its `initialize` first, or
/// a modern host's first request) are answered at once with `message`,
/// so the host shows why; the bridge exits with `code` when the host
/// closes its end, or [`LINGER`] after the first answer.
async fn tell(message: &str, code: u8) -> Result<u8, CtlError> {
    say!("{message}");
    let (host_in, mut host_out) = host_stdio();
    let mut host_in = BufReader::new(host_in);
    let mut line = Vec::new();
    let mut until = None;
    loop {
        line.clear();
        let linger = async {
            match until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            more = read_line(&mut host_in, &mut line) => {
                if !more {
                    break;
                }
                let mut session = Session::default();
                session.host_line(&line);
                let answers = session.lost(message);
                if !answers.is_empty() {
                    if !write(&mut host_out, &answers).await {
                        break;
                    }
                    until.get_or_insert(tokio::time::Instant::now() + LINGER);
                }
            }
            () = linger => break,
        }
    }
    Ok(code)
}

/// How long the bridge stays after telling the host no daemon runs, for a
/// host that reads it late or does not close its end.
const LINGER: Duration = Duration::from_secs(10);

fn runtime() -> Result<tokio::runtime::Runtime, CtlError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CtlError::failure(format!("cannot start the async runtime: {e}")))
}

/// [`watch`], blocking.
fn watch_blocking(control: std::os::unix::net::UnixStream, replay: &mut Option<Value>) -> Ended {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(control);
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(n) if n > 0 && line.ends_with(b"\n") => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => return Ended::Lost,
        }
        if let Some(ended) = control_line(&line, replay) {
            return ended;
        }
    }
}

/// What a control line means: the end, or nothing yet (an `initialize`
/// is kept for replays; lines of a newer daemon are not for this bridge).
fn control_line(line: &[u8], replay: &mut Option<Value>) -> Option<Ended> {
    match serde_json::from_slice::<Control>(line) {
        Ok(Control::Initialize(request)) => {
            *replay = Some(request);
            None
        }
        Ok(Control::End(why)) => Some(Ended::Done(why)),
        Err(_) => None,
    }
}

/// What ended a handed-over session.
enum Ended {
    /// For good: the host closed its input (`None`), or mcpd ended it.
    Done(Option<String>),
    /// mcpd went away.
    Lost,
}

/// Waits on the control socket of a handed-over session, keeping the
/// host's `initialize` request.
async fn watch(control: std::os::unix::net::UnixStream, replay: &mut Option<Value>) -> Ended {
    let Some(control) = socket(control.into()) else {
        return Ended::Lost;
    };
    let mut lines = BufReader::new(control);
    let mut line = Vec::new();
    loop {
        line.clear();
        if !read_line(&mut lines, &mut line).await || !line.ends_with(b"\n") {
            return Ended::Lost;
        }
        if let Some(ended) = control_line(&line, replay) {
            return ended;
        }
    }
}

/// The daemon went away from a handed-over session: the requests it left
/// unanswered (its `ledger`) fail at once, the host's next requests fail
/// until it can be attached again, and the host's stdio is handed over
/// again, each time it goes away.
async fn handed(
    instance: Instance,
    name: &str,
    mut replay: Option<Value>,
    mut ledger: Option<std::os::fd::OwnedFd>,
) -> Result<u8, CtlError> {
    use std::os::fd::AsFd;
    let path = attach_socket(instance);
    let mut control: Option<Accepted> = None;
    let mut reconnect = Reconnect::default();
    loop {
        if let Some(attached) = control.take() {
            reconnect.attached(name);
            ledger = attached.ledger;
            match watch(attached.socket, &mut replay).await {
                Ended::Done(None) => return Ok(exit::OK),
                Ended::Done(Some(why)) => {
                    say!("mcpd ended the session: {why}");
                    return Ok(exit::FAILURE);
                }
                Ended::Lost => {}
            }
        }
        // Detached: the host's requests fail at once until the daemon is
        // back; a request is a reason to try now.
        let (host_in, mut host_out) = host_stdio();
        if let Some(ledger) = ledger.take() {
            let failed = in_flight_failed(name, &ledger);
            if !failed.is_empty() && !write(&mut host_out, &failed).await {
                return Ok(exit::OK);
            }
        }
        let mut host_in = BufReader::new(host_in);
        let mut line = Vec::new();
        let mut pending = Vec::new();
        loop {
            let request = tokio::select! {
                more = read_line(&mut host_in, &mut line) => {
                    if !more {
                        return Ok(exit::OK);
                    }
                    if !line.ends_with(b"\n") {
                        continue;
                    }
                    let head = serde_json::from_slice::<Head>(&line).ok();
                    let is_request = head.as_ref().is_some_and(|h| h.method.is_some() && h.id.and_then(id_key).is_some());
                    if !is_request {
                        // A notification for a session that is gone.
                        line.clear();
                        continue;
                    }
                    true
                }
                () = tokio::time::sleep(reconnect.delay()) => false,
            };
            pending.clear();
            pending.extend_from_slice(&line);
            pending.extend_from_slice(host_in.buffer());
            let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
            let request_for = Request {
                stdio: true,
                replay: replay.clone(),
                pending: pending.len(),
                ..Request::new(name)
            };
            match attach::attach(
                &path,
                &request_for,
                Some([stdin.as_fd(), stdout.as_fd()]),
                &pending,
            ) {
                Ok(attached) => {
                    reconnect.reset();
                    control = Some(attached);
                    break;
                }
                Err(failed) => {
                    let why = match &failed {
                        AttachError::Unreachable(e) => format!("mcpd is not reachable: {e}"),
                        refused => format!("mcpd refused the session: {refused}"),
                    };
                    let failed = CtlError::from(failed);
                    let gone = (failed.code == exit::NO_SUCH_SERVER).then_some(failed);
                    if let Some(e) = gone {
                        if request {
                            let mut session = Session::default();
                            session.host_line(&line);
                            let _ = write(&mut host_out, &session.lost(&why)).await;
                        }
                        return Ok(gone_for_good(name, &e));
                    }
                    reconnect.complain(name, &why);
                    if request {
                        let mut session = Session::default();
                        session.host_line(&line);
                        let failed = session.lost(&why);
                        if !write(&mut host_out, &failed).await {
                            return Ok(exit::OK);
                        }
                        line.clear();
                    } else {
                        reconnect.wait_longer();
                    }
                }
            }
        }
    }
}

/// The errors for the requests a daemon that went away left in `ledger`
/// (a daemon that stopped answered its own, so only a killed one leaves
/// any).
fn in_flight_failed(name: &str, ledger: &std::os::fd::OwnedFd) -> Vec<u8> {
    use std::os::fd::AsFd;
    let ids = match crate::mux::ledger::read(ledger.as_fd()) {
        Ok(ids) => ids,
        Err(e) => {
            say!("cannot read the requests mcpd left unanswered: {e}");
            return Vec::new();
        }
    };
    if !ids.is_empty() {
        say!(
            "mcpd went away with {} of the host's requests unanswered; they fail",
            ids.len()
        );
    }
    let why = format!("server {name}: connection lost: mcpd went away");
    ids.iter()
        // Only ids as the daemon writes them (the bridge's own memory, but
        // never a line of anything else).
        .filter_map(|id| match serde_json::from_str::<Value>(id) {
            Ok(id @ (Value::Number(_) | Value::String(_))) => Some(id.to_string()),
            _ => None,
        })
        .fold(Vec::new(), |mut out, id| {
            // The outage error, as the daemon answers it while a server
            // is down.
            ErrorCode::ServerDown
                .error(why.as_str())
                .write_line(Some(&id), &mut out);
            out
        })
}

/// The daemon came back without the server (its unit was removed while it
/// was away): the bridge ends as a server that is gone would, exit 4.
fn gone_for_good(name: &str, e: &CtlError) -> u8 {
    say!("cannot attach to {name} again: {}", e.message);
    exit::NO_SUCH_SERVER
}

/// Copies lines between stdin/stdout and the session's socket until the
/// host closes stdin.
async fn copy(instance: Instance, name: &str, first: Attached) -> Result<u8, CtlError> {
    let mut attached = Some(first);
    let (host_in, mut host_out) = host_stdio();
    let mut host_in = BufReader::new(host_in);
    let mut session = Session::default();
    let mut from_host = Vec::new();
    let mut from_daemon = Vec::new();
    let mut reconnect = Reconnect::default();
    // The last replayed initialize was refused: keep backing off.
    let mut refused = false;
    loop {
        let Some(link) = attached.as_mut() else {
            // Detached: attach again when due, or at once for a request.
            tokio::select! {
                more = read_line(&mut host_in, &mut from_host) => {
                    if !more {
                        return Ok(exit::OK);
                    }
                    match reattach(instance, name, &mut session, &mut host_out).await {
                        Ok(mut link) => {
                            session.host_line(&from_host);
                            if write(&mut link.write, &from_host).await {
                                attached = Some(link);
                            } else {
                                let failed = session.lost("the connection to mcpd was lost");
                                if !write(&mut host_out, &failed).await {
                                    return Ok(exit::OK);
                                }
                            }
                        }
                        Err(e) => {
                            session.host_line(&from_host);
                            let gone = e.code == exit::NO_SUCH_SERVER;
                            let why = if gone {
                                format!("mcpd refused the session: {}", e.message)
                            } else {
                                format!("mcpd is not reachable: {}", e.message)
                            };
                            let failed = session.lost(&why);
                            if !write(&mut host_out, &failed).await {
                                return Ok(exit::OK);
                            }
                            if gone {
                                return Ok(gone_for_good(name, &e));
                            }
                        }
                    }
                    from_host.clear();
                }
                () = tokio::time::sleep(reconnect.delay()) => {
                    match reattach(instance, name, &mut session, &mut host_out).await {
                        Ok(link) => attached = Some(link),
                        Err(e) if e.code == exit::NO_SUCH_SERVER => {
                            let failed = session.lost(&format!("mcpd refused the session: {}", e.message));
                            let _ = write(&mut host_out, &failed).await;
                            return Ok(gone_for_good(name, &e));
                        }
                        Err(e) => {
                            reconnect.complain(name, &e.message);
                            reconnect.wait_longer();
                        }
                    }
                }
            }
            if attached.is_some() {
                reconnect.attached(name);
                if !refused {
                    reconnect.reset();
                }
                from_daemon.clear();
            }
            continue;
        };
        tokio::select! {
            more = read_line(&mut host_in, &mut from_host) => {
                if !more {
                    // The host is done: so is its session.
                    let _ = link.write.shutdown().await;
                    return Ok(exit::OK);
                }
                session.host_line(&from_host);
                let sent = write(&mut link.write, &from_host).await;
                from_host.clear();
                if !sent {
                    let failed = session.lost("the connection to mcpd was lost");
                    attached = None;
                    if !write(&mut host_out, &failed).await {
                        return Ok(exit::OK);
                    }
                }
            }
            more = read_line(&mut link.read, &mut from_daemon) => {
                if !more || !from_daemon.ends_with(b"\n") {
                    // The daemon went away (restarted, or the unit was removed).
                    let failed = session.lost("the connection to mcpd was lost");
                    attached = None;
                    from_daemon.clear();
                    if !write(&mut host_out, &failed).await {
                        return Ok(exit::OK);
                    }
                    continue;
                }
                match session.daemon_line(&from_daemon) {
                    Verdict::Pass => {
                        if !write(&mut host_out, &from_daemon).await {
                            return Ok(exit::OK);
                        }
                    }
                    Verdict::Swallow => refused = false,
                    Verdict::Reattach => {
                        refused = true;
                        reconnect.wait_longer();
                        let failed = session.lost("the server refused the session; the bridge is reconnecting");
                        attached = None;
                        if !write(&mut host_out, &failed).await {
                            return Ok(exit::OK);
                        }
                    }
                }
                from_daemon.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnecting_backs_off_from_100_ms_to_5_s() {
        let mut reconnect = Reconnect::default();
        let mut waits = Vec::new();
        for _ in 0..8 {
            waits.push(reconnect.delay().as_millis());
            reconnect.wait_longer();
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        reconnect.reset();
        assert_eq!(reconnect.delay(), FIRST_RETRY);
        reconnect.complain("demo", "gone");
        assert!(reconnect.complained, "said once per outage");
        reconnect.attached("demo");
        assert!(!reconnect.complained, "the next outage is said again");
    }

    #[test]
    fn requests_are_pending_until_answered_and_failed_when_the_daemon_goes() {
        let mut s = Session::default();
        s.host_line(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#);
        assert_eq!(
            s.daemon_line(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Verdict::Pass
        );
        s.host_line(br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{}}"#);
        s.host_line(br#"{"jsonrpc":"2.0","id":2,"method":"tools/call"}"#);
        s.host_line(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}"#,
        );
        let failed = String::from_utf8(s.lost("gone")).expect("utf-8");
        assert_eq!(
            failed,
            "{\"error\":{\"code\":-32000,\"message\":\"gone\"},\"id\":\"a\",\"jsonrpc\":\"2.0\"}\n"
        );
        assert!(s.pending.is_empty());
        assert!(s.initialize.is_some(), "kept for the replay");
    }

    #[test]
    fn the_answer_to_a_replayed_initialize_is_not_passed_on() {
        let mut s = Session {
            swallow: Some("1".into()),
            ..Session::default()
        };
        assert_eq!(
            s.daemon_line(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Verdict::Swallow
        );
        assert_eq!(
            s.daemon_line(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Verdict::Pass
        );
        assert_eq!(
            s.daemon_line(b"not json at all\n"),
            Verdict::Pass,
            "copied, not judged"
        );
        s.swallow = Some("2".into());
        assert_eq!(
            s.daemon_line(
                br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"failed"}}"#
            ),
            Verdict::Reattach,
            "a refused replay: attach again later"
        );
    }
}
