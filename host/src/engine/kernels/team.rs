//! Splitting a matrix product's weight rows among the OpenMP threads llama.cpp computes its
//! graphs with, for the host's kernels (`quant_matmul`, `avx2`).

#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `kernel(rows, outputs)` on shares of `0..rows` on up to `threads` threads: `outputs[p]`
/// (one per batch row, `rows` values each) is split the same way, so each call gets, for every
/// batch row, the values of its rows. Which thread computes a row changes nothing in its value.
pub(super) fn split_rows<K>(rows: usize, outputs: &mut [&mut [f32]], threads: usize, kernel: K)
where
    K: Fn(Range<usize>, &mut [&mut [f32]]) + Sync,
{
    let threads = threads.min(rows.div_ceil(MIN_ROWS_PER_THREAD)).max(1);
    let per_thread = rows.div_ceil(threads);
    // Each thread gets, for every batch row, the slice of its rows; the locks are never
    // contended (one per thread) and keep the hand-over safe.
    let mut shares: Vec<Vec<&mut [f32]>> = (0..threads).map(|_| Vec::new()).collect();
    for output in outputs.iter_mut() {
        let mut rest: &mut [f32] = output;
        for share in shares.iter_mut() {
            let take = per_thread.min(rest.len());
            let (mine, others) = rest.split_at_mut(take);
            share.push(mine);
            rest = others;
        }
    }
    let shares: Vec<Mutex<Vec<&mut [f32]>>> = shares.into_iter().map(Mutex::new).collect();
    parallel(threads, |thread, team| {
        // A smaller team than asked for (OpenMP may give one) takes the shares in turn.
        for share in (thread..shares.len()).step_by(team) {
            let start = share * per_thread;
            let range = start.min(rows)..(start + per_thread).min(rows);
            let mut outputs = shares[share].lock().unwrap_or_else(|e| e.into_inner());
            kernel(range, &mut outputs);
        }
    });
}

/// Fewer rows than this per thread cost more in hand-over than they save.
const MIN_ROWS_PER_THREAD: usize = 32;

unsafe extern "C" {
    /// libgomp's entry of `#pragma omp parallel` (llama.cpp links libgomp for its own threads).
    fn GOMP_parallel(
        work: unsafe extern "C" fn(*mut c_void),
        data: *mut c_void,
        num_threads: c_uint,
        flags: c_uint,
    );
    fn omp_get_thread_num() -> c_int;
    fn omp_get_num_threads() -> c_int;
}

/// Runs `work(thread, team)` on `threads` threads (the calling one included) of the OpenMP team
/// llama.cpp computes its graphs with, so the host's kernels and llama.cpp's take turns on the
/// same, already running threads instead of competing with them.
fn parallel<F: Fn(usize, usize) + Sync>(threads: usize, work: F) {
    if threads <= 1 {
        work(0, 1);
        return;
    }
    struct Job<F> {
        work: F,
        panicked: AtomicBool,
    }
    unsafe extern "C" fn run<F: Fn(usize, usize) + Sync>(data: *mut c_void) {
        // SAFETY: `data` is the `Job` below, alive until `GOMP_parallel` returns.
        let job = unsafe { &*data.cast::<Job<F>>() };
        // SAFETY: called inside the parallel region.
        let (thread, team) = unsafe { (omp_get_thread_num(), omp_get_num_threads()) };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (job.work)(thread.max(0) as usize, team.max(1) as usize)
        }));
        if ran.is_err() {
            job.panicked.store(true, Ordering::Relaxed);
        }
    }
    let job = Job {
        work,
        panicked: AtomicBool::new(false),
    };
    // SAFETY: `run::<F>` only reads the job, which outlives the region; a panic does not
    // unwind into libgomp (caught above, raised again below).
    unsafe {
        GOMP_parallel(
            run::<F>,
            std::ptr::from_ref(&job).cast_mut().cast(),
            threads as c_uint,
            0,
        )
    };
    assert!(
        !job.panicked.load(Ordering::Relaxed),
        "a thread of the batched kernel panicked"
    );
}
