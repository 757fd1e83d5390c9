//! An in-process fake for the supervisor's [`Launcher`]: each "process" is a
//! real rmcp server on an in-memory duplex pipe, with a fake PID and an exit
//! the test controls, so actor tests run on paused time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcpd::mux::wire::{Stream, Wire};
use mcpd::supervisor::launch::{BoxFuture, ConnectError, Launched, Launcher};
use mcpd::supervisor::machine::{ExitStatus, Gen, Signal};
use mcpd::unit::UnitSpec;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use tokio::sync::{Notify, oneshot};

/// How the next launch behaves.
#[derive(Debug, Clone)]
pub enum Plan {
    /// Serve MCP until told to exit.
    Serve,
    /// The program cannot be started at all.
    FailSpawn(String),
    /// The process exits at once with this code, before answering.
    DieAtOnce(i32),
}

/// Instrumentation shared by every fake server.
#[derive(Debug, Default)]
pub struct Probe {
    /// tools/list requests being answered right now.
    pub in_flight: AtomicUsize,
    /// The most tools/list requests ever answered at once.
    pub max_in_flight: AtomicUsize,
    /// tools/list requests started.
    pub lists: AtomicUsize,
    /// pings (the actor's health probes) answered.
    pub pings: AtomicUsize,
    /// Told of every change of the counters above, for [`Probe::until`].
    changed: Notify,
}

impl Probe {
    /// Waits until `cond` holds of the counters, woken by their changes
    /// (not by polling).
    pub async fn until(&self, cond: impl Fn(&Probe) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a change in between still wakes it.
            changed.as_mut().enable();
            if cond(self) {
                return;
            }
            changed.await;
        }
    }
}

/// The fake server's state, shared with the test.
#[derive(Clone)]
pub struct Server {
    pub tools: Arc<Mutex<Vec<String>>>,
    pub probe: Arc<Probe>,
    /// Each tools/list waits this long (virtual time).
    pub list_delay: Arc<Mutex<Duration>>,
    /// When set, tools/list blocks until notified.
    pub gate: Arc<Mutex<Option<Arc<Notify>>>>,
}

struct InFlight(Arc<Probe>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn ping(&self, _context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.probe.pings.fetch_add(1, Ordering::SeqCst);
        self.probe.changed.notify_waiters();
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let probe = Arc::clone(&self.probe);
        probe.lists.fetch_add(1, Ordering::SeqCst);
        let now = probe.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        probe.max_in_flight.fetch_max(now, Ordering::SeqCst);
        probe.changed.notify_waiters();
        let _guard = InFlight(probe);
        let gate = self.gate.lock().expect("lock").clone();
        if let Some(gate) = gate {
            gate.notified().await;
        }
        let delay = *self.list_delay.lock().expect("lock");
        // (scenario: a slow server, in virtual time)
        tokio::time::sleep(delay).await;
        // The list as it is when the answer is sent: the newest.
        let names = self.tools.lock().expect("lock").clone();
        Ok(ListToolsResult::with_all_items(
            names
                .into_iter()
                .map(|n| Tool::new(n, "fake tool", Arc::new(serde_json::Map::new())))
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(
            CallToolResult::success(vec![ContentBlock::text(format!("called {}", request.name))])
                .into(),
        )
    }
}

struct Proc {
    exit: Option<oneshot::Sender<ExitStatus>>,
    server_task: Option<tokio::task::JoinHandle<()>>,
    peer: Option<Peer<RoleServer>>,
    ignore_term: bool,
}

#[derive(Default)]
struct State {
    plans: VecDeque<Plan>,
    launches: Vec<Gen>,
    signals: Vec<(u32, Signal)>,
    procs: HashMap<u32, Proc>,
    next_pid: u32,
    ignore_term: bool,
}

/// The fake launcher. Clone it to keep a handle in the test.
#[derive(Clone)]
pub struct Fake {
    state: Arc<Mutex<State>>,
    pub server: Server,
}

impl Fake {
    pub fn new(tools: &[&str]) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                next_pid: 1000,
                ..State::default()
            })),
            server: Server {
                tools: Arc::new(Mutex::new(tools.iter().map(|t| t.to_string()).collect())),
                probe: Arc::new(Probe::default()),
                list_delay: Arc::new(Mutex::new(Duration::ZERO)),
                gate: Arc::new(Mutex::new(None)),
            },
        }
    }

    /// Queues behaviours for the next launches (then: Serve).
    pub fn plan(&self, plans: impl IntoIterator<Item = Plan>) {
        self.state.lock().expect("lock").plans.extend(plans);
    }

    /// Later processes ignore SIGTERM.
    pub fn ignore_term(&self, ignore: bool) {
        self.state.lock().expect("lock").ignore_term = ignore;
    }

    pub fn launches(&self) -> usize {
        self.state.lock().expect("lock").launches.len()
    }

    pub fn signals(&self) -> Vec<(u32, Signal)> {
        self.state.lock().expect("lock").signals.clone()
    }

    /// PIDs of processes not yet exited.
    pub fn live(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .state
            .lock()
            .expect("lock")
            .procs
            .keys()
            .copied()
            .collect();
        pids.sort();
        pids
    }

    /// The process `pid` exits with `status` (its server stops first).
    pub fn exit(&self, pid: u32, status: ExitStatus) {
        let proc = self.state.lock().expect("lock").procs.remove(&pid);
        if let Some(mut proc) = proc {
            if let Some(task) = proc.server_task.take() {
                task.abort();
            }
            if let Some(exit) = proc.exit.take() {
                let _ = exit.send(status);
            }
        }
    }

    /// The server of `pid` sends `notifications/tools/list_changed`.
    pub async fn notify_list_changed(&self, pid: u32) {
        let peer = self
            .state
            .lock()
            .expect("lock")
            .procs
            .get(&pid)
            .and_then(|p| p.peer.clone());
        if let Some(peer) = peer {
            let _ = peer.notify_tool_list_changed().await;
        }
    }

    pub fn set_tools(&self, tools: &[&str]) {
        *self.server.tools.lock().expect("lock") = tools.iter().map(|t| t.to_string()).collect();
    }
}

impl Fake {
    /// What [`Launcher::launch`] resolves to: a generation at once.
    fn start(&self, _spec: &UnitSpec, generation: Gen) -> Result<Launched, String> {
        let mut state = self.state.lock().expect("lock");
        state.launches.push(generation);
        let plan = state.plans.pop_front().unwrap_or(Plan::Serve);
        if let Plan::FailSpawn(error) = plan {
            return Err(error);
        }
        state.next_pid += 1;
        let pid = state.next_pid;
        let (exit_tx, exit_rx) = oneshot::channel();
        let exit: BoxFuture<ExitStatus> =
            Box::pin(async move { exit_rx.await.unwrap_or(ExitStatus::Code(-1)) });
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let ignore_term = state.ignore_term;
        if let Plan::DieAtOnce(code) = plan {
            drop(server_io);
            let _ = exit_tx.send(ExitStatus::Code(code));
        } else {
            let server = self.server.clone();
            let shared = Arc::clone(&self.state);
            let task = tokio::spawn(async move {
                if let Ok(running) = server.serve(tokio::io::split(server_io)).await {
                    if let Some(proc) = shared.lock().expect("lock").procs.get_mut(&pid) {
                        proc.peer = Some(running.peer().clone());
                    }
                    let _ = running.waiting().await;
                }
            });
            state.procs.insert(
                pid,
                Proc {
                    exit: Some(exit_tx),
                    server_task: Some(task),
                    peer: None,
                    ignore_term,
                },
            );
        }
        let (read, write) = tokio::io::split(client_io);
        let wire = Wire::lines(Stream(read), write);
        let connect: BoxFuture<Result<Wire, ConnectError>> = Box::pin(async move { Ok(wire) });
        Ok(Launched {
            pid: Some(pid),
            connect,
            exit: Some(exit),
        })
    }
}

impl Launcher for Fake {
    fn launch(&self, spec: &UnitSpec, generation: Gen) -> BoxFuture<Result<Launched, String>> {
        Box::pin(std::future::ready(self.start(spec, generation)))
    }
    fn signal(&self, pid: u32, signal: Signal) {
        let ignore = {
            let mut state = self.state.lock().expect("lock");
            state.signals.push((pid, signal));
            state.procs.get(&pid).is_some_and(|p| p.ignore_term)
        };
        match signal {
            Signal::Term if ignore => {}
            Signal::Term => self.exit(pid, ExitStatus::Signal(15)),
            Signal::Kill => self.exit(pid, ExitStatus::Signal(9)),
        }
    }

    fn reaped(&self, _pid: u32) {}
}
