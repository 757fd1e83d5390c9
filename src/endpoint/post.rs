//! A POST's way through the endpoint: in a session ([`post`]), or as a
//! 2026-07-28 request without one (`stateless`), and its answer as one
//! JSON body or an SSE stream (`respond`).

use super::*;

pub(super) async fn post(
    inner: &Arc<Inner>,
    settings: &HttpSettings,
    token: Option<&str>,
    caller: &Caller,
    name: &str,
    session: Option<String>,
    request: Request<Incoming>,
) -> Response<Body> {
    let too_large = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY as u64);
    if too_large {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("a request body is at most {} MiB", MAX_BODY >> 20),
        );
    }
    let sse_ok = accepts(&request, "text/event-stream");
    // What a stateless request's checks read (values share their bytes;
    // a request of a session needs none).
    let headers = if session.is_none() {
        modern_headers(request.headers())
    } else {
        Vec::new()
    };
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let read = read_body(request.into_body(), announced, &inner.budget);
    let (body, held) = match tokio::time::timeout(read_timeout(), read).await {
        Err(_) => {
            tracing::debug!(target: "mcpd::http", "a request body did not come within {}", humantime::format_duration(read_timeout()));
            return refuse(StatusCode::REQUEST_TIMEOUT, "the body did not come in time");
        }
        Ok(Err(BodyError::TooLarge)) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("a request body is at most {} MiB", MAX_BODY >> 20),
            );
        }
        Ok(Err(BodyError::Busy)) => return busy(),
        Ok(Err(BodyError::Read(e))) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            );
        }
        Ok(Ok(read)) => read,
    };
    let message = match parse(&body) {
        Ok(message) => message,
        Err(response) => return *response,
    };
    drop(body);
    // The message (a copy) is held until it is forwarded below.
    let _held = held;
    // What the unit would refuse is answered here, never counted in
    // flight, and never forwarded (`mux::shape`).
    if let Some(flaw) = crate::mux::shape::check(&message) {
        let id = flaw.keeps_id().then(|| message.request_id()).flatten();
        return full(
            StatusCode::BAD_REQUEST,
            "application/json",
            flaw.code()
                .error(flaw.why())
                .line(id.as_ref().map(|id| id.as_json())),
        );
    }
    let method = message.method_kind();
    let id = message.request_id();
    if session.is_none() && modern::sent_as_modern(&header_view(&headers), &message) {
        return stateless(
            inner,
            settings,
            (token, caller),
            name,
            message,
            &headers,
            sse_ok,
        )
        .await;
    }
    let (session_id, open) = match (&session, method) {
        (None, Some(McpMethod::Initialize)) if id.is_some() => {
            match inner.open(name, settings, token, caller) {
                Ok(opened) => opened,
                Err(response) => return *response,
            }
        }
        (None, _) => return missing_session(None),
        (Some(sid), _) => match inner.session(name, Some(sid), token) {
            Some(open) => (sid.clone(), open),
            None => return missing_session(Some(sid)),
        },
    };
    let (Some(_), Some(id)) = (&method, id) else {
        // A notification, or an answer to the server's request.
        if open.forward(&message).is_err() {
            return missing_session(Some(&session_id));
        }
        return full(StatusCode::ACCEPTED, "text/plain", "");
    };
    let json = !sse_ok;
    let (sink, rx) = session::stream();
    if open.request(&message, id, sink, json).is_err() {
        return missing_session(Some(&session_id));
    }
    // Not kept while the answer is awaited (the body may be large).
    drop((open, message));
    let Some((mut response, _)) = respond(rx, &inner.budget).await else {
        return missing_session(Some(&session_id));
    };
    if let Ok(value) = HeaderValue::from_str(&session_id) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// A request sent as MCP 2026-07-28 without a session: checked as that
/// wire says ([`modern::refusal`], [`param_mismatch`]), then served by a
/// host session of its own for it alone.
async fn stateless(
    inner: &Arc<Inner>,
    settings: &HttpSettings,
    (token, caller): (Option<&str>, &Caller),
    name: &str,
    message: Message,
    headers: &[(header::HeaderName, HeaderValue)],
    sse_ok: bool,
) -> Response<Body> {
    let Some(id) = message.request_id() else {
        // A notification has nothing to reach without a session.
        return full(StatusCode::ACCEPTED, "text/plain", "");
    };
    let view = header_view(headers);
    let refusal = modern::refusal(&view, &message).or_else(|| {
        let why = param_mismatch(inner, name, &message, &view)?;
        Some(modern::Refusal {
            status: 400,
            code: ErrorCode::HeaderMismatch,
            message: why,
            data: None,
        })
    });
    if let Some(refusal) = refusal {
        return full(
            StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_REQUEST),
            "application/json",
            refusal.line(Some(id.as_json())),
        );
    }
    let json = !sse_ok;
    // A retry that answers a parked call goes to the session that holds it.
    let state = message
        .params()
        .and_then(|p| p.get("requestState")?.as_str().map(str::to_owned));
    let parked = state.and_then(|state| {
        let parked = inner.parked.lock().ok()?;
        let (to, owner) = parked.get(&state)?;
        (owner.as_deref() == token).then(|| to.clone())
    });
    if let Some(to) = parked {
        let (sink, rx) = session::stream();
        let retry = session::Once {
            message,
            id,
            sink,
            json,
        };
        if to.send(retry).await.is_ok() {
            return answer(rx, &inner.budget).await;
        }
        return rpc_error(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidParams,
            "the call this retry answers is gone",
        );
    }
    let Some(shared) = inner.shared.upgrade() else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping");
    };
    if let Some(unit) = per_host(&shared, name) {
        let requested = modern_version(&message).unwrap_or_else(|| crate::mux::era::MODERN.into());
        let mut supported = crate::mux::era::HOST_VERSIONS;
        supported.reverse();
        let mut refusal = crate::mux::era::unsupported(&id.to_value(), &requested, &supported);
        refusal["error"]["message"] = format!(
            "unit {unit} runs an instance per host session (sessions \"per-host\"): a request without a session has none to run on; open a session with initialize (MCP {})",
            supported[0]
        )
        .into();
        return full(
            StatusCode::BAD_REQUEST,
            "application/json",
            crate::mux::lines::line(&refusal),
        );
    }
    if inner.count() >= settings.max_sessions {
        return rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ServerDown,
            &format!(
                "more than {} HTTP sessions (max-sessions)",
                settings.max_sessions
            ),
        );
    }
    if let Some(hash) = token
        && inner.held_by(hash) >= settings.per_token()
    {
        return rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ServerDown,
            &format!(
                "this token holds {} HTTP sessions and requests in flight (max-sessions-per-token)",
                settings.per_token()
            ),
        );
    }
    let (mine, theirs) = crate::mux::memory::pair(session::PAIR_BUFFER);
    if let Err(response) = attach(&shared, name, HostLink::Memory(theirs), caller) {
        return *response;
    }
    let (sink, rx) = session::stream();
    let counted = Arc::clone(&inner.stateless);
    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    inner.note_stateless(token, true);
    let weak = Arc::downgrade(inner);
    let token = token.map(str::to_owned);
    let (done_inner, done_token) = (weak.clone(), token.clone());
    let epoch = inner.epoch.subscribe();
    tokio::spawn(async move {
        let (valid_inner, valid_token) = (weak.clone(), token.clone());
        let valid = move || match (&valid_token, valid_inner.upgrade()) {
            (None, _) => true,
            (Some(hash), Some(inner)) => inner.token(hash).is_some_and(|e| !e.expired(now())),
            (Some(_), None) => false,
        };
        let (park_inner, unpark_inner) = (weak.clone(), weak);
        let park = move |state: &str, to: mpsc::Sender<session::Once>| {
            if let Some(inner) = park_inner.upgrade()
                && let Ok(mut parked) = inner.parked.lock()
            {
                parked.insert(state.to_owned(), (to, token.clone()));
            }
        };
        let unpark = move |state: &str| {
            if let Some(inner) = unpark_inner.upgrade()
                && let Ok(mut parked) = inner.parked.lock()
            {
                parked.remove(state);
            }
        };
        let link = HostLink::Memory(mine);
        let first = session::Once {
            message,
            id,
            sink,
            json,
        };
        session::once(link, first, epoch, valid, park, unpark).await;
        counted.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(inner) = done_inner.upgrade() {
            inner.note_stateless(done_token.as_deref(), false);
        }
    });
    answer(rx, &inner.budget).await
}

/// The first unit of `name` (a unit, or an aggregate's members) that
/// runs an instance per host session (DESIGN §13). A stateless request
/// (MCP 2026-07-28, no session) is not served there: an instance per
/// request would start a process for each and keep no state between
/// them, which is what such a unit is for. It gets
/// [`ErrorCode::UnsupportedVersion`] naming the 2025 versions, on which a
/// client in the SDKs' `auto` mode opens a session (`initialize`), which
/// gets an instance of its own.
fn per_host(shared: &Arc<Shared>, name: &str) -> Option<String> {
    let target = Target::parse(name).ok()?;
    if target.is_aggregate() {
        let members = shared.members(&target).ok()?;
        members
            .into_iter()
            .find(|(_, _, s)| s.is_per_host())
            .map(|(unit, _, _)| unit)
    } else {
        let supervisor = shared.supervisor(name).ok()?;
        supervisor.is_per_host().then(|| name.to_owned())
    }
}

/// A stateless request's response ([`respond`]); one JSON body goes with
/// the status its error code has on the 2026-07-28 wire
/// ([`modern::status_of`]).
async fn answer(rx: session::Stream, budget: &Arc<tokio::sync::Semaphore>) -> Response<Body> {
    respond(rx, budget).await.map_or_else(
        || refuse(StatusCode::SERVICE_UNAVAILABLE, "no answer"),
        |(mut response, json)| {
            if let Some(line) = json {
                *response.status_mut() =
                    StatusCode::from_u16(modern::status_of(&line)).unwrap_or(StatusCode::OK);
            }
            response
        },
    )
}

/// The response to a request whose stream `rx` is: its answer as one
/// `application/json` body when nothing came before it, else an SSE
/// stream from the first event on; `None` if the stream ended empty.
/// With the response, the answer line when it is one JSON body.
async fn respond(
    mut rx: session::Stream,
    budget: &Arc<tokio::sync::Semaphore>,
) -> Option<(Response<Body>, Option<Bytes>)> {
    Some(match rx.recv().await? {
        Item::Answer(line) => {
            // Held until written: within the daemon's budget.
            let permit = u32::try_from(line.len())
                .ok()
                .and_then(|n| Arc::clone(budget).try_acquire_many_owned(n).ok());
            match permit {
                Some(permit) => (
                    full(
                        StatusCode::OK,
                        "application/json",
                        budgeted(line.clone(), permit),
                    ),
                    Some(line),
                ),
                None => (busy(), None),
            }
        }
        Item::Event(first) => {
            // A session's stream: its first event has an id, and the
            // stream is resumable from before it.
            let prime = modern::event_id(&first).map(|(stream, _)| (stream, 0));
            (sse(prime, Some(first), rx), None)
        }
    })
}

/// One JSON-RPC message of a body (a line for the unit: a body written
/// over several lines is made one), or the error to answer.
fn parse(body: &[u8]) -> Result<Message, Box<Response<Body>>> {
    let one_line;
    let line = if memchr::memchr2(b'\n', b'\r', body).is_some() {
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
            rpc_error(
                StatusCode::BAD_REQUEST,
                ErrorCode::ParseError,
                &format!("parse error: {e}"),
            )
        })?;
        one_line = serde_json::to_vec(&value).unwrap_or_default();
        &one_line[..]
    } else {
        body
    };
    match Message::parse(line) {
        Ok(message) => Ok(message),
        Err(why) => {
            let text = why.to_string();
            let (code, text) = if line.first() == Some(&b'[') {
                (
                    ErrorCode::InvalidRequest,
                    "batches are not part of MCP 2025-11-25: send one message per request"
                        .to_owned(),
                )
            } else if serde_json::from_slice::<serde_json::Value>(line).is_ok() {
                (
                    ErrorCode::InvalidRequest,
                    format!("invalid request: {text}"),
                )
            } else {
                (ErrorCode::ParseError, format!("parse error: {text}"))
            };
            Err(Box::new(rpc_error(StatusCode::BAD_REQUEST, code, &text)))
        }
    }
}
