//! What plugin authors run: `spechost plugin new` makes a project ([`scaffold`]), `spechost
//! plugin check` runs the conformance suite a plugin must pass before anyone loads it
//! ([`check`]), and `spechost plugin bench` replays a recorded trace through it, alone and
//! behind `lookup`, to show in seconds whether it would pay ([`bench`]).
//!
//! `check` and `bench` need no model: they replay a trace (`spechost trace`), by default the
//! one bundled with this build ([`trace`]).

pub mod bench;
pub mod check;
pub mod scaffold;
pub mod trace;
