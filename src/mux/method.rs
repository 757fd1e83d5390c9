//! The MCP methods mcpd treats specially, one row each: the only place
//! their names are written (`tests/docs.rs` checks that no other file of
//! `src/` spells one).
//!
//! A message's `method` is parsed into a [`Method`] where it is read
//! ([`Message::method_kind`](super::message::Message::method_kind)), and
//! the code that decides about it matches on the variant; a method mcpd
//! passes on without looking is [`Method::Other`], and keeps its text in
//! the message. Parsing is a `match` on the string: no allocation.
//!
//! Eras: *the handshake* is MCP 2024-11-05 to 2025-11-25 (`initialize`,
//! then requests); *modern* is MCP 2026-07-28 (no handshake: every request
//! carries its version and capabilities, `server/discover` says what a
//! server is, `subscriptions/listen` streams the notifications). A method
//! of both eras says so. *Host* is a client of mcpd's (an MCP host, the
//! aggregate, mcpctl), *server* the unit's MCP server; mcpd is a server to
//! its hosts and a client to its servers.
//!
//! Pure: no I/O, no clock.

use std::fmt;

/// An MCP method, as mcpd knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    // Requests of a client (a host, or mcpd to its server).
    /// `initialize` (handshake era): a host's opens its session with mcpd,
    /// which answers it from the server's (`mux::session`); mcpd sends its
    /// own to the server once per generation (`supervisor::upstream`). A
    /// modern host's is refused. The aggregate sends it to every member
    /// and merges the answers.
    Initialize,
    /// `ping` (both eras, either side): mcpd answers a host's itself and a
    /// server's itself; it pings a handshake server to probe it.
    Ping,
    /// `tools/list` (both eras): answered from the tools mcpd keeps; read
    /// by mcpd page by page (`List::Tools`); merged by the aggregate.
    ToolsList,
    /// `tools/call` (both eras): passed to the server with the host's id
    /// and progress token rewritten; counted per unit; routed by the
    /// tool's prefix in the aggregate; may be answered `input_required`
    /// to a modern host. D-Bus `CallTool` sends one.
    ToolsCall,
    /// `resources/list` (both eras): kept and answered like the tools
    /// (`List::Resources`).
    ResourcesList,
    /// `resources/templates/list` (both eras): kept and answered like the
    /// tools (`List::Templates`).
    ResourcesTemplatesList,
    /// `resources/read` (both eras): passed on; routed by URI in the
    /// aggregate; may be answered `input_required`; its answer carries
    /// caching hints to a modern host. D-Bus `ReadResource` sends one.
    ResourcesRead,
    /// `resources/subscribe` (handshake era): counted per URI by the
    /// router, which subscribes the server once for all hosts (and again
    /// after an outage); a modern host listens instead.
    ResourcesSubscribe,
    /// `resources/unsubscribe` (handshake era): the router unsubscribes
    /// the server when the last host let go of the URI.
    ResourcesUnsubscribe,
    /// `prompts/list` (both eras): kept and answered like the tools
    /// (`List::Prompts`).
    PromptsList,
    /// `prompts/get` (both eras): passed on; routed by the prompt's prefix
    /// in the aggregate; may be answered `input_required`. D-Bus
    /// `GetPrompt` sends one.
    PromptsGet,
    /// `completion/complete` (both eras): passed on; routed by its
    /// reference (a prompt's prefix or a resource's URI) in the aggregate.
    CompletionComplete,
    /// `logging/setLevel` (handshake era): each host's level is its own;
    /// the server gets the most verbose any host asked for (a modern host
    /// names its level per request).
    LoggingSetLevel,
    /// `tasks/get` (MCP 2025-11-25 tasks, both eras): names a task by the
    /// id its host knows, which the router translates.
    TasksGet,
    /// `tasks/list`: the server's answer keeps the host's own tasks only.
    TasksList,
    /// `tasks/cancel`: mcpd sends one for each task of a host that
    /// detaches.
    TasksCancel,
    /// `tasks/result`: names a task, as `tasks/get`.
    TasksResult,
    /// `server/discover` (modern): answered to a modern host from the
    /// server's `initialize` result; sent to a server to learn whether it
    /// is modern (the probe), and to ping a modern one; merged by the
    /// aggregate.
    ServerDiscover,
    /// `subscriptions/listen` (modern): a host's listen stream, served by
    /// mcpd from the server's notifications; the aggregate splits it per
    /// member.
    SubscriptionsListen,

    // Requests of a server to its client (mcpd hands them to a host).
    /// `roots/list` (both eras): a server asks; the host that caused it
    /// answers if it declared `roots`; mcpd answers it itself during the
    /// handshake.
    RootsList,
    /// `sampling/createMessage` (both eras): to the causing host, if it
    /// declared `sampling`.
    SamplingCreateMessage,
    /// `elicitation/create` (both eras, from MCP 2025-06-18): to the
    /// causing host, if it declared `elicitation`.
    ElicitationCreate,

    // Notifications.
    /// `notifications/initialized` (handshake era): mcpd sends the
    /// server's after its `initialize`; a host's is taken by mcpd.
    Initialized,
    /// `notifications/cancelled` (both eras, either side): the request id
    /// it names is translated to the receiver's; mcpd sends one for each
    /// request of a host that went away.
    Cancelled,
    /// `notifications/progress` (both eras, from the server): reaches the
    /// host whose progress token it names, translated back.
    Progress,
    /// `notifications/message` (both eras, from the server): a log
    /// message, shown to each host at its level.
    LogMessage,
    /// `notifications/tools/list_changed` (from the server): mcpd reads
    /// the tools again; hosts hear of it if they changed (through their
    /// listen streams, modern).
    ToolsListChanged,
    /// `notifications/resources/list_changed`: as the tools', for the
    /// resources and their templates.
    ResourcesListChanged,
    /// `notifications/prompts/list_changed`: as the tools', for the
    /// prompts.
    PromptsListChanged,
    /// `notifications/resources/updated` (from the server): reaches the
    /// hosts subscribed to (or listening to) its URI.
    ResourcesUpdated,
    /// `notifications/roots/list_changed` (handshake era, from a client):
    /// a host's passes to the server; mcpd sends one to an instance's
    /// server once its host declared `roots`; none reaches a modern
    /// server (the era has none).
    RootsListChanged,
    /// `notifications/subscriptions/acknowledged` (modern): opens a listen
    /// stream; mcpd sends the host's, and takes its server's.
    SubscriptionsAcknowledged,

    /// Any other method: passed on as it is.
    Other,
}

impl Method {
    /// Every method with a name, in the order of the enum.
    pub const ALL: [Method; 32] = [
        Method::Initialize,
        Method::Ping,
        Method::ToolsList,
        Method::ToolsCall,
        Method::ResourcesList,
        Method::ResourcesTemplatesList,
        Method::ResourcesRead,
        Method::ResourcesSubscribe,
        Method::ResourcesUnsubscribe,
        Method::PromptsList,
        Method::PromptsGet,
        Method::CompletionComplete,
        Method::LoggingSetLevel,
        Method::TasksGet,
        Method::TasksList,
        Method::TasksCancel,
        Method::TasksResult,
        Method::ServerDiscover,
        Method::SubscriptionsListen,
        Method::RootsList,
        Method::SamplingCreateMessage,
        Method::ElicitationCreate,
        Method::Initialized,
        Method::Cancelled,
        Method::Progress,
        Method::LogMessage,
        Method::ToolsListChanged,
        Method::ResourcesListChanged,
        Method::PromptsListChanged,
        Method::ResourcesUpdated,
        Method::RootsListChanged,
        Method::SubscriptionsAcknowledged,
    ];

    /// Its name on the wire (`""` for [`Method::Other`], which has none of
    /// its own).
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::Ping => "ping",
            Method::ToolsList => "tools/list",
            Method::ToolsCall => "tools/call",
            Method::ResourcesList => "resources/list",
            Method::ResourcesTemplatesList => "resources/templates/list",
            Method::ResourcesRead => "resources/read",
            Method::ResourcesSubscribe => "resources/subscribe",
            Method::ResourcesUnsubscribe => "resources/unsubscribe",
            Method::PromptsList => "prompts/list",
            Method::PromptsGet => "prompts/get",
            Method::CompletionComplete => "completion/complete",
            Method::LoggingSetLevel => "logging/setLevel",
            Method::TasksGet => "tasks/get",
            Method::TasksList => "tasks/list",
            Method::TasksCancel => "tasks/cancel",
            Method::TasksResult => "tasks/result",
            Method::ServerDiscover => "server/discover",
            Method::SubscriptionsListen => "subscriptions/listen",
            Method::RootsList => "roots/list",
            Method::SamplingCreateMessage => "sampling/createMessage",
            Method::ElicitationCreate => "elicitation/create",
            Method::Initialized => "notifications/initialized",
            Method::Cancelled => "notifications/cancelled",
            Method::Progress => "notifications/progress",
            Method::LogMessage => "notifications/message",
            Method::ToolsListChanged => "notifications/tools/list_changed",
            Method::ResourcesListChanged => "notifications/resources/list_changed",
            Method::PromptsListChanged => "notifications/prompts/list_changed",
            Method::ResourcesUpdated => "notifications/resources/updated",
            Method::RootsListChanged => "notifications/roots/list_changed",
            Method::SubscriptionsAcknowledged => "notifications/subscriptions/acknowledged",
            Method::Other => "",
        }
    }

    /// The method named `name` (exactly: names are case-sensitive), or
    /// [`Method::Other`].
    pub fn parse(name: &str) -> Method {
        match name {
            "tools/call" => Method::ToolsCall,
            "notifications/progress" => Method::Progress,
            "notifications/message" => Method::LogMessage,
            "notifications/cancelled" => Method::Cancelled,
            "ping" => Method::Ping,
            "initialize" => Method::Initialize,
            "notifications/initialized" => Method::Initialized,
            "tools/list" => Method::ToolsList,
            "resources/list" => Method::ResourcesList,
            "resources/templates/list" => Method::ResourcesTemplatesList,
            "resources/read" => Method::ResourcesRead,
            "resources/subscribe" => Method::ResourcesSubscribe,
            "resources/unsubscribe" => Method::ResourcesUnsubscribe,
            "prompts/list" => Method::PromptsList,
            "prompts/get" => Method::PromptsGet,
            "completion/complete" => Method::CompletionComplete,
            "logging/setLevel" => Method::LoggingSetLevel,
            "tasks/get" => Method::TasksGet,
            "tasks/list" => Method::TasksList,
            "tasks/cancel" => Method::TasksCancel,
            "tasks/result" => Method::TasksResult,
            "server/discover" => Method::ServerDiscover,
            "subscriptions/listen" => Method::SubscriptionsListen,
            "roots/list" => Method::RootsList,
            "sampling/createMessage" => Method::SamplingCreateMessage,
            "elicitation/create" => Method::ElicitationCreate,
            "notifications/tools/list_changed" => Method::ToolsListChanged,
            "notifications/resources/list_changed" => Method::ResourcesListChanged,
            "notifications/prompts/list_changed" => Method::PromptsListChanged,
            "notifications/resources/updated" => Method::ResourcesUpdated,
            "notifications/roots/list_changed" => Method::RootsListChanged,
            "notifications/subscriptions/acknowledged" => Method::SubscriptionsAcknowledged,
            _ => Method::Other,
        }
    }

    /// Whether this request reads one of the four paginated lists
    /// (`mux::lists::List::of` says which).
    pub const fn is_list(self) -> bool {
        matches!(
            self,
            Method::ToolsList
                | Method::ResourcesList
                | Method::ResourcesTemplatesList
                | Method::PromptsList
        )
    }

    /// The client capability a server→client request needs (as `-32021`'s
    /// `requiredCapabilities` names it); `None` for a method no capability
    /// gates.
    pub const fn capability(self) -> Option<&'static str> {
        match self {
            Method::SamplingCreateMessage => Some("sampling"),
            Method::ElicitationCreate => Some("elicitation"),
            Method::RootsList => Some("roots"),
            _ => None,
        }
    }

    /// Whether it is a `tasks/*` request of the table.
    pub const fn is_task(self) -> bool {
        matches!(
            self,
            Method::TasksGet | Method::TasksList | Method::TasksCancel | Method::TasksResult
        )
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_method() {
        for method in Method::ALL {
            assert_eq!(Method::parse(method.as_str()), method, "{method}");
        }
        assert_eq!(Method::parse(""), Method::Other);
        assert_eq!(Method::parse("tools/Call"), Method::Other);
        assert_eq!(Method::parse("x/y"), Method::Other);
        assert_eq!(Method::Other.as_str(), "");
    }

    #[test]
    fn all_holds_every_named_variant_once() {
        let names: std::collections::HashSet<_> = Method::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names.len(), Method::ALL.len());
        assert!(!names.contains(""));
        // `Other` is last: each variant before it is in `ALL`.
        assert_eq!(Method::Other as usize, Method::ALL.len());
        for (i, method) in Method::ALL.into_iter().enumerate() {
            assert_eq!(method as usize, i, "{method}");
        }
    }

    #[test]
    fn the_lists_name_their_requests() {
        use crate::mux::lists::List;
        for list in [List::Tools, List::Resources, List::Templates, List::Prompts] {
            assert!(list.request().is_list());
            assert_eq!(List::of(list.request()), Some(list));
        }
        assert!(!Method::ToolsCall.is_list());
        assert_eq!(List::of(Method::ToolsCall), None);
    }
}
