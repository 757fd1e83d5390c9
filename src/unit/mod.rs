//! Unit files: KDL 2 text on disk → validated [`UnitSpec`]s.
//!
//! Architecture invariant: this module is pure. It reads files but never
//! imports tokio or zbus, spawns nothing and keeps no state. The daemon, the
//! supervisor and `mcpctl verify` all load units through [`load`], so they
//! agree on what a unit means and on every error message.
//!
//! Reading order: [`instance`] (which daemon), [`search`] finds files, [`load`] reads them, [`syntax`]
//! turns each KDL document into a located layer by the vocabulary of
//! [`keys`], [`spec`] judges the merged
//! draft, [`diag`] renders what went wrong.

pub mod diag;
pub mod instance;
pub mod keys;
pub mod load;
pub mod name;
pub mod search;
pub mod settings;
pub mod spec;
mod syntax;

/// Every key of the unit vocabulary, as `block.key` (top-level keys bare).
pub fn vocabulary() -> Vec<String> {
    keys::KEYS.iter().map(keys::Key::path).collect()
}

pub use diag::{LoadError, Problem, Style};
pub use instance::Instance;
pub use load::{Context, Loader, UnitFiles, load, load_in, load_with};
pub use name::{InstanceName, InstanceOf, UnitName};
pub use search::{Found, discover, search_path};
pub use spec::{
    Activation, Credential, CredentialsSpec, Grant, HeaderValue, HealthPolicy, HttpSpec, Limits,
    Network, OAuthSpec, Protocol, RateLimit, ReconnectPolicy, Sandbox, Secret, Sessions, StdioSpec,
    ToolFilter, Transport, UnitDraft, UnitSpec,
};
