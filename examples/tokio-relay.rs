//! tokio-relay: `examples/relay` on one thread with tokio, as the daemon
//! serves a bridged session.
//!
//! `tokio-relay COMMAND [ARG…]` runs COMMAND and copies bytes, as they
//! come, from its own stdin to the command's and from the command's stdout
//! to its own, like `examples/relay`, but on one thread: a current-thread
//! tokio runtime and one task that waits on both directions at once
//! (epoll), as mcpd's session task waits on its hosts and its server. It
//! parses nothing. `MCPD_BENCH_RELAY=examples/tokio-relay` puts it in the
//! place of `examples/relay` in the server-everything rows of the daemon
//! benchmark (bench/NOTES.md): the floor of a one-thread, event-driven
//! proxy, against which the daemon's own work per call is what is left.
//! Its stdin and stdout must be pipes. An example, never shipped.

use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, ExitCode, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: tokio-relay COMMAND [ARG...]");
        return ExitCode::from(2);
    };
    let mut child = match Command::new(&program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("tokio-relay: cannot run {}: {e}", program.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    let (Some(to_child), Some(from_child)) = (child.stdin.take(), child.stdout.take()) else {
        return ExitCode::FAILURE;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tokio-relay: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let relayed = runtime.block_on(relay(to_child.into(), from_child.into()));
    if let Err(e) = relayed {
        eprintln!("tokio-relay: {e}");
    }
    // The command's stdin is closed by now (dropped with the relay).
    match child.wait() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}

/// Copies both ways until the host's input or the command's output ends.
async fn relay(to_child: OwnedFd, from_child: OwnedFd) -> std::io::Result<()> {
    let mut host_in =
        pipe::Receiver::from_owned_fd(std::io::stdin().as_fd().try_clone_to_owned()?)?;
    let mut host_out =
        pipe::Sender::from_owned_fd(std::io::stdout().as_fd().try_clone_to_owned()?)?;
    let mut child_in = pipe::Sender::from_owned_fd(to_child)?;
    let mut child_out = pipe::Receiver::from_owned_fd(from_child)?;
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            read = host_in.read(&mut up) => match read? {
                0 => return Ok(()),
                n => child_in.write_all(&up[..n]).await?,
            },
            read = child_out.read(&mut down) => match read? {
                0 => return Ok(()),
                n => host_out.write_all(&down[..n]).await?,
            },
        }
    }
}
