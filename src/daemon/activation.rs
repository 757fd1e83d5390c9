//! Socket activation (`LISTEN_FDS`, DESIGN §15): the listening sockets the
//! service manager passed (`mcpd-http.socket`, `FileDescriptorName=http`),
//! taken once, by [`take`], which the binary calls before anything else
//! opens a descriptor (the runtime's would take the number of a passed one
//! that was not there). A descriptor named otherwise, or that is not a
//! listening TCP socket, is closed with a warning.

use std::os::fd::{FromRawFd, OwnedFd};

use std::sync::atomic::{AtomicBool, Ordering};

/// The name the HTTP endpoint's sockets carry (`FileDescriptorName=http`).
pub const NAME: &str = "http";

static TAKEN: AtomicBool = AtomicBool::new(false);
static PASSED: std::sync::Mutex<Vec<std::net::TcpListener>> = std::sync::Mutex::new(Vec::new());

/// Takes the sockets passed for the HTTP endpoint (none without
/// `LISTEN_FDS` for this process), for [`http_listeners`]; only the first
/// call does anything. What it would log is returned, since logging may
/// not be set up yet.
pub fn take() -> Vec<String> {
    let (listeners, said) = claim();
    if let Ok(mut passed) = PASSED.lock() {
        passed.extend(listeners);
    }
    said
}

/// The listeners [`take`] took (taking them now if it was not called).
pub fn http_listeners() -> Vec<std::net::TcpListener> {
    for line in take() {
        tracing::warn!(target: "mcpd::daemon", "{line}");
    }
    PASSED
        .lock()
        .map(|mut p| std::mem::take(&mut *p))
        .unwrap_or_default()
}

fn claim() -> (Vec<std::net::TcpListener>, Vec<String>) {
    let mut said = Vec::new();
    if TAKEN.swap(true, Ordering::SeqCst) {
        return (Vec::new(), said);
    }
    let named = std::env::var_os("LISTEN_FDNAMES").is_some();
    let passed = match sd_notify::listen_fds_with_names() {
        Ok(passed) => passed,
        Err(e) => {
            said.push(format!(
                "ignoring the sockets passed by the service manager: {e}"
            ));
            return (Vec::new(), said);
        }
    };
    let mut listeners = Vec::new();
    for (raw, name) in passed {
        // SAFETY: the service manager passed this descriptor to this
        // process (LISTEN_PID is ours), nothing else in it owns it, and
        // TAKEN makes this the only place that ever takes it.
        #[allow(unsafe_code)]
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if named && name != NAME {
            said.push(format!(
                "closing passed socket {raw} named {name:?}: mcpd serves only sockets named {NAME:?}"
            ));
            continue;
        }
        match listener(fd) {
            Ok(listener) => listeners.push(listener),
            Err(why) => said.push(format!("closing passed descriptor {raw}: {why}")),
        }
    }
    (listeners, said)
}

fn listener(fd: OwnedFd) -> Result<std::net::TcpListener, String> {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let kind = sockopt::socket_type(&fd).map_err(|e| format!("not a socket: {e}"))?;
    let domain = sockopt::socket_domain(&fd).map_err(|e| e.to_string())?;
    if kind != SocketType::STREAM || !matches!(domain, AddressFamily::INET | AddressFamily::INET6) {
        return Err("not a TCP socket".into());
    }
    if !sockopt::socket_acceptconn(&fd).map_err(|e| e.to_string())? {
        return Err("not listening".into());
    }
    let listener = std::net::TcpListener::from(fd);
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(listener)
}
