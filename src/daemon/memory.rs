//! The daemon's heap gives large buffers back to the system when it frees
//! them. A peer can make the daemon hold a message of up to 16 MiB for a
//! moment (a large answer, a list page, a line too long being read); with
//! glibc's defaults the freed memory stays in the heap (its mmap threshold
//! rises to 32 MiB after the first large free), and the daemon kept tens
//! of MiB for good after a hostile peer had gone. Memory freed in many
//! small pieces (a flood of notifications, a large answer parsed) stays
//! in the heap whatever the threshold: [`hand_back`] gives it back once
//! the heap holds [`TRIM_FROM`] free (issue 55, D5: 603 MB resident 40 s
//! after an attack; `malloc_trim(0)` brought it back to 11–16 MB).

use std::time::Duration;

/// Allocations of at least this many bytes get a mapping of their own,
/// unmapped when they are freed (glibc's `M_MMAP_THRESHOLD`, fixed: it no
/// longer rises).
pub const OWN_MAPPING_FROM: usize = 1 << 20;

/// Sets the allocator up so: once, as the daemon starts.
pub fn give_large_buffers_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let threshold = libc::c_int::try_from(OWN_MAPPING_FROM).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt sets one parameter of glibc's allocator; it takes
        // the allocator's own lock and touches no memory of ours.
        #[allow(unsafe_code)]
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) };
        if set != 1 {
            tracing::debug!(target: "mcpd::daemon", "the allocator kept its mmap threshold");
        }
    }
}

/// Free heap past which the daemon gives memory back to the system.
pub const TRIM_FROM: usize = 16 << 20;
/// How often the free heap is looked at (a look costs microseconds).
pub const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Gives the heap's free memory back after a large transient ends: every
/// [`LOOK_EVERY`], on the blocking pool (off the event loop), the free
/// bytes the allocator holds are looked at and, past [`TRIM_FROM`],
/// handed back (`malloc_trim(0)`). Runs until dropped.
pub async fn hand_back() {
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let _ = tokio::task::spawn_blocking(|| {
            let free = free_heap();
            if free > TRIM_FROM {
                trim();
                tracing::debug!(target: "mcpd::daemon", "gave {} MiB of free heap back to the system", free >> 20);
            }
        })
        .await;
    }
}

/// The bytes the allocator holds free (glibc's `mallinfo2`), 0 elsewhere.
fn free_heap() -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 reads the allocator's statistics under its
        // own locks and returns them by value.
        #[allow(unsafe_code)]
        let info = unsafe { libc::mallinfo2() };
        info.fordblks
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        0
    }
}

/// Hands the heap's free memory back to the system.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim releases free pages of glibc's heaps under
        // its own locks; it touches no memory in use.
        #[allow(unsafe_code)]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
