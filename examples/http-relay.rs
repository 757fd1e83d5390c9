//! http-relay: the least an HTTP front to a stdio server can do.
//!
//! `http-relay COMMAND [ARG…]` listens on a free loopback port (its first
//! line on stdout is the address), runs COMMAND, and serves every POST the
//! same way: the body, as one line, to the command's stdin; for a request
//! (a body with an `"id"` and a `"method"`) the command's next answer line
//! comes back as one `application/json` response, anything else is
//! `202 Accepted`. One request at a time, HTTP/1.1 keep-alive (hyper's
//! server, as mcpd's endpoint), `TCP_NODELAY`; an `initialize` gets an
//! `Mcp-Session-Id` that is never checked; no tokens, no SSE, no routing,
//! no bounds. bench/run puts it beside mcpd's endpoint as `relay` is put
//! beside the bridge: any HTTP front to a stdio server pays at least one
//! TCP round trip, an HTTP request parsed and a response written on top of
//! the server's own answer, so this one's figure is the floor of an HTTP
//! front on the machine and server at hand. An example, never shipped.

use std::convert::Infallible;
use std::process::{ExitCode, Stdio};
use std::rc::Rc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode, header};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::Mutex;

/// The command's pipes, one request at a time.
struct Child {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
}

impl Child {
    /// Writes `body` as a line; for a request, reads lines until an
    /// answer (a line without a `"method"`) and returns it.
    async fn exchange(&mut self, body: &[u8], request: bool) -> std::io::Result<Option<Bytes>> {
        let mut line = Vec::with_capacity(body.len() + 1);
        line.extend_from_slice(body);
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        if !request {
            return Ok(None);
        }
        loop {
            self.line.clear();
            if self.stdout.read_until(b'\n', &mut self.line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if !contains(&self.line, b"\"method\"") {
                return Ok(Some(Bytes::copy_from_slice(&self.line)));
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn serve(
    child: Rc<Mutex<Child>>,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return status(StatusCode::BAD_REQUEST),
    };
    let is_request = contains(&body, b"\"id\"") && contains(&body, b"\"method\"");
    let answer = child.lock().await.exchange(&body, is_request).await;
    match answer {
        Ok(Some(answer)) => {
            let mut response = Response::new(Full::new(answer));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            if contains(&body, b"\"initialize\"") {
                headers.insert("mcp-session-id", header::HeaderValue::from_static("relay"));
            }
            response
        }
        Ok(None) => status(StatusCode::ACCEPTED),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = code;
    response
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: http-relay COMMAND [ARG...]");
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let mut command = tokio::process::Command::new(&program);
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut spawned = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("http-relay: cannot run {}: {e}", program.to_string_lossy());
                return ExitCode::from(127);
            }
        };
        let (Some(stdin), Some(stdout)) = (spawned.stdin.take(), spawned.stdout.take()) else {
            return ExitCode::FAILURE;
        };
        let child = Rc::new(Mutex::new(Child {
            stdin,
            stdout: BufReader::new(stdout),
            line: Vec::new(),
        }));
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("http-relay: cannot listen: {e}");
                return ExitCode::FAILURE;
            }
        };
        match listener.local_addr() {
            Ok(addr) => println!("{addr}"),
            Err(_) => return ExitCode::FAILURE,
        }
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let child = Rc::clone(&child);
            tokio::task::spawn_local(async move {
                let service = hyper::service::service_fn(move |request| {
                    let child = Rc::clone(&child);
                    async move { Ok::<_, Infallible>(serve(child, request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
