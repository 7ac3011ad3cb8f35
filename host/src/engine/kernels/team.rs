//! Splitting a matrix product's weight rows among the OpenMP threads llama.cpp computes its
//! graphs with, for the host's kernels (`quant_matmul`, `avx2`).

#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs `kernel(rows, outputs)` on pieces of `0..rows`, `piece_rows` rows each, on up to
/// `threads` threads, each taking the next piece as it finishes one (so a thread that runs
/// slower, on a busy machine, does less): `outputs[p]` (one per batch row, `rows` values each)
/// is split the same way, so each call gets, for every batch row, the values of its rows. Which
/// thread computes a row changes nothing in its value.
fn split_rows<K>(
    rows: usize,
    piece_rows: usize,
    outputs: &mut [&mut [f32]],
    threads: usize,
    kernel: K,
) where
    K: Fn(Range<usize>, &mut [&mut [f32]]) + Sync,
{
    let piece_rows = piece_rows.max(1);
    let pieces = rows.div_ceil(piece_rows);
    // Each piece gets, for every batch row, the slice of its rows; a piece's lock is taken once,
    // by the thread that takes the piece, and keeps the hand-over safe.
    let mut shares: Vec<Vec<&mut [f32]>> = (0..pieces).map(|_| Vec::new()).collect();
    for output in outputs.iter_mut() {
        let mut rest: &mut [f32] = output;
        for share in shares.iter_mut() {
            let take = piece_rows.min(rest.len());
            let (mine, others) = rest.split_at_mut(take);
            share.push(mine);
            rest = others;
        }
    }
    let shares: Vec<Mutex<Vec<&mut [f32]>>> = shares.into_iter().map(Mutex::new).collect();
    let next = AtomicUsize::new(0);
    parallel(threads.min(pieces).max(1), |_, _| {
        loop {
            let piece = next.fetch_add(1, Ordering::Relaxed);
            if piece >= pieces {
                break;
            }
            let start = piece * piece_rows;
            let range = start..(start + piece_rows).min(rows);
            let mut outputs = shares[piece].lock().unwrap_or_else(|e| e.into_inner());
            kernel(range, &mut outputs);
        }
    });
}

/// Fewer rows than this in a piece cost more in hand-over than they save.
const MIN_PIECE_ROWS: usize = 32;

/// Pieces per thread a product's rows are cut into, at least (as the rows allow): enough for
/// the threads to even out.
const PIECES_PER_THREAD: usize = 4;

/// Multiplies the weight rows `0..rows` (`row_bytes` each) with every pass of a batch (`passes`,
/// the batch rows quantized `rows_per_pass` at a time; `outputs` one per batch row, in the same
/// order, `rows` values each) on up to `threads` threads: `kernel(tile, pass, rows, outputs)`
/// computes rows `rows` for one pass, `tile` being what `prepare(rows)` made of those rows once
/// for every pass (the weights' scales in `f32`, say). The threads take the rows a piece at a time
/// (at most a cache tile, at least [`MIN_PIECE_ROWS`]) and multiply a piece with every pass before
/// the next, so a batch of many passes (a prompt) reads each weight from memory once instead of
/// once per pass. The order changes no value: each one is computed alone.
pub(super) fn multiply_passes<P, T, R, K>(
    row_bytes: usize,
    passes: &[P],
    rows_per_pass: usize,
    outputs: &mut [&mut [f32]],
    threads: usize,
    prepare: R,
    kernel: K,
) where
    P: Sync,
    R: Fn(Range<usize>) -> T + Sync,
    K: Fn(&T, &P, Range<usize>, &mut [&mut [f32]]) + Sync,
{
    let Some(rows) = outputs.first().map(|output| output.len()) else {
        return;
    };
    let tile_rows = (TILE_BYTES / row_bytes.max(1)).max(1);
    let piece_rows = tile_rows.min(
        rows.div_ceil(threads.max(1) * PIECES_PER_THREAD)
            .max(MIN_PIECE_ROWS),
    );
    split_rows(rows, piece_rows, outputs, threads, |tile, outputs| {
        let prepared = prepare(tile.clone());
        for (pass, pass_outputs) in passes.iter().zip(outputs.chunks_mut(rows_per_pass)) {
            kernel(&prepared, pass, tile.clone(), pass_outputs);
        }
    });
}

/// Weight bytes a thread multiplies with every pass of a batch before its next rows: with a
/// pass's quantized batch rows they stay in a core's L2 cache (512 KiB to 2 MiB on current x86
/// server cores).
const TILE_BYTES: usize = 256 * 1024;

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

/// `f` of every item, computed on up to `threads` threads of the team (a batch's passes
/// quantized in parallel rather than by the calling thread alone), in the items' order.
pub(super) fn map<I, T, F>(items: &[I], threads: usize, f: F) -> Vec<T>
where
    I: Sync,
    T: Send,
    F: Fn(&I) -> T + Sync,
{
    let threads = threads.min(items.len()).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let results: Vec<Mutex<Option<T>>> = items.iter().map(|_| Mutex::new(None)).collect();
    parallel(threads, |thread, team| {
        for (item, result) in items.iter().zip(&results).skip(thread).step_by(team) {
            let value = f(item);
            *result.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        }
    });
    results
        .into_iter()
        .map(|result| {
            result
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item mapped")
        })
        .collect()
}

/// Runs `work(thread, team)` on `threads` threads (the calling one included) of the OpenMP team
/// llama.cpp computes its graphs with, so the host's kernels and llama.cpp's take turns on the
/// same, already running threads instead of competing with them.
pub(super) fn parallel<F: Fn(usize, usize) + Sync>(threads: usize, work: F) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (pass, weight row) is computed once, into its batch row's output at the row's
    /// place, whatever the tiles and threads.
    #[test]
    fn multiplying_passes_in_tiles_computes_every_value_once_in_its_place() {
        let rows = 1000;
        let rows_per_pass = 3;
        let batch_rows = 8;
        // Three passes (3 + 3 + 2 batch rows); a pass knows its first batch row.
        let passes: Vec<usize> = (0..batch_rows).step_by(rows_per_pass).collect();
        for (row_bytes, threads) in [(1, 1), (1000, 2), (4000, 3), (TILE_BYTES * 2, 2)] {
            let mut outputs = vec![0.0f32; batch_rows * rows];
            let mut output_rows: Vec<&mut [f32]> = outputs.chunks_exact_mut(rows).collect();
            multiply_passes(
                row_bytes,
                &passes,
                rows_per_pass,
                &mut output_rows,
                threads,
                |tile| tile,
                |tile, &first, range, outputs| {
                    assert_eq!(*tile, range, "the tile prepared for these rows");
                    for (i, output) in outputs.iter_mut().enumerate() {
                        assert_eq!(output.len(), range.len());
                        for (value, row) in output.iter_mut().zip(range.clone()) {
                            *value += ((first + i) * rows + row) as f32 + 1.0;
                        }
                    }
                },
            );
            for (at, value) in outputs.iter().enumerate() {
                assert_eq!(
                    *value,
                    at as f32 + 1.0,
                    "{row_bytes}-byte rows on {threads} threads: value {at}"
                );
            }
        }
    }
}
