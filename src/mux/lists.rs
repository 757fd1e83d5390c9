//! The list reader: one pure paging machine for every paginated list mcpd
//! reads from a server (tools, resources, resource templates, prompts),
//! whichever path reads it (a generation's handshake, a re-sync after
//! `list_changed`, the first reads after a handshake).
//!
//! No I/O and no clock: it is handed each answer, with its size as it was
//! received and the instant it arrived, and says what to do next — ask for
//! the page after a cursor, publish the complete list, or give up with a
//! [`ListError`] naming the list and the bound. It refuses a cursor the
//! server already gave (a cycle `A → B → A` as well as `A → A`), reads at
//! most [`MAX_PAGES`] pages and [`MAX_BYTES`] bytes of answers, and gives
//! up at its deadline (the unit's `startup-timeout` after the read began).
//! Whoever drives it arms a timer for [`ListRead::deadline`] and calls
//! [`ListRead::expired`] when it passes, so a server that never answers
//! ends the read too. One bad server cannot hurt the daemon (DESIGN §3,
//! invariant 10): a server that pages for ever once grew it by 2 GB in
//! 20 s.

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::era::CacheHint;
use super::message::Message;
use super::method::Method;

/// Pages one list may take: a server with more is refused.
pub const MAX_PAGES: u32 = 1000;

/// Bytes of answers (as received) one list may take.
pub const MAX_BYTES: usize = 64 << 20;

/// Items one list may hold (a page of tiny items parses into many times
/// its bytes).
pub const MAX_ITEMS: usize = 200_000;

/// A list mcpd reads page by page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum List {
    Resources,
    Templates,
    Prompts,
    Tools,
}

impl List {
    /// The lists mcpd keeps for hosts besides the tools (those are the
    /// machine's), in the order their serials and caches are indexed.
    pub const KEPT: [List; 3] = [List::Resources, List::Templates, List::Prompts];

    /// The list request `method` reads, if it reads one (the inverse of
    /// [`List::request`]).
    pub const fn of(method: Method) -> Option<List> {
        match method {
            Method::ToolsList => Some(List::Tools),
            Method::ResourcesList => Some(List::Resources),
            Method::ResourcesTemplatesList => Some(List::Templates),
            Method::PromptsList => Some(List::Prompts),
            _ => None,
        }
    }

    /// The request that reads it.
    pub const fn request(self) -> Method {
        match self {
            List::Tools => Method::ToolsList,
            List::Resources => Method::ResourcesList,
            List::Templates => Method::ResourcesTemplatesList,
            List::Prompts => Method::PromptsList,
        }
    }

    /// The name of [`List::request`].
    pub const fn method(self) -> &'static str {
        self.request().as_str()
    }

    /// The member of a page's result holding the items.
    pub fn key(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Resources => "resources",
            List::Templates => "resourceTemplates",
            List::Prompts => "prompts",
        }
    }

    /// The server capability that offers it.
    pub fn capability(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Resources | List::Templates => "resources",
            List::Prompts => "prompts",
        }
    }

    /// Its name in D-Bus `ListChanged` (templates are resources).
    pub fn which(self) -> &'static str {
        self.capability()
    }

    /// The notification a server sends when it changed.
    pub const fn notification(self) -> Method {
        match self {
            List::Tools => Method::ToolsListChanged,
            List::Resources | List::Templates => Method::ResourcesListChanged,
            List::Prompts => Method::PromptsListChanged,
        }
    }

    /// The name of [`List::notification`].
    pub const fn changed(self) -> &'static str {
        self.notification().as_str()
    }

    /// Its place among [`List::KEPT`]; the tools, which the machine
    /// keeps, come after them (3).
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for List {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.method())
    }
}

/// Why a list could not be read: displayed as `METHOD: why`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{list}: {why}")]
pub struct ListError {
    pub list: List,
    pub why: Why,
}

/// What ended a read of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// The server gave a cursor it had given before (`cursor`: its JSON
    /// text), after `pages` pages.
    Repeated { cursor: String, pages: u32 },
    /// More than [`MAX_PAGES`] pages.
    TooManyPages,
    /// More than [`MAX_BYTES`] of answers, after `pages` pages.
    TooLarge { pages: u32 },
    /// More than [`MAX_ITEMS`] items.
    TooManyItems,
    /// No complete list within `timeout`, after `pages` pages.
    Expired { timeout: Duration, pages: u32 },
    /// The server answered with an error (its message and code).
    Refused { message: String, code: Option<i64> },
    /// The answer is not a page of this list.
    Malformed(&'static str),
    /// The connection ended (or the read was abandoned) first.
    Lost(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pages = |n: &u32| match n {
            1 => "1 page".to_owned(),
            n => format!("{n} pages"),
        };
        match self {
            Why::Repeated { cursor, pages: n } => {
                write!(f, "cursor {cursor} repeated after {}", pages(n))
            }
            Why::TooManyPages => write!(f, "more than {MAX_PAGES} pages"),
            Why::TooManyItems => write!(f, "more than {MAX_ITEMS} items"),
            Why::TooLarge { pages: n } => write!(
                f,
                "more than {} MiB of answers after {}",
                MAX_BYTES >> 20,
                pages(n)
            ),
            Why::Expired { timeout, pages: n } => write!(
                f,
                "not complete within {} ({} read)",
                humantime::format_duration(*timeout),
                pages(n)
            ),
            Why::Refused {
                message,
                code: Some(code),
            } => write!(f, "{message} ({code})"),
            Why::Refused {
                message,
                code: None,
            } => f.write_str(message),
            Why::Malformed(what) => f.write_str(what),
            Why::Lost(why) => f.write_str(why),
        }
    }
}

/// What to do after an answer.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Ask for the next page, with these `params`.
    Page(Value),
    /// Every item of the list, in the server's order.
    Done(Vec<Value>),
    /// Give up.
    Failed(ListError),
}

/// One read of one list, from its first page to its last.
#[derive(Debug)]
pub struct ListRead {
    list: List,
    began: Instant,
    timeout: Duration,
    pages: u32,
    bytes: usize,
    /// The JSON text of every cursor asked with.
    cursors: HashSet<String>,
    items: Vec<Value>,
    /// The caching hints of the pages so far (a server of 2026-07-28).
    hint: Option<CacheHint>,
}

impl ListRead {
    /// A read of `list` beginning at `now`, to be complete within
    /// `timeout`. The first page is asked for with [`ListRead::first`].
    pub fn new(list: List, now: Instant, timeout: Duration) -> Self {
        Self {
            list,
            began: now,
            timeout,
            pages: 0,
            bytes: 0,
            cursors: HashSet::new(),
            items: Vec::new(),
            hint: None,
        }
    }

    pub fn list(&self) -> List {
        self.list
    }

    /// The params of the first page's request.
    pub fn first(&self) -> Value {
        json!({})
    }

    /// When the read gives up if it is not complete.
    pub fn deadline(&self) -> Instant {
        self.began + self.timeout
    }

    /// Pages read so far.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// The caching hints of the pages read (`ttlMs`, `cacheScope`): the
    /// shortest TTL of any page, public only if every page says so.
    pub fn hint(&self) -> CacheHint {
        self.hint.unwrap_or_default()
    }

    /// The deadline passed at `now` (a timer fired): the error, if it did.
    pub fn expired(&self, now: Instant) -> Option<ListError> {
        (now >= self.deadline()).then(|| {
            self.fail(Why::Expired {
                timeout: self.timeout,
                pages: self.pages,
            })
        })
    }

    /// The read cannot go on (`why`: the connection ended, say).
    pub fn lost(&self, why: impl Into<String>) -> ListError {
        self.fail(Why::Lost(why.into()))
    }

    fn fail(&self, why: Why) -> ListError {
        ListError {
            list: self.list,
            why,
        }
    }

    /// The answer to the request for the current page arrived at `now`:
    /// `message` is the whole JSON-RPC answer, `size` its bytes as
    /// received.
    pub fn answer(&mut self, message: &Message, size: usize, now: Instant) -> Next {
        if let Some(error) = self.expired(now) {
            return Next::Failed(error);
        }
        self.pages += 1;
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > MAX_BYTES {
            return Next::Failed(self.fail(Why::TooLarge { pages: self.pages }));
        }
        let Some(mut result) = message.get::<Value>("result") else {
            let error = message.get::<Value>("error").unwrap_or(Value::Null);
            return Next::Failed(
                self.fail(Why::Refused {
                    message: error["message"]
                        .as_str()
                        .unwrap_or("no result and no error")
                        .to_owned(),
                    code: error["code"].as_i64(),
                }),
            );
        };
        match result.get_mut(self.list.key()).map(Value::take) {
            Some(Value::Array(items)) if self.items.len() + items.len() > MAX_ITEMS => {
                return Next::Failed(self.fail(Why::TooManyItems));
            }
            Some(Value::Array(items)) => self.items.extend(items),
            _ => {
                return Next::Failed(self.fail(Why::Malformed(match self.list {
                    List::Tools => "the answer has no tools array",
                    List::Resources => "the answer has no resources array",
                    List::Templates => "the answer has no resourceTemplates array",
                    List::Prompts => "the answer has no prompts array",
                })));
            }
        }
        let hint = CacheHint::of(&result);
        self.hint = Some(self.hint.map_or(hint, |h| h.and(hint)));
        let cursor = match result.get("nextCursor") {
            None | Some(Value::Null) => return Next::Done(std::mem::take(&mut self.items)),
            Some(cursor) => cursor,
        };
        let text = cursor.to_string();
        if !self.cursors.insert(text.clone()) {
            return Next::Failed(self.fail(Why::Repeated {
                cursor: text,
                pages: self.pages,
            }));
        }
        if self.pages >= MAX_PAGES {
            return Next::Failed(self.fail(Why::TooManyPages));
        }
        Next::Page(json!({ "cursor": cursor }))
    }
}
