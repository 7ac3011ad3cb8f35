//! The draft model on its own CPUs (`--draft-cpus`).
//!
//! llama.cpp runs a decode on the calling thread and an OpenMP team started from it, which
//! inherits that thread's CPU affinity. Draft-model calls come from plugin calls on the engine
//! thread, which is pinned to the compute CPUs; so that the draft model's work runs on the draft
//! CPUs instead, [`PinnedDraftFactory`] gives every draft context a worker thread of its own,
//! pinned to the draft CPUs, which opens the context and makes every call on it. A plugin's call
//! waits for the worker's answer: a channel round trip of microseconds, against milliseconds for
//! a decode. A server's draft context, which drafts for every slot at once, lives on such a
//! worker too ([`PinnedDraftBatch`]).

use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use super::affinity::pin_current_thread;
use super::cpulist::CpuList;
use crate::cascade::{DraftModel, DraftModelFactory, Drafted, ProposalSettings, Token};
use crate::engine::{BatchDrafter, DraftAsk, DraftBatch, OwnedDraftAsk, SeqId};

/// Name of every draft worker thread, as `/proc` and `spechost run --json` show it.
pub const DRAFT_THREAD_NAME: &str = "spechost-draft";

/// Opens the contexts of `inner` on worker threads pinned to `cpus`.
pub struct PinnedDraftFactory {
    inner: Arc<dyn DraftModelFactory>,
    cpus: CpuList,
}

impl PinnedDraftFactory {
    /// A factory whose contexts live, and compute, on `cpus`.
    pub fn new(inner: Arc<dyn DraftModelFactory>, cpus: CpuList) -> Self {
        Self { inner, cpus }
    }
}

impl DraftModelFactory for PinnedDraftFactory {
    fn open(&self) -> Result<Box<dyn DraftModel>, String> {
        let (calls, inbox) = mpsc::channel::<Call>();
        let (opened, open_result) = mpsc::channel::<Result<(), String>>();
        let inner = Arc::clone(&self.inner);
        let cpus = self.cpus.clone();
        let worker = std::thread::Builder::new()
            .name(DRAFT_THREAD_NAME.into())
            .spawn(move || {
                if let Err(error) = pin_current_thread(&cpus) {
                    let _ = opened.send(Err(format!(
                        "cannot pin the draft model's thread to --draft-cpus {cpus}: {error}"
                    )));
                    return;
                }
                // Opened here, so its buffers are first touched next to the draft CPUs.
                let mut model = match inner.open() {
                    Ok(model) => model,
                    Err(reason) => {
                        let _ = opened.send(Err(reason));
                        return;
                    }
                };
                let _ = opened.send(Ok(()));
                for call in inbox {
                    match call {
                        Call::Reset => model.reset(),
                        Call::Feed(tokens) => model.feed(&tokens),
                        Call::Propose { settings, reply } => {
                            let _ = reply.send(model.propose(settings));
                        }
                    }
                }
            })
            .map_err(|error| format!("cannot start the draft model's thread: {error}"))?;
        open_result.recv().map_err(|_| {
            "the draft model's thread stopped while opening its context".to_owned()
        })??;
        Ok(Box::new(PinnedDraftModel {
            calls: Some(calls),
            worker: Some(worker),
        }))
    }
}

/// A server's draft context ([`DraftBatch`]) on a worker thread pinned to the draft CPUs: the
/// batcher's proposals and clears go to the worker, which drafts and answers each proposal as
/// soon as it is complete.
pub struct PinnedDraftBatch {
    /// `None` only while dropping, which ends the worker's loop.
    jobs: Option<mpsc::Sender<BatchJob>>,
    worker: Option<JoinHandle<()>>,
    sequences: usize,
    ctx_size: u32,
}

/// Work for a pinned draft context.
enum BatchJob {
    /// Draft for these asks, answering `(index, draft)`.
    Propose {
        asks: Vec<OwnedDraftAsk>,
        answers: mpsc::Sender<(usize, Drafted)>,
    },
    Clear(SeqId),
}

impl PinnedDraftBatch {
    /// Opens the context with `open` on a new worker thread pinned to `cpus`.
    pub fn open(
        cpus: CpuList,
        open: impl FnOnce() -> Result<DraftBatch, String> + Send + 'static,
    ) -> Result<Self, String> {
        let (jobs, inbox) = mpsc::channel::<BatchJob>();
        let (opened, open_result) = mpsc::channel::<Result<(usize, u32), String>>();
        let worker = std::thread::Builder::new()
            .name(DRAFT_THREAD_NAME.into())
            .spawn(move || {
                if let Err(error) = pin_current_thread(&cpus) {
                    let _ = opened.send(Err(format!(
                        "cannot pin the draft model's thread to --draft-cpus {cpus}: {error}"
                    )));
                    return;
                }
                // Opened here, so its buffers are first touched next to the draft CPUs.
                let mut batch = match open() {
                    Ok(batch) => batch,
                    Err(reason) => {
                        let _ = opened.send(Err(reason));
                        return;
                    }
                };
                let _ = opened.send(Ok((batch.sequences(), batch.ctx_size())));
                for job in inbox {
                    match job {
                        BatchJob::Propose { asks, answers } => {
                            let asks: Vec<DraftAsk<'_>> =
                                asks.iter().map(OwnedDraftAsk::as_ask).collect();
                            batch.propose(&asks, |index, drafted| {
                                let _ = answers.send((index, drafted));
                            });
                        }
                        BatchJob::Clear(seq) => batch.clear(seq),
                    }
                }
            })
            .map_err(|error| format!("cannot start the draft model's thread: {error}"))?;
        let (sequences, ctx_size) = open_result.recv().map_err(|_| {
            "the draft model's thread stopped while opening its context".to_owned()
        })??;
        Ok(Self {
            jobs: Some(jobs),
            worker: Some(worker),
            sequences,
            ctx_size,
        })
    }
}

impl BatchDrafter for PinnedDraftBatch {
    fn sequences(&self) -> usize {
        self.sequences
    }

    fn ctx_size(&self) -> u32 {
        self.ctx_size
    }

    fn propose(&mut self, asks: &[DraftAsk<'_>], answer: &mut dyn FnMut(usize, Drafted)) {
        let (answers, answered) = mpsc::channel();
        let job = BatchJob::Propose {
            asks: asks.iter().map(DraftAsk::to_owned_ask).collect(),
            answers,
        };
        if let Some(jobs) = &self.jobs {
            // A worker that is gone drops the job, and with it the answers' sender.
            let _ = jobs.send(job);
        }
        let mut unanswered = vec![true; asks.len()];
        // Until the worker is done with the job (or gone).
        for (index, drafted) in answered {
            if unanswered.get(index) == Some(&true) {
                unanswered[index] = false;
                answer(index, drafted);
            }
        }
        // Every ask is answered: with nothing when the worker is gone.
        for (index, _) in unanswered.iter().enumerate().filter(|(_, open)| **open) {
            answer(index, Drafted::default());
        }
    }

    fn clear(&mut self, seq: SeqId) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(BatchJob::Clear(seq));
        }
    }
}

impl Drop for PinnedDraftBatch {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// A call on a pinned draft context, in the order the plugin made it.
enum Call {
    Reset,
    Feed(Vec<Token>),
    Propose {
        settings: ProposalSettings,
        reply: mpsc::Sender<Drafted>,
    },
}

/// A draft context owned by its worker thread; calls go to the worker in order.
struct PinnedDraftModel {
    /// `None` only while dropping, which ends the worker's loop.
    calls: Option<mpsc::Sender<Call>>,
    worker: Option<JoinHandle<()>>,
}

impl PinnedDraftModel {
    /// Sends `call`; a worker that is gone (it panicked) drops it, and proposes nothing.
    fn send(&self, call: Call) {
        if let Some(calls) = &self.calls {
            let _ = calls.send(call);
        }
    }
}

impl DraftModel for PinnedDraftModel {
    fn reset(&mut self) {
        self.send(Call::Reset);
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.send(Call::Feed(tokens.to_vec()));
    }

    fn propose(&mut self, settings: ProposalSettings) -> Drafted {
        let (reply, answer) = mpsc::channel();
        self.send(Call::Propose { settings, reply });
        answer.recv().unwrap_or_default()
    }
}

impl Drop for PinnedDraftModel {
    fn drop(&mut self) {
        self.calls = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::cascade::DraftedToken;
    use crate::placement::current_thread_cpus;

    /// A draft model that records the calls it gets, with the CPUs of the thread that made them.
    #[derive(Default)]
    struct Recorder {
        calls: Arc<Mutex<Vec<(String, CpuList)>>>,
    }

    struct RecordingModel {
        calls: Arc<Mutex<Vec<(String, CpuList)>>>,
    }

    impl RecordingModel {
        fn record(&self, call: String) {
            let cpus = current_thread_cpus().expect("readable affinity");
            self.calls.lock().expect("not poisoned").push((call, cpus));
        }
    }

    impl DraftModelFactory for Recorder {
        fn open(&self) -> Result<Box<dyn DraftModel>, String> {
            Ok(Box::new(RecordingModel {
                calls: Arc::clone(&self.calls),
            }))
        }
    }

    impl DraftModel for RecordingModel {
        fn reset(&mut self) {
            self.record("reset".into());
        }

        fn feed(&mut self, tokens: &[Token]) {
            self.record(format!("feed {tokens:?}"));
        }

        fn propose(&mut self, settings: ProposalSettings) -> Drafted {
            let max_draft_len = settings.max_draft_len;
            self.record(format!("propose {max_draft_len}"));
            Drafted {
                tokens: vec![
                    DraftedToken {
                        token: 7,
                        prob: 0.9
                    };
                    max_draft_len
                ],
                ..Drafted::default()
            }
        }
    }

    #[test]
    fn every_call_runs_in_order_on_the_draft_cpus() {
        let allowed = current_thread_cpus().expect("readable affinity");
        let draft_cpus = CpuList::from_cpus(allowed.iter().last());
        let recorder = Recorder::default();
        let calls = Arc::clone(&recorder.calls);
        let factory = PinnedDraftFactory::new(Arc::new(recorder), draft_cpus.clone());
        let mut model = factory.open().expect("opens");
        model.reset();
        model.feed(&[1, 2, 3]);
        let drafted = model.propose(ProposalSettings::greedy(2, 0.5));
        assert_eq!(drafted.tokens.len(), 2);
        drop(model);
        let calls = calls.lock().expect("not poisoned");
        let names: Vec<&str> = calls.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["reset", "feed [1, 2, 3]", "propose 2"]);
        assert!(
            calls.iter().all(|(_, cpus)| *cpus == draft_cpus),
            "every call on {draft_cpus}: {calls:?}"
        );
        assert_eq!(
            current_thread_cpus().expect("readable"),
            allowed,
            "the caller's own thread is not pinned"
        );
    }

    #[test]
    fn a_context_that_cannot_open_says_why() {
        struct Refuses;
        impl DraftModelFactory for Refuses {
            fn open(&self) -> Result<Box<dyn DraftModel>, String> {
                Err("out of memory".into())
            }
        }
        let cpus = current_thread_cpus().expect("readable affinity");
        let error = PinnedDraftFactory::new(Arc::new(Refuses), cpus)
            .open()
            .err()
            .expect("the refusal comes back");
        assert_eq!(error, "out of memory");
    }
}
