//! The ledger of a handed-over session (`mux::attach`): which of the
//! host's requests the daemon has read and not yet answered, kept where
//! the bridge can read it after the daemon is gone.
//!
//! When `mcpctl bridge` hands the host's stdin and stdout to the daemon it
//! sees none of the session's messages. If the daemon stops, it answers
//! the requests in flight itself; if it is killed, only the bridge is left
//! to answer them, and only the ledger can tell it which. The daemon makes
//! one per session: a memfd of [`SLOTS`] slots of [`SLOT`] bytes, mapped
//! shared and sealed against shrinking (a bridge cannot truncate it under
//! the daemon's writes), sent with the attach reply. Recording a request
//! and clearing it are stores into the mapping, no system call; the daemon
//! never reads what is there (it keeps its own index), so what a bridge
//! writes into it affects nobody but that bridge's host.
//!
//! A slot is a length byte (0: free) and the id's JSON text (at most
//! [`SLOT`] − 1 bytes; a longer id, or one beyond [`SLOTS`] in flight, is
//! not recorded, and its request would wait on the host's own timeout as
//! before). The text is stored before its length, so a daemon killed
//! between the two leaves a free slot, never half an id.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use foldhash::HashMap;

/// Requests recorded at once, per session.
pub const SLOTS: usize = 1024;

/// Bytes per slot: the length, then the id's JSON text.
pub const SLOT: usize = 64;

/// The ledger's size.
pub const SIZE: usize = SLOTS * SLOT;

/// The daemon's side: the mapping and where each recorded id is.
#[derive(Debug)]
pub struct Ledger {
    map: NonNull<AtomicU8>,
    /// Slot by id text, and how many of the host's requests in flight
    /// have that id (a host that reuses one gets a refusal for the second,
    /// which must not clear the first).
    used: HashMap<Key, (u16, u32)>,
    free: Vec<u16>,
}

/// An id's text kept inline (it fits a slot, or is not recorded): no
/// allocation per request recorded.
#[derive(Debug, Clone, Copy)]
struct Key {
    len: u8,
    text: [u8; SLOT - 1],
}

impl Key {
    /// `id`'s key; `None` if it does not fit a slot (or is empty).
    fn of(id: &str) -> Option<Self> {
        if id.is_empty() || id.len() >= SLOT {
            return None;
        }
        let mut text = [0u8; SLOT - 1];
        text[..id.len()].copy_from_slice(id.as_bytes());
        Some(Self {
            len: id.len() as u8,
            text,
        })
    }

    fn bytes(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

// The mapping is owned by the ledger alone (in this process), and every
// access to it is atomic.
#[allow(unsafe_code)]
unsafe impl Send for Ledger {}

impl Ledger {
    /// A new ledger and the descriptor to send the bridge.
    pub fn create() -> io::Result<(Self, OwnedFd)> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            "mcpd-ledger",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, SIZE as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        // SAFETY: a fresh shared mapping of a memfd of SIZE bytes that
        // cannot shrink (sealed above), so every page stays backed; it is
        // unmapped only in Drop.
        #[allow(unsafe_code)]
        let map = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                SIZE,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let map = NonNull::new(map.cast::<AtomicU8>()).ok_or_else(|| io::Error::other("mmap"))?;
        let ledger = Self {
            map,
            used: HashMap::default(),
            free: (0..SLOTS as u16).rev().collect(),
        };
        Ok((ledger, fd))
    }

    fn bytes(&self) -> &[AtomicU8] {
        // SAFETY: SIZE bytes mapped for the ledger's life (see `create`);
        // AtomicU8 has the layout of u8, and the memory is only ever
        // accessed atomically here (another process may write it).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr(), SIZE)
        }
    }

    /// Records request `id` (its JSON text) as read and unanswered.
    pub fn record(&mut self, id: &str) {
        let Some(key) = Key::of(id) else {
            return;
        };
        if let Some((_, count)) = self.used.get_mut(&key) {
            *count += 1;
            return;
        }
        let Some(slot) = self.free.pop() else {
            return;
        };
        let at = usize::from(slot) * SLOT;
        let bytes = &self.bytes()[at..at + SLOT];
        for (cell, byte) in bytes[1..].iter().zip(id.bytes()) {
            cell.store(byte, Ordering::Relaxed);
        }
        bytes[0].store(id.len() as u8, Ordering::Release);
        self.used.insert(key, (slot, 1));
    }

    /// A request `id` was answered (or will never be).
    pub fn clear(&mut self, id: &str) {
        let Some(key) = Key::of(id) else {
            return;
        };
        let Some((slot, count)) = self.used.get_mut(&key) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            let slot = *slot;
            self.used.remove(&key);
            self.bytes()[usize::from(slot) * SLOT].store(0, Ordering::Release);
            self.free.push(slot);
        }
    }

    /// Requests recorded now.
    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, unmapped once.
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.map.as_ptr().cast(), SIZE);
        }
    }
}

/// The bridge's side: the ids (JSON text) a ledger holds now, in slot
/// order. Meant for when the daemon is gone; what is not a well-formed
/// slot is skipped.
pub fn read(fd: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let mut buf = vec![0u8; SIZE];
    let mut filled = 0;
    while filled < SIZE {
        match rustix::io::pread(fd.as_fd(), &mut buf[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf[..filled]
        .chunks_exact(SLOT)
        .filter_map(|slot| {
            let len = usize::from(slot[0]);
            (len > 0 && len < SLOT)
                .then(|| std::str::from_utf8(&slot[1..=len]).ok())
                .flatten()
                .map(str::to_owned)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bridge_reads_what_the_daemon_recorded_and_not_what_it_cleared() {
        let (mut ledger, fd) = Ledger::create().expect("ledger");
        assert!(read(fd.as_fd()).expect("read").is_empty());
        ledger.record("1");
        ledger.record("\"req-a\"");
        ledger.record("1");
        ledger.record("3");
        assert_eq!(ledger.len(), 3, "an id takes one slot");
        // Id 1 twice (a host reusing it): the answer to one (the refusal
        // of the second) leaves the other recorded.
        ledger.clear("1");
        assert_eq!(read(fd.as_fd()).expect("read"), ["1", "\"req-a\"", "3"]);
        ledger.clear("1");
        ledger.clear("99");
        assert_eq!(read(fd.as_fd()).expect("read"), ["\"req-a\"", "3"]);
        // A freed slot is used again.
        ledger.record("4");
        let mut ids = read(fd.as_fd()).expect("read");
        ids.sort();
        assert_eq!(ids, ["\"req-a\"", "3", "4"]);
        // What the daemon writes stays readable after its mapping is gone
        // (the daemon died): the bridge's descriptor keeps the memory.
        drop(ledger);
        assert_eq!(read(fd.as_fd()).expect("read").len(), 3);
    }

    #[test]
    fn too_long_ids_and_a_full_ledger_are_not_recorded_and_the_bridge_cannot_shrink_it() {
        let (mut ledger, fd) = Ledger::create().expect("ledger");
        ledger.record(&format!("\"{}\"", "x".repeat(SLOT)));
        ledger.record("");
        assert!(ledger.is_empty());
        // The longest that fits, and ids one the start of the other.
        let longest = format!("\"{}\"", "y".repeat(SLOT - 3));
        for id in [longest.as_str(), "1", "12", "\"1\""] {
            ledger.record(id);
        }
        ledger.clear("12");
        let mut ids = read(fd.as_fd()).expect("read");
        ids.sort();
        assert_eq!(ids, ["\"1\"", longest.as_str(), "1"]);
        for id in [longest.as_str(), "1", "\"1\""] {
            ledger.clear(id);
        }
        assert!(ledger.is_empty());
        for n in 0..SLOTS + 10 {
            ledger.record(&n.to_string());
        }
        assert_eq!(ledger.len(), SLOTS);
        assert_eq!(read(fd.as_fd()).expect("read").len(), SLOTS);
        // The descriptor a bridge gets cannot take the daemon's memory away.
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
        assert!(rustix::fs::ftruncate(&fd, 2 * SIZE as u64).is_err());
        ledger.clear("5");
        ledger.record("new");
        assert!(read(fd.as_fd()).expect("read").contains(&"new".to_owned()));
    }
}
