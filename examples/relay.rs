//! relay: the least a process between a host and a stdio server can do.
//!
//! `relay COMMAND [ARG…]` runs COMMAND and copies bytes, as they come,
//! from its own stdin to the command's and from the command's stdout to
//! its own: one thread each way, a plain `read` and `write`, no parsing.
//! When its stdin closes, so does the command's; it exits when the
//! command's stdout closes. bench/run puts it beside `mcpctl bridge`: any
//! proxy pays at least what this one does, one more process to wake up on
//! each crossing, so its figure is the floor of a proxy's overhead on the
//! machine and server at hand. An example, never shipped.

use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};

/// Copies until `from` ends or `to` fails.
fn pump(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: relay COMMAND [ARG...]");
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
            eprintln!("relay: cannot run {}: {e}", program.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    let (to_child, from_child) = (child.stdin.take(), child.stdout.take());
    let (Some(to_child), Some(from_child)) = (to_child, from_child) else {
        return ExitCode::FAILURE;
    };
    // End of the host's input closes the command's; the relay ends with
    // the command's output.
    std::thread::spawn(move || pump(std::io::stdin().lock(), to_child));
    pump(from_child, std::io::stdout().lock());
    match child.wait() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}
