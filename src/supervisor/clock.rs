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

/// Deadlines nearer than this are also set on a timerfd (see
/// [`sleep_until`]).
const PRECISE_WITHIN: std::time::Duration = std::time::Duration::from_millis(20);

/// Sleeps until `at`, on tokio's clock. tokio's timer ticks by the
/// millisecond and rounds up, and its wait for events again (a 1 ms
/// restart delay took 2 ms): a deadline nearer than [`PRECISE_WITHIN`]
/// is also set on a timerfd (nanoseconds, as systemd's event loop
/// does), and whichever fires first ends the sleep, so a short delay
/// takes what it says. Paused-time tests advance tokio's clock, whose
/// timer then fires first.
pub(crate) async fn sleep_until(at: Instant) {
    let left = at.saturating_duration_since(now());
    if left.is_zero() {
        return;
    }
    let tokio = tokio::time::sleep_until(tokio::time::Instant::from_std(at));
    match (left <= PRECISE_WITHIN)
        .then(|| Precise::after(left))
        .flatten()
    {
        Some(precise) => tokio::select! {
            () = tokio => {}
            () = precise.fired() => {}
        },
        None => tokio.await,
    }
}

/// A one-shot timerfd on the monotonic clock (`Instant`'s).
struct Precise(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>);

impl Precise {
    fn after(left: std::time::Duration) -> Option<Self> {
        use rustix::time::{
            Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
            timerfd_settime,
        };
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .ok()?;
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            // Not zero (that would disarm it): `left` is not.
            it_value: Timespec::try_from(left).ok()?,
        };
        timerfd_settime(&fd, TimerfdTimerFlags::empty(), &spec).ok()?;
        // As cgroup's watch: `new` is deprecated for fds that may close
        // under it; an `OwnedFd` owns its fd until dropped.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd).ok()?;
        Some(Self(fd))
    }

    /// Once it has fired (never, if the reactor fails it).
    async fn fired(&self) {
        loop {
            let Ok(mut ready) = self.0.readable().await else {
                return std::future::pending().await;
            };
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd| Ok(rustix::io::read(fd, &mut expirations)?)) {
                Ok(Ok(_)) => return,
                Ok(Err(_)) => return std::future::pending().await,
                Err(_would_block) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_sleep_never_ends_before_its_deadline_near_or_far() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            // Near ones take the timerfd too, the 30 ms one tokio's
            // timer alone; a deadline passed returns at once.
            for wait in [0, 1, 2, 5, 19, 30] {
                let at = now() + Duration::from_millis(wait);
                sleep_until(at).await;
                assert!(now() >= at, "{wait} ms: woke early");
                assert!(std::time::Instant::now() >= at, "{wait} ms: woke early");
            }
            assert!(Precise::after(Duration::from_millis(1)).is_some(), "timerfd");
        });
    }
}
