//! Cross-request state: one blob per plugin that the host keeps and writes to disk.
//!
//! A drafter's instance-level state (a cache shared by all requests, kept in a `thread_local!`
//! of the plugin) dies with the host process, and with the instance when it traps. To keep it,
//! serialize it in [`Drafter::checkpoint`](crate::Drafter::checkpoint) and hand the bytes to
//! [`save`]; read them back with [`load`] when the instance first needs them (in the first
//! [`Drafter::new`](crate::Drafter::new), for example).
//!
//! The host holds the blob, loads it at start from its state directory (or from a file warmed
//! offline), gives it to every instance of the plugin that asks, and writes the last saved one
//! atomically at its checkpoints. The blob's format is the plugin's own: give it a magic number,
//! a version and a checksum, and treat a blob you cannot read as absent (the file may come from
//! an older plugin, or be damaged).
//!
//! Built natively, for tests, the blob lives in a per-thread slot instead of the host:
//! [`save`] then [`load`] round-trips within one test, [`crate::testing::clear_state`] empties
//! it and [`crate::testing::set_state_limit`] makes [`save`] refuse large blobs as a host would.
//!
//! ```
//! use std::cell::RefCell;
//!
//! use spechost_sdk::state;
//!
//! thread_local! {
//!     /// How many requests this plugin has served, across restarts of the host.
//!     static SERVED: RefCell<Option<u64>> = const { RefCell::new(None) };
//! }
//!
//! /// Counts one request, reading the count the host kept the first time.
//! fn count_request() -> u64 {
//!     SERVED.with_borrow_mut(|served| {
//!         let count = served.get_or_insert_with(|| {
//!             state::load()
//!                 .and_then(|blob| <[u8; 8]>::try_from(blob.as_slice()).ok())
//!                 .map_or(0, u64::from_le_bytes)
//!         });
//!         *count += 1;
//!         *count
//!     })
//! }
//!
//! /// Called from `Drafter::checkpoint`.
//! fn checkpoint() {
//!     if let Some(count) = SERVED.with_borrow(|served| *served) {
//!         if let Err(error) = state::save(&count.to_le_bytes()) {
//!             spechost_sdk::log(spechost_sdk::Level::Warn, &format!("state not saved: {error}"));
//!         }
//!     }
//! }
//!
//! assert_eq!(count_request(), 1);
//! assert_eq!(count_request(), 2);
//! checkpoint();
//! SERVED.with_borrow_mut(|served| *served = None); // as if the host had restarted
//! assert_eq!(count_request(), 3);
//! ```

/// The blob the host holds for this plugin: the last one saved in this process, else the one it
/// loaded at start; `None` when there is neither.
///
/// Natively: the last blob [`save`]d on this thread since the last
/// [`crate::testing::clear_state`].
pub fn load() -> Option<Vec<u8>> {
    backend::load()
}

/// Replaces the blob the host holds for this plugin; the host writes it to disk at its next
/// checkpoint.
///
/// Fails, with the host's reason, when the host refuses the blob (it is larger than the host's
/// limit on state blobs); the blob held before stays. Saving is cheap for the plugin but copies
/// the whole blob, so call it from [`Drafter::checkpoint`](crate::Drafter::checkpoint), not per
/// round.
pub fn save(blob: &[u8]) -> Result<(), String> {
    backend::save(blob)
}

#[cfg(target_arch = "wasm32")]
use crate::bindings::drafter::state as backend;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use self::native as backend;

/// The per-thread slot that stands in for the host natively.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod native {
    use std::cell::RefCell;

    /// The slot of one thread: the blob and the limit [`save`] enforces.
    #[derive(Default)]
    struct Slot {
        blob: Option<Vec<u8>>,
        max_bytes: Option<usize>,
    }

    thread_local! {
        static SLOT: RefCell<Slot> = RefCell::default();
    }

    pub(crate) fn load() -> Option<Vec<u8>> {
        SLOT.with_borrow(|slot| slot.blob.clone())
    }

    pub(crate) fn save(blob: &[u8]) -> Result<(), String> {
        SLOT.with_borrow_mut(|slot| {
            if let Some(max_bytes) = slot.max_bytes
                && blob.len() > max_bytes
            {
                return Err(format!(
                    "state blob of {} bytes is larger than the limit of {max_bytes} bytes; \
                     save a smaller summary of the state",
                    blob.len()
                ));
            }
            slot.blob = Some(blob.to_vec());
            Ok(())
        })
    }

    pub(crate) fn clear() {
        SLOT.with_borrow_mut(|slot| slot.blob = None);
    }

    pub(crate) fn set_limit(max_bytes: Option<usize>) {
        SLOT.with_borrow_mut(|slot| slot.max_bytes = max_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{clear_state, set_state_limit};

    #[test]
    fn load_is_none_until_something_is_saved() {
        assert_eq!(load(), None);
        assert_eq!(save(b"abc"), Ok(()));
        assert_eq!(load().as_deref(), Some(&b"abc"[..]));
    }

    #[test]
    fn save_replaces_the_blob_and_clear_empties_it() {
        save(b"first").expect("no limit set");
        save(b"second").expect("no limit set");
        assert_eq!(load().as_deref(), Some(&b"second"[..]));
        clear_state();
        assert_eq!(load(), None);
    }

    #[test]
    fn limit_refuses_larger_blobs_and_keeps_the_old_one() {
        save(b"kept").expect("no limit set");
        set_state_limit(Some(4));
        let error = save(b"too long").unwrap_err();
        assert!(
            error.contains("8 bytes") && error.contains("limit of 4 bytes"),
            "{error}"
        );
        assert_eq!(load().as_deref(), Some(&b"kept"[..]));
        assert_eq!(save(b"four"), Ok(()), "a blob at the limit is accepted");
        set_state_limit(None);
        assert_eq!(save(b"long again"), Ok(()));
    }

    #[test]
    fn each_thread_has_its_own_slot() {
        save(b"main").expect("no limit set");
        let other = std::thread::spawn(load).join().expect("thread ran");
        assert_eq!(other, None);
    }
}
