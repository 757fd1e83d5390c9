//! systemd service notifications (`Type=notify-reload`): READY, RELOADING
//! with MONOTONIC_USEC, STATUS, WATCHDOG, STOPPING. Without `NOTIFY_SOCKET`
//! every call does nothing. Failures are logged, never fatal.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(target: "mcpd::daemon", "cannot notify the service manager: {e}");
    }
}

/// Start-up is complete: every unit is loaded and its supervisor started.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload begins.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(e) => tracing::warn!(target: "mcpd::daemon", "cannot read the monotonic clock: {e}"),
    }
}

/// The one-line summary shown by `systemctl status`.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// Shutdown begins.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// How often to ping the watchdog: half its timeout, when enabled.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|timeout| timeout / 2)
}
