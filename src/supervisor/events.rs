//! What a unit's generation tasks and host sessions report to its actor
//! ([`Internal`]): a closed enum, so the actor's one `select!` sees every
//! kind of event in one place.

use std::sync::Arc;
use std::time::Duration;

use super::launch::ConnectError;
use super::machine::Gen;
use super::upstream::Handshake;
use crate::mux::lists::ListError;

/// What the generations' tasks report.
#[derive(Debug)]
pub(crate) enum Internal {
    Connected {
        generation: Gen,
        result: Result<Box<Handshake>, ConnectError>,
    },
    Closed {
        generation: Gen,
        error: String,
    },
    Exited {
        generation: Gen,
        status: super::machine::ExitStatus,
    },
    ListChanged {
        generation: Gen,
        /// Cleared when taken, so the next notification sends a notice.
        pending: Arc<std::sync::atomic::AtomicBool>,
    },
    Synced {
        generation: Gen,
        result: Result<super::tools::ToolList, ListError>,
    },
    /// A resource, template or prompt list of generation `generation`
    /// could not be read (the sessions logged it).
    ListFailed {
        generation: Gen,
        error: String,
    },
    /// A request waits for the server (DESIGN §9).
    Demand,
    /// The cache file was written (or not).
    CacheStored {
        digest: u64,
        result: Result<(), String>,
    },
    /// Probe `probe` was answered in time (`refused`: with an error).
    Probed {
        generation: Gen,
        probe: u64,
        rtt: Duration,
        refused: Option<String>,
    },
}
