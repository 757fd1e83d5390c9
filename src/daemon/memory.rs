//! The daemon's heap gives large buffers back to the system when it frees
//! them. A peer can make the daemon hold a message of up to 16 MiB for a
//! moment (a large answer, a list page, a line too long being read); with
//! glibc's defaults the freed memory stays in the heap (its mmap threshold
//! rises to 32 MiB after the first large free), and the daemon kept tens
//! of MiB for good after a hostile peer had gone.

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
