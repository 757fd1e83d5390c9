//! `mcpctl auth login|logout|status` (DESIGN §17): the daemon holds the
//! login; mcpctl only listens on 127.0.0.1 for the authorization server's
//! redirect and hands it back.
//!
//! `login` binds the listener (the unit's `redirect-port`, else an
//! ephemeral port), asks the daemon to begin (`AuthBegin`: discovery,
//! registration, the URL with its PKCE challenge and `state`), prints the
//! URL (and opens a browser when there is a display and no
//! `--no-browser`), waits for one request to `/callback` within
//! [`LOGIN_TIMEOUT`], answers the browser, and hands the redirect to
//! `AuthComplete`, which checks and exchanges it. Ctrl-C ends the wait
//! (nothing is left behind: the daemon forgets an unfinished login when
//! the next begins or after its timeout).

use std::io::Write;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{CtlError, dbus_error};
use super::exit;
use crate::dbus::Client;
use crate::supervisor::oauth::LOGIN_TIMEOUT;

type Result<T> = std::result::Result<T, CtlError>;

/// The path the redirect comes back to.
pub const CALLBACK_PATH: &str = "/callback";
/// The most of a browser's request line and headers read.
const MAX_REQUEST: usize = 16 << 10;
/// How long one connection to the listener may take to send its request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// `auth login NAME [--no-browser]`.
pub async fn login(
    client: &Client,
    name: &str,
    no_browser: bool,
    out: &mut dyn Write,
) -> Result<u8> {
    let server = client.server(name).await.map_err(dbus_error)?;
    let port = server.auth_redirect_port().await.map_err(dbus_error)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| CtlError::failure(format!("cannot listen on 127.0.0.1:{port}: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| CtlError::failure(format!("cannot listen: {e}")))?
        .port();
    let redirect_uri = format!("http://127.0.0.1:{port}{CALLBACK_PATH}");
    let url = server.auth_begin(&redirect_uri).await.map_err(dbus_error)?;
    writeln!(out, "Open this URL to log in:").map_err(CtlError::output)?;
    writeln!(out, "{url}").map_err(CtlError::output)?;
    out.flush().map_err(CtlError::output)?;
    if !no_browser && has_display() {
        open_browser(&url);
    }
    let redirect = tokio::time::timeout(LOGIN_TIMEOUT, redirect(&listener, port))
        .await
        .map_err(|_| {
            CtlError::failure(format!(
                "no redirect within {}: run mcpctl auth login {name} again",
                humantime::format_duration(LOGIN_TIMEOUT)
            ))
        })?;
    server.auth_complete(&redirect).await.map_err(dbus_error)?;
    writeln!(out, "Logged in to {name}.").map_err(CtlError::output)?;
    Ok(exit::OK)
}

/// Whether a browser can be shown here.
fn has_display() -> bool {
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|d| !d.is_empty()))
}

/// Opens `url` with `xdg-open`, if there is one; the URL is printed anyway.
fn open_browser(url: &str) {
    let _ = std::process::Command::new("xdg-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Waits for the browser's request to [`CALLBACK_PATH`] and answers it;
/// returns the redirect as a whole URL. Other requests (a favicon) get a
/// 404; a connection that sends nothing in time is dropped.
async fn redirect(listener: &tokio::net::TcpListener, port: u16) -> String {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let target = tokio::time::timeout(REQUEST_DEADLINE, request_target(&mut stream)).await;
        let Ok(Some(target)) = target else {
            continue;
        };
        let is_callback = target
            .split('?')
            .next()
            .is_some_and(|path| path == CALLBACK_PATH);
        let (status, body) = if is_callback {
            ("200 OK", "mcpd has the login. You can close this window.\n")
        } else {
            ("404 Not Found", "not found\n")
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tokio::time::timeout(REQUEST_DEADLINE, stream.write_all(answer.as_bytes())).await;
        if is_callback {
            return format!("http://127.0.0.1:{port}{target}");
        }
    }
}

/// The request target of an HTTP request (`GET /callback?code=… HTTP/1.1`),
/// read within [`MAX_REQUEST`].
async fn request_target(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() + n > MAX_REQUEST {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = std::str::from_utf8(&buf).ok()?;
    let mut parts = text.lines().next()?.split(' ');
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(target)) if target.starts_with('/') => Some(target.to_owned()),
        _ => None,
    }
}

/// `auth logout NAME`.
pub async fn logout(client: &Client, name: &str, out: &mut dyn Write) -> Result<u8> {
    let server = client.server(name).await.map_err(dbus_error)?;
    let note = server.auth_logout().await.map_err(dbus_error)?;
    if note.is_empty() {
        writeln!(out, "Logged out of {name}.").map_err(CtlError::output)?;
    } else {
        writeln!(out, "Logged out of {name}: {note}.").map_err(CtlError::output)?;
    }
    Ok(exit::OK)
}

/// `auth status [NAME…]`: one line per unit with `oauth` (every unit's
/// when none is named). Exit 3 when one of them needs a login.
pub async fn status(client: &Client, names: &[String], out: &mut dyn Write) -> Result<u8> {
    let named = !names.is_empty();
    let names: Vec<String> = if names.is_empty() {
        client
            .manager
            .list_servers()
            .await
            .map_err(dbus_error)?
            .into_iter()
            .map(|row| row.name)
            .collect()
    } else {
        names.to_vec()
    };
    let mut code = exit::OK;
    for name in &names {
        let server = client.server(name).await.map_err(dbus_error)?;
        let auth = server.auth().await.map_err(dbus_error)?;
        if auth.is_empty() {
            if named {
                writeln!(out, "{name}: no login (no `oauth` block)").map_err(CtlError::output)?;
            }
            continue;
        }
        let expires = server.auth_expires_usec().await.map_err(dbus_error)?;
        if !auth.starts_with("OAuth") {
            code = code.max(exit::NOT_RUNNING);
        }
        let line = super::commands::auth_line(&auth, expires);
        writeln!(out, "{name}: {line}").map_err(CtlError::output)?;
    }
    Ok(code)
}
