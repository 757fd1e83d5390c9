//! The daemon's own `RLIMIT_NOFILE`: raised to the hard limit at start, as
//! systemd advises for daemons that hold many file descriptors (every
//! client connection and every server's three pipes cost one each), while
//! children get back the soft limit the daemon was started with (systemd
//! gives services 1024), since servers that use `select()` break on
//! descriptors above 1023.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The limits before and after [`raise`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    /// What the daemon was started with: what children get.
    pub inherited: Rlimit,
    /// What the daemon runs with now.
    pub now: Rlimit,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. `None` when there is
/// nothing to raise (already equal, or unlimited); an error when the kernel
/// refuses (the daemon then keeps the limit it has).
pub fn raise() -> Result<Option<Raised>, std::io::Error> {
    let inherited = getrlimit(Resource::Nofile);
    if inherited.current == inherited.maximum {
        return Ok(None);
    }
    let now = Rlimit {
        current: inherited.maximum,
        maximum: inherited.maximum,
    };
    setrlimit(Resource::Nofile, now)?;
    Ok(Some(Raised { inherited, now }))
}

/// "1024", or "unlimited".
pub fn show(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}
