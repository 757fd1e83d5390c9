//! The supervisor's clock: tokio's (so paused-time tests apply), and the
//! mapping of its instants to wall-clock time for the read model.

use std::time::{Instant, SystemTime};

/// The current instant, on tokio's clock (so paused-time tests apply).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Maps machine instants to wall-clock time from one fixed reference, so
/// the same instant always maps to the same time (and an unchanged read
/// model compares equal).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    instant: Instant,
    wall: SystemTime,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            instant: now(),
            wall: SystemTime::now(),
        }
    }

    pub(crate) fn wall(&self, at: Instant) -> SystemTime {
        if at >= self.instant {
            self.wall + (at - self.instant)
        } else {
            self.wall - (self.instant - at)
        }
    }
}
