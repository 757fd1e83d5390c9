//! Tasks (MCP 2025-11-25's tasks, the 2026-07-28 tasks extension,
//! SEP-2663): a task a host's request created is that host's alone. The
//! server's task ids never reach a host: each host knows its tasks by ids
//! of mcpd's ([`Tasks`]), every place a message names a task id is
//! rewritten both ways ([`rename_tasks`]), and what names a task another
//! host holds (a status notification, a server's question about it, a
//! host's `tasks/get`) reaches only its owner or is refused. The router
//! ([`super::route`]) applies it; pure: no tasks, no I/O, no clock.

use foldhash::HashMap;
use serde_json::Value;

/// The `_meta` key of a message about a task (a task's own notification,
/// a request's or result's link to the task it belongs to).
pub const RELATED_TASK_KEY: &str = "io.modelcontextprotocol/related-task";

/// How many tasks of one server mcpd keeps track of (the map grows with
/// what the server and hosts do: bounded, the oldest forgotten first).
pub const MAX_TASKS: usize = 4096;

/// The tasks of one server of MCP 2026-07-28 (the tasks extension), per
/// host: a task a host's request created is known to that host by an id
/// of mcpd's and to no other host, so that its status notifications reach
/// it alone and only it can ask for the task's status or result, or
/// cancel it. The server's own ids never reach a host.
#[derive(Debug)]
pub struct Tasks<H> {
    /// The server's id → the host and the id it knows.
    up: HashMap<String, (H, String)>,
    /// (host, its id) → the server's id.
    down: HashMap<(H, String), String>,
    /// The server's ids, oldest first (what is forgotten past `MAX_TASKS`).
    order: std::collections::VecDeque<String>,
    next: u64,
}

impl<H> Default for Tasks<H> {
    fn default() -> Self {
        Self {
            up: HashMap::default(),
            down: HashMap::default(),
            order: std::collections::VecDeque::new(),
            next: 0,
        }
    }
}

impl<H: Copy + Eq + std::hash::Hash> Tasks<H> {
    /// The server named task `up` in its answer to `host`'s request: the
    /// id `host` knows it by (the same one each time it is named again).
    pub fn created(&mut self, host: H, up: &str) -> String {
        if let Some((owner, down)) = self.up.get(up)
            && *owner == host
        {
            return down.clone();
        }
        // A server id another host held is that host's no more.
        self.forget(up);
        while self.order.len() >= MAX_TASKS {
            match self.order.pop_front() {
                Some(old) => self.forget(&old),
                None => break,
            }
        }
        self.next += 1;
        let down = format!("mcpd-task-{}", self.next);
        self.up.insert(up.to_owned(), (host, down.clone()));
        self.down.insert((host, down.clone()), up.to_owned());
        self.order.push_back(up.to_owned());
        down
    }

    /// The server's id of the task `host` calls `down`; None when it is
    /// not one of `host`'s (another host's, forgotten, made up).
    pub fn to_server(&self, host: H, down: &str) -> Option<&str> {
        self.down.get(&(host, down.to_owned())).map(String::as_str)
    }

    /// Whose task the server's `up` is, and the id that host knows.
    pub fn to_host(&self, up: &str) -> Option<(H, &str)> {
        self.up.get(up).map(|(host, down)| (*host, down.as_str()))
    }

    /// Task `up` is no more (or no longer tracked).
    pub fn forget(&mut self, up: &str) {
        if let Some((host, down)) = self.up.remove(up) {
            self.down.remove(&(host, down));
            self.order.retain(|o| o != up);
        }
    }

    /// `host` left: its tasks are forgotten; the server's ids of them.
    pub fn detach(&mut self, host: H) -> Vec<String> {
        let ups: Vec<String> = self
            .up
            .iter()
            .filter(|(_, (owner, _))| *owner == host)
            .map(|(up, _)| up.clone())
            .collect();
        for up in &ups {
            self.forget(up);
        }
        ups
    }

    /// How many tasks are tracked.
    pub fn len(&self) -> usize {
        self.up.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.up.is_empty()
    }
}

/// Every task id `message` names, at each place a message of the tasks
/// extension names one: `params.taskId` (`tasks/get`, `tasks/result`,
/// `tasks/cancel`, `notifications/tasks/status`), `result.taskId` and
/// `result.task.taskId` (a task's status, a task created), and the
/// related-task `_meta` of `params` and of `result`. Each id is given to
/// `rename`, which says what it becomes (None: it may not pass); the
/// message is changed only if every id may pass, and `false` says one
/// may not.
pub fn rename_tasks(message: &mut Value, mut rename: impl FnMut(&str) -> Option<String>) -> bool {
    let mut places: Vec<&mut Value> = Vec::new();
    let Some(message) = message.as_object_mut() else {
        return true;
    };
    let parts = message
        .iter_mut()
        .filter(|(part, _)| *part == "params" || *part == "result");
    for (_, part) in parts {
        let Value::Object(object) = part else {
            continue;
        };
        for (key, value) in object.iter_mut() {
            match (key.as_str(), value) {
                ("taskId", id @ Value::String(_)) => places.push(id),
                ("task", Value::Object(task)) => {
                    if let Some(id @ Value::String(_)) = task.get_mut("taskId") {
                        places.push(id);
                    }
                }
                ("_meta", Value::Object(meta)) => {
                    if let Some(Value::Object(related)) = meta.get_mut(RELATED_TASK_KEY)
                        && let Some(id @ Value::String(_)) = related.get_mut("taskId")
                    {
                        places.push(id);
                    }
                }
                _ => {}
            }
        }
    }
    let mut renamed = Vec::with_capacity(places.len());
    for place in &places {
        match rename(place.as_str().unwrap_or_default()) {
            Some(new) => renamed.push(new),
            None => return false,
        }
    }
    for (place, new) in places.into_iter().zip(renamed) {
        *place = Value::String(new);
    }
    true
}
