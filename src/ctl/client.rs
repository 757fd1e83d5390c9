//! Reaching the daemon for `mcpctl`: [`crate::dbus::Client`] does the
//! connecting; this maps its errors to messages and exit codes
//! (`NoSuchServer` → 4).

use crate::dbus::{ConnectError, Error};
use crate::mux::attach::{AttachError, Refusal};

use super::exit;

/// A failure with its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlError {
    pub message: String,
    pub code: u8,
}

impl CtlError {
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: exit::FAILURE,
        }
    }

    /// Standard output could not be written. When its reader is gone
    /// (`mcpctl … | head`), there is nothing to say: an empty message and
    /// [`exit::BROKEN_PIPE`], as other command line tools end.
    pub fn output(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Self {
                message: String::new(),
                code: exit::BROKEN_PIPE,
            };
        }
        Self::failure(format!("cannot write output: {e}"))
    }
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Maps a D-Bus error to a message and exit code (4 for NoSuchServer).
pub fn dbus_error(e: Error) -> CtlError {
    let code = match e {
        Error::NoSuchServer(_) => exit::NO_SUCH_SERVER,
        _ => exit::FAILURE,
    };
    CtlError {
        message: e.message(),
        code,
    }
}

impl From<Error> for CtlError {
    fn from(e: Error) -> Self {
        dbus_error(e)
    }
}

impl From<ConnectError> for CtlError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Manager(e) => dbus_error(e),
            unreachable @ ConnectError::Unreachable { .. } => {
                Self::failure(unreachable.to_string())
            }
        }
    }
}

impl From<AttachError> for CtlError {
    /// The attach socket's refusal of a server that does not exist is
    /// exit 4, as D-Bus's `NoSuchServer` is; anything else is a failure.
    fn from(e: AttachError) -> Self {
        let code = match e {
            AttachError::Refused {
                code: Refusal::NoSuchServer,
                ..
            } => exit::NO_SUCH_SERVER,
            _ => exit::FAILURE,
        };
        Self {
            message: e.to_string(),
            code,
        }
    }
}
