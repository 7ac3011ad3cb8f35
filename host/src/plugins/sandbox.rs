//! The sandbox around each plugin instance: limits, deadlines, and what a `Store` holds.
//!
//! - Memory, table and instance counts are capped per `Store` by a [`wasmtime::ResourceLimiter`]
//!   that also remembers a refused memory growth, so the fault that follows can say "exceeded
//!   its memory limit" instead of "unreachable".
//! - Time is capped per guest call with epochs: one [`EpochTicker`] thread per engine bumps the
//!   epoch every [`EPOCH_TICK`], and each call gets a deadline of [`deadline_ticks`] epochs.
//!   When it passes, [`CallClock`] decides: time the host spent inside the call on the guest's
//!   behalf (running the draft model, reading state) is credited back, so only the plugin's own
//!   time counts; the call traps once that reaches the deadline. The deadline counts CPU time,
//!   so a loaded machine does not time out a plugin for waiting for a CPU; wall-clock time is
//!   bounded too, at [`WALL_TIME_IN_DEADLINES`] deadlines.
//! - WASI is linked but empty: no files, no environment, no arguments, no network. stdout is
//!   discarded; stderr goes to a bounded in-memory buffer so a guest's panic message can be put
//!   in the fault it causes.
//! - Timers fire at once ([`link_instant_timers`]). Epochs interrupt only guest code, not a host
//!   call the guest is blocked in; with WASI's timers a plugin could `sleep` through its
//!   deadline. Without them a sleeping plugin just spins, and the deadline stops it.
//!
//! Not here: what happens after a fault (restart, quarantine: `supervised.rs`).

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::{
    Engine, ResourceLimiter, Store, StoreContextMut, StoreLimits, StoreLimitsBuilder, Trap,
    UpdateDeadline,
};
use wasmtime_wasi::clocks::WasiClocksView;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bridge::DraftBridge;
use super::error::LoadError;
use super::log::LogGate;
use super::state::StateSlot;
use super::tree::TreeRound;
use crate::cascade::DraftModelFactory;
use crate::placement::thread_cpu_time;

/// Default cap on each linear memory of a plugin instance.
pub const DEFAULT_MEMORY_LIMIT: usize = 256 << 20;
/// Default CPU time a plugin may spend in one call before it is interrupted.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_millis(50);
/// Default CPU time a plugin's instance may take to start (its data copied in, its start-up code
/// run): about 0.1 ms for a Rust plugin and 1 ms for a Python one on a 2-vCPU Xeon. Starting is
/// paid at load and after each trap, not per call, so its bound is looser than a call's while
/// still stopping a start-up that never ends.
pub const DEFAULT_START_DEADLINE: Duration = Duration::from_millis(500);
/// Default number of faults after which a plugin is quarantined for the rest of the run.
pub const DEFAULT_MAX_FAULTS: u32 = 3;
/// Default cap on the elements of each table (function pointers) of a plugin instance.
pub const DEFAULT_TABLE_ELEMENTS: usize = 100_000;
/// Default cap on core instances in a plugin's store (a Rust component uses a handful).
pub const DEFAULT_MAX_INSTANCES: usize = 32;
/// Default cap on linear memories in a plugin's store; the memory limit applies to each.
pub const DEFAULT_MAX_MEMORIES: usize = 4;
/// Default cap on tables in a plugin's store.
pub const DEFAULT_MAX_TABLES: usize = 32;
/// Default cap on host-side WASI resources (streams, pollables) a plugin may hold open.
pub const DEFAULT_MAX_HOST_RESOURCES: usize = 1024;

/// Wall-clock time one guest call may take, in deadlines (which count its CPU time): room for a
/// loaded machine, and a bound should a guest ever wait without using CPU.
pub const WALL_TIME_IN_DEADLINES: u32 = 10;
/// Host time one guest call may always have credited back, in call deadlines. Draft-model and
/// state calls are the plugin's choice: without a cap, a plugin calling them in a loop would
/// spend almost no time of its own and never reach its deadline.
pub const MAX_HOST_TIME_IN_DEADLINES: u32 = 20;
/// Beyond [`MAX_HOST_TIME_IN_DEADLINES`], host time one guest call may have credited back, in
/// multiples of its longest single host call. One call can be long for good reason (feeding a
/// long prompt to the draft model takes seconds on a large model); what the cap stops is a
/// plugin repeating host calls without end.
pub const MAX_HOST_TIME_IN_LONGEST_CALLS: u32 = 4;

/// How often the ticker thread advances the engine's epoch. Deadlines are enforced to within
/// one tick; a few milliseconds costs nothing measurable and keeps 50 ms deadlines tight.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Bytes of a plugin's stderr kept per instance, for panic messages. Once full, further writes
/// fail in the guest (a Rust `eprintln!` would then panic); plugins should log through
/// `spechost:drafter/host.log` instead.
const STDERR_CAPTURE_BYTES: usize = 64 << 10;

/// The limits a plugin instance runs under. Start from [`SandboxLimits::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Cap on each linear memory, in bytes.
    pub memory_limit: usize,
    /// Cap on the elements of each table.
    pub table_elements: usize,
    /// Cap on core instances in the store.
    pub max_instances: usize,
    /// Cap on linear memories in the store.
    pub max_memories: usize,
    /// Cap on tables in the store.
    pub max_tables: usize,
    /// Cap on host-side WASI resources the plugin may hold.
    pub max_host_resources: usize,
    /// CPU time allowed for one guest call (`open`, `feed`, `propose`, `feedback`, drop);
    /// wall-clock time is bounded at [`WALL_TIME_IN_DEADLINES`] times it.
    pub call_deadline: Duration,
    /// CPU time allowed for an instance to start (at load, and again after each trap).
    pub start_deadline: Duration,
    /// Faults (traps, time-outs, invalid proposals, rejected configs) before quarantine; 0 acts
    /// as 1.
    pub max_faults: u32,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_limit: DEFAULT_MEMORY_LIMIT,
            table_elements: DEFAULT_TABLE_ELEMENTS,
            max_instances: DEFAULT_MAX_INSTANCES,
            max_memories: DEFAULT_MAX_MEMORIES,
            max_tables: DEFAULT_MAX_TABLES,
            max_host_resources: DEFAULT_MAX_HOST_RESOURCES,
            call_deadline: DEFAULT_CALL_DEADLINE,
            start_deadline: DEFAULT_START_DEADLINE,
            max_faults: DEFAULT_MAX_FAULTS,
        }
    }
}

/// Epochs a call may run for, so that it is interrupted no earlier than `deadline`.
///
/// An epoch deadline of `n` traps once the epoch has advanced `n` times. The first tick after
/// the call starts can come at any moment (the ticker does not know about calls), so `n` ticks
/// last between `(n - 1)` and `n` tick periods; one extra tick makes the guaranteed time at least
/// `deadline` and the worst case `deadline + tick`.
pub(super) fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    let tick_nanos = tick.as_nanos().max(1);
    let whole_ticks = deadline.as_nanos().div_ceil(tick_nanos);
    u64::try_from(whole_ticks)
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// The thread that advances an engine's epoch every [`EPOCH_TICK`].
///
/// Shared through an `Arc` by the host and by everything loaded from it, because a plugin
/// without a ticker would have no deadline: the thread stops when the host and every plugin
/// and source made from it have been dropped.
pub(super) struct EpochTicker {
    /// Dropping the sender wakes the thread and tells it to stop.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts the ticker thread for `engine`.
    pub(super) fn start(engine: &Engine) -> Result<Arc<Self>, LoadError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let engine = engine.weak();
        let thread = thread::Builder::new()
            .name("spechost-epoch".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(EPOCH_TICK) {
                    match engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|source| LoadError::Ticker { source })?;
        Ok(Arc::new(Self {
            stop: Some(stop),
            thread: Some(thread),
        }))
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread only sleeps and increments a counter; it cannot panic.
            let _ = thread.join();
        }
    }
}

/// Store limits that remember a refused memory growth and the largest memory allowed.
pub(super) struct Limiter {
    limits: StoreLimits,
    /// Bytes a memory growth asked for when it was refused, since the last [`Self::take_refusal`].
    refused_memory: Option<usize>,
    /// The largest size any linear memory of the store has been allowed to grow to.
    peak_memory: usize,
}

impl Limiter {
    fn new(limits: &SandboxLimits) -> Self {
        Self {
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_limit)
                .table_elements(limits.table_elements)
                .instances(limits.max_instances)
                .memories(limits.max_memories)
                .tables(limits.max_tables)
                .build(),
            refused_memory: None,
            peak_memory: 0,
        }
    }

    /// The size a refused memory growth asked for, if one happened since the last call.
    pub(super) fn take_refusal(&mut self) -> Option<usize> {
        self.refused_memory.take()
    }

    /// The largest size, in bytes, any linear memory of the store has had.
    pub(super) fn peak_memory(&self) -> usize {
        self.peak_memory
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        if allowed {
            self.peak_memory = self.peak_memory.max(desired);
        } else {
            self.refused_memory = Some(desired);
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// Time on the two clocks a guest call is judged by: the wall clock, and the CPU time of the
/// calling thread (the guest runs on it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Spent {
    /// Wall-clock time.
    pub(super) wall: Duration,
    /// CPU time of the calling thread.
    pub(super) cpu: Duration,
}

/// A moment on both clocks of [`Spent`]; time host work done for a guest with it and
/// [`CallClock::credit`] what it took.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moment {
    wall: Instant,
    cpu: Duration,
}

impl Moment {
    /// Now, on the calling thread.
    pub(super) fn now() -> Self {
        Self {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
        }
    }

    /// Time since this moment, on the calling thread.
    pub(super) fn elapsed(&self) -> Spent {
        Spent {
            wall: self.wall.elapsed(),
            cpu: thread_cpu_time().saturating_sub(self.cpu),
        }
    }
}

/// The current guest call's time, less the time the host spent in it on the guest's behalf,
/// and the deadline that call runs under.
///
/// The deadline counts the guest's **CPU time**: on a loaded machine a call waits for a CPU
/// without using any, and a plugin that did little work must not time out for it. A guest has
/// no way to wait without using CPU (timers fire at once, there is no I/O to block on), but the
/// call is still bounded in wall-clock time, at [`WALL_TIME_IN_DEADLINES`] deadlines.
#[derive(Debug)]
pub(super) struct CallClock {
    started: Moment,
    host_time: Spent,
    /// The longest single host call credited in the current guest call, in wall-clock time.
    longest_host_call: Duration,
    /// The current call's deadline for its own time.
    pub(super) deadline: Duration,
}

impl CallClock {
    fn new(deadline: Duration) -> Self {
        Self {
            started: Moment::now(),
            host_time: Spent::default(),
            longest_host_call: Duration::ZERO,
            deadline,
        }
    }

    /// Starts timing a new guest call with `deadline`.
    fn restart(&mut self, deadline: Duration) {
        *self = Self::new(deadline);
    }

    /// Credits `spent` (host work done for the guest) back to the current call.
    pub(super) fn credit(&mut self, spent: Spent) {
        self.host_time.wall += spent.wall;
        self.host_time.cpu += spent.cpu;
        self.longest_host_call = self.longest_host_call.max(spent.wall);
    }

    /// Time the guest's own code has had in the current call, on both clocks.
    fn guest_time(&self) -> Spent {
        let elapsed = self.started.elapsed();
        Spent {
            wall: elapsed.wall.saturating_sub(self.host_time.wall),
            cpu: elapsed.cpu.saturating_sub(self.host_time.cpu),
        }
    }

    /// The current call's bound on wall-clock time: [`WALL_TIME_IN_DEADLINES`] deadlines.
    fn wall_limit(&self) -> Duration {
        self.deadline.saturating_mul(WALL_TIME_IN_DEADLINES)
    }

    /// How much longer the guest may run, in wall-clock time at the most (its CPU time cannot
    /// grow faster than that), or `None` once its time is up: CPU time at the deadline, wall
    /// time at [`WALL_TIME_IN_DEADLINES`] deadlines, or host time past its cap.
    fn time_left(&self) -> Option<Duration> {
        let guest = self.guest_time();
        let wall_limit = self.wall_limit();
        if guest.cpu >= self.deadline || guest.wall >= wall_limit || self.host_time_exceeded() {
            return None;
        }
        Some((self.deadline - guest.cpu).min(wall_limit - guest.wall))
    }

    /// What ran out, in words, when the current call's time ran out on something other than
    /// the guest's own CPU time: the host time credited to it ("kept the host busy ...") or its
    /// wall-clock bound ("took over ..."); `None` otherwise. `method` names the call.
    pub(super) fn overrun(&self, method: &str) -> Option<String> {
        if self.host_time_exceeded() {
            return Some(format!(
                "kept the host busy on its behalf (draft model, state) for over {} in {method}",
                format_duration(self.host_time_cap())
            ));
        }
        let guest = self.guest_time();
        let wall_limit = self.wall_limit();
        (guest.wall >= wall_limit && guest.cpu < self.deadline).then(|| {
            format!(
                "took over {} of wall-clock time in {method} having used {} of its {} of CPU time: the machine is too busy to run it",
                format_duration(wall_limit),
                format_duration(guest.cpu),
                format_duration(self.deadline)
            )
        })
    }

    /// Whether the host time credited to the current call passed its cap.
    pub(super) fn host_time_exceeded(&self) -> bool {
        self.host_time.wall > self.host_time_cap()
    }

    /// The most host time the current call may have credited back: the larger of
    /// [`MAX_HOST_TIME_IN_DEADLINES`] deadlines and [`MAX_HOST_TIME_IN_LONGEST_CALLS`] times its
    /// longest host call so far.
    pub(super) fn host_time_cap(&self) -> Duration {
        self.deadline
            .saturating_mul(MAX_HOST_TIME_IN_DEADLINES)
            .max(
                self.longest_host_call
                    .saturating_mul(MAX_HOST_TIME_IN_LONGEST_CALLS),
            )
    }
}

/// What the host offers a plugin instance beyond WASI and logging.
#[derive(Clone, Default)]
pub struct Services {
    /// The plugin's cross-request state (WIT `state`).
    pub(super) state: Option<StateSlot>,
    /// The draft model (WIT `draft-model`), when the process has one.
    pub(super) draft_model: Option<Arc<dyn DraftModelFactory>>,
}

/// Everything a plugin's `Store` holds.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) name: Arc<str>,
    pub(super) limiter: Limiter,
    pub(super) log: LogGate,
    pub(super) clock: CallClock,
    pub(super) state: StateSlot,
    pub(super) draft: DraftBridge,
    /// The `tree` import's answers and the shape a drafter declared this round.
    pub(super) tree: TreeRound,
    stderr: MemoryOutputPipe,
}

impl HostState {
    /// State for a fresh instance of plugin `name` under `limits`: an empty WASI context whose
    /// stderr is captured, and the host `services` it may use (a plugin without a state slot
    /// gets one that lives only as long as this instance).
    pub(super) fn new(name: Arc<str>, limits: &SandboxLimits, services: Services) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE_BYTES);
        let wasi = WasiCtxBuilder::new()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.max_host_resources);
        Self {
            wasi,
            table,
            limiter: Limiter::new(limits),
            log: LogGate::new(Arc::clone(&name)),
            clock: CallClock::new(limits.call_deadline),
            state: services
                .state
                .unwrap_or_else(|| StateSlot::open(&name, None, 0)),
            draft: DraftBridge::new(services.draft_model),
            tree: TreeRound::default(),
            name,
            stderr,
        }
    }

    /// The last panic message the guest wrote to stderr, cleaned up for a warning.
    pub(super) fn last_panic(&self) -> Option<String> {
        last_panic_message(&String::from_utf8_lossy(&self.stderr.contents()))
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Makes `store` enforce the deadline of each guest call armed with [`arm_call`]: when the
/// epoch deadline passes, the call traps with [`Trap::Interrupt`] if [`CallClock`] says its
/// time is up, and otherwise gets the epochs it has left.
pub(super) fn enforce_deadline(store: &mut Store<HostState>) {
    store.epoch_deadline_callback(|store| match store.data().clock.time_left() {
        Some(left) => Ok(UpdateDeadline::Continue(deadline_ticks(left, EPOCH_TICK))),
        None => Err(Trap::Interrupt.into()),
    });
}

/// Arms `deadline` for one guest call and forgets memory refusals from earlier calls.
pub(super) fn arm_call(store: &mut Store<HostState>, deadline: Duration) {
    store.set_epoch_deadline(deadline_ticks(deadline, EPOCH_TICK));
    let state = store.data_mut();
    state.clock.restart(deadline);
    state.limiter.take_refusal();
}

/// The WASI monotonic clock interface, as the pinned wasmtime-wasi links it.
const WASI_MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces WASI's timers (`subscribe-duration`, `subscribe-instant`) with ones that are ready
/// at once, so no guest call can block in the host past its deadline. Call it after
/// `wasmtime_wasi::p2::add_to_linker_sync`.
///
/// `Err` if the linker does not already define the timers under [`WASI_MONOTONIC_CLOCK`]
/// (wasmtime-wasi was upgraded to another WASI version: update the constant).
pub(super) fn link_instant_timers(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    // With shadowing off, defining a name that WASI already defined fails: that is the check.
    linker.allow_shadowing(false);
    if linker
        .instance(WASI_MONOTONIC_CLOCK)?
        .func_wrap("subscribe-duration", ready_timer)
        .is_ok()
    {
        wasmtime::bail!(
            "{WASI_MONOTONIC_CLOCK} is not linked by wasmtime-wasi; update WASI_MONOTONIC_CLOCK in plugins/sandbox.rs to its WASI version"
        );
    }
    linker.allow_shadowing(true);
    let mut clock = linker.instance(WASI_MONOTONIC_CLOCK)?;
    clock.func_wrap("subscribe-duration", ready_timer)?;
    clock.func_wrap("subscribe-instant", ready_timer)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A timer that is already due, whatever duration or instant the guest asked for.
fn ready_timer(
    mut store: StoreContextMut<'_, HostState>,
    _when: (u64,),
) -> wasmtime::Result<(Resource<DynPollable>,)> {
    let mut clocks = store.data_mut().clocks();
    let timer = monotonic_clock::Host::subscribe_duration(&mut clocks, 0)?;
    Ok((timer,))
}

/// Longest panic message put into a fault, in characters.
const MAX_PANIC_MESSAGE_CHARS: usize = 300;

/// The last Rust panic report in `stderr`, on one line: `panicked at src/lib.rs:3:5: boom`.
fn last_panic_message(stderr: &str) -> Option<String> {
    let start = stderr.rfind("panicked at ")?;
    let report = stderr[start..]
        .lines()
        .filter(|line| !line.starts_with("note: "))
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Some(sanitize(&report, MAX_PANIC_MESSAGE_CHARS))
}

/// `text` without control characters (a guest must not drive the operator's terminal), cut to
/// `max_chars` with an ellipsis.
pub(super) fn sanitize(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars));
    for (index, c) in text.chars().enumerate() {
        if index == max_chars {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `256 MiB`, `64 KiB` or `1000 bytes`: a memory size for messages.
pub(super) fn format_bytes(bytes: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// `50 ms`, `1.5 s` or `250 µs`: a deadline for messages.
pub(super) fn format_duration(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        format!("{} s", duration.as_secs_f64())
    } else if duration >= Duration::from_millis(1) && duration.subsec_micros().is_multiple_of(1000)
    {
        format!("{} ms", duration.as_millis())
    } else {
        format!("{} µs", duration.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_long_host_call_is_allowed_but_repeated_host_work_is_capped() {
        let deadline = Duration::from_millis(50);
        let mut clock = CallClock::new(deadline);
        clock.credit(host_call(Duration::from_millis(900)));
        assert!(!clock.host_time_exceeded(), "within 20 deadlines");
        // Feeding a long prompt: one call far longer than 20 deadlines.
        clock.credit(host_call(Duration::from_secs(3)));
        assert!(!clock.host_time_exceeded(), "one long call is allowed");
        assert_eq!(clock.host_time_cap(), Duration::from_secs(12));
        for _ in 0..2 {
            clock.credit(host_call(Duration::from_secs(3)));
        }
        assert!(!clock.host_time_exceeded(), "9.9 s of 12 s");
        clock.credit(host_call(Duration::from_secs(3)));
        assert!(
            clock.host_time_exceeded(),
            "12.9 s: past four longest calls"
        );
        clock.restart(deadline);
        assert!(!clock.host_time_exceeded(), "each guest call starts afresh");
        assert_eq!(clock.host_time_cap(), Duration::from_secs(1));
    }

    /// A host call that took `wall`, with the guest's thread waiting (no CPU time).
    fn host_call(wall: Duration) -> Spent {
        Spent {
            wall,
            cpu: Duration::ZERO,
        }
    }

    #[test]
    fn the_deadline_counts_cpu_time_and_bounds_wall_time() {
        let deadline = Duration::from_millis(20);
        let clock = CallClock::new(deadline);
        // Waiting for a CPU (here: sleeping) uses none, so the call keeps its time.
        thread::sleep(deadline * 2);
        let left = clock
            .time_left()
            .expect("two deadlines of waiting used no CPU time");
        assert!(left <= deadline, "{left:?} left of {deadline:?}");
        // Spinning uses CPU time, and the call's time runs out.
        let spinning = Instant::now();
        while clock.time_left().is_some() {
            assert!(
                spinning.elapsed() < Duration::from_secs(30),
                "never ran out"
            );
        }
        assert!(clock.guest_time().cpu >= deadline);
        // Waiting without end is bounded in wall-clock time.
        let short = Duration::from_millis(2);
        let waiting = CallClock::new(short);
        thread::sleep(short * (WALL_TIME_IN_DEADLINES + 5));
        assert_eq!(waiting.time_left(), None, "wall time is bounded");
        let overrun = waiting
            .overrun("propose")
            .expect("the wall-clock bound is named");
        assert!(
            overrun.starts_with("took over 20 ms of wall-clock time in propose"),
            "{overrun}"
        );
        assert_eq!(
            clock.overrun("propose"),
            None,
            "CPU time ran out, not the wall clock"
        );
    }

    #[test]
    fn deadline_is_never_shorter_than_asked() {
        let tick = Duration::from_millis(5);
        for (deadline_ms, expected) in [(50, 11), (51, 12), (1, 2), (0, 1), (5, 2)] {
            let ticks = deadline_ticks(Duration::from_millis(deadline_ms), tick);
            assert_eq!(
                ticks, expected,
                "deadline {deadline_ms} ms gave {ticks} ticks"
            );
            assert!(
                Duration::from_millis(5 * (ticks - 1)) >= Duration::from_millis(deadline_ms),
                "{ticks} ticks may end before {deadline_ms} ms"
            );
        }
    }

    #[test]
    fn huge_deadline_saturates_instead_of_overflowing() {
        let ticks = deadline_ticks(Duration::MAX, Duration::from_nanos(1));
        assert_eq!(ticks, u64::MAX, "ticks: {ticks}");
    }

    #[test]
    fn panic_message_is_the_last_report_on_one_line() {
        let stderr = "thread '<unnamed>' panicked at src/a.rs:1:1:\nfirst\n\
                      thread '<unnamed>' panicked at src/lib.rs:12:9:\nboom on call 3\n\
                      note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            last_panic_message(stderr).as_deref(),
            Some("panicked at src/lib.rs:12:9: boom on call 3")
        );
        assert_eq!(last_panic_message("no panic here"), None);
    }

    #[test]
    fn sanitize_escapes_control_characters_and_truncates() {
        assert_eq!(sanitize("a\x1b[31mb", 100), "a\\u{1b}[31mb");
        assert_eq!(sanitize("abcdef", 3), "abc…");
    }

    #[test]
    fn sizes_and_durations_read_naturally() {
        assert_eq!(format_bytes(DEFAULT_MEMORY_LIMIT), "256 MiB");
        assert_eq!(format_bytes(64 << 10), "64 KiB");
        assert_eq!(format_bytes(1000), "1000 bytes");
        assert_eq!(format_duration(DEFAULT_CALL_DEADLINE), "50 ms");
        assert_eq!(format_duration(Duration::from_micros(250)), "250 µs");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5 s");
    }

    #[test]
    fn limiter_remembers_a_refused_growth_once() {
        let mut limiter = Limiter::new(&SandboxLimits {
            memory_limit: 1 << 20,
            ..SandboxLimits::default()
        });
        assert!(matches!(limiter.memory_growing(0, 1 << 20, None), Ok(true)));
        assert_eq!(limiter.take_refusal(), None);
        assert!(matches!(
            limiter.memory_growing(1 << 20, 2 << 20, None),
            Ok(false)
        ));
        assert_eq!(limiter.take_refusal(), Some(2 << 20));
        assert_eq!(limiter.take_refusal(), None, "a refusal is reported once");
    }
}
