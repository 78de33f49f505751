//! Workers that poll over HTTP instead of holding a gRPC stream.
//!
//! A user's container image speaks the RunPod worker protocol: it asks for
//! jobs (`job-take`), posts results (`job-done`), streamed pieces
//! (`job-stream`) and pings, and long-polls for jobs to stop (`job-stop`).
//! A [`PolledWorker`] makes such a worker a registry entry like any gRPC
//! worker, so assignment, leases, lost-worker requeues, cancellation and
//! settlement are the same code for both: the registry sends its messages
//! into a channel this module sorts (assignments for the next take, cancels
//! for the next stop), and what the worker posts becomes the
//! [`WorkerMessage`]s a stream would have carried.
//!
//! Credits follow the poller: a take of `n` grants the slots that bring the
//! worker's outstanding credit (unused credit plus assignments not yet taken)
//! up to `n`, and takes back what is unused when it returns, so jobs go only
//! to workers waiting for them. A worker that stops polling keeps the jobs
//! assigned to it until its lease runs out, and then they are requeued like a
//! lost stream's.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use gantry_proto::v1::{
    Assign, Cancelled, Failure, Hello, Progress, Result as ResultMessage, SchedulerMessage, SlotCredit, StreamChunk,
    Usage, WorkerMessage, scheduler_message, worker_message::Kind,
};
use tokio::sync::{Notify, mpsc};

use crate::registry::Inner;

/// The longest a take that has a job waits for others already assigned to
/// the worker to reach it (they follow within microseconds; the bound covers
/// a registry count that is briefly ahead of what the worker will get).
const GATHER: Duration = Duration::from_millis(50);

/// A job handed to a polling worker.
#[derive(Debug, Clone, PartialEq)]
pub struct TakenJob {
    pub job_id: String,
    /// The job's input, as JSON text.
    pub input_json: String,
}

/// What a polling worker reported for a job it holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// Not terminal: a progress update.
    Progress(serde_json::Value),
    /// Terminal: the job's output.
    Output(serde_json::Value),
    /// Terminal: the handler failed (not retried: the same input fails again).
    Error(String),
}

/// One worker of the RunPod protocol, registered with the dispatcher. Cheap
/// to clone; every clone is the same worker.
#[derive(Clone)]
pub struct PolledWorker {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<Inner>,
    worker_id: String,
    conn: u64,
    state: Mutex<PollState>,
    changed: Notify,
}

#[derive(Default)]
struct PollState {
    /// Assigned by the registry, not yet taken.
    waiting: VecDeque<Assign>,
    /// Taken jobs still running: job id -> (attempt, next chunk seq).
    running: HashMap<String, (u32, u64)>,
    /// Cancelled while running; the next stop poll hands them out.
    stopping: Vec<String>,
    draining: bool,
    /// The registry dropped this worker (lease ran out, replaced, shut down).
    closed: bool,
}

/// Why a polling worker's call had no effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    /// The registry no longer has this worker: register it again.
    #[error("worker is no longer registered")]
    Closed,
}

impl PolledWorker {
    pub(crate) async fn register(
        inner: &Arc<Inner>,
        worker_id: &str,
        model: &str,
        version: &str,
        lease: Duration,
    ) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let hello = Hello {
            worker_id: worker_id.to_owned(),
            models: vec![model.to_owned()],
            // No credit until the worker asks for a job (each take grants it).
            slots: 0,
            gpu_name: String::new(),
            gpu_memory_bytes: 0,
            version: version.to_owned(),
        };
        let registration = inner.register(hello, tx).await;
        inner.set_lease(worker_id, registration.conn, lease);
        let shared = Arc::new(Shared {
            inner: Arc::clone(inner),
            worker_id: worker_id.to_owned(),
            conn: registration.conn,
            state: Mutex::new(PollState::default()),
            changed: Notify::new(),
        });
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            while let Some(message) = rx.recv().await {
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                shared.sort(message).await;
            }
            if let Some(shared) = weak.upgrade() {
                shared.lock().closed = true;
                shared.changed.notify_waiters();
            }
        });
        Self { shared }
    }

    pub fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    /// Whether the registry dropped this worker.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Ids of the jobs the worker has taken and not finished, sorted.
    pub fn running(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.shared.lock().running.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Jobs assigned to the worker: taken and running, or waiting for its
    /// next take. The registry's count, which includes an assignment the
    /// moment it is made (before this worker has sorted it).
    pub fn load(&self) -> usize {
        let state = self.shared.lock();
        let sorted = state.running.len() + state.waiting.len();
        drop(state);
        self.shared
            .inner
            .held_by(&self.shared.worker_id, self.shared.conn)
            .map_or(sorted, |held| held.max(sorted))
    }

    /// Stops the worker from getting jobs, but only if it holds none (in one
    /// step, so no job is assigned in between): true when it is now drained
    /// and empty, and may be stopped without losing a job. A worker that is
    /// no longer registered holds nothing and is retired too.
    pub fn retire(&self) -> bool {
        let (inner, id, conn) = (&self.shared.inner, &self.shared.worker_id, self.shared.conn);
        let retired = inner.retire(id, conn) || inner.held_by(id, conn).is_none();
        if retired {
            self.shared.lock().draining = true;
            self.shared.changed.notify_waiters();
        }
        retired
    }

    /// Any call of the worker: renews its lease.
    pub fn touch(&self) -> Result<(), PollError> {
        if self.shared.inner.touch(&self.shared.worker_id, self.shared.conn) {
            Ok(())
        } else {
            Err(PollError::Closed)
        }
    }

    /// Up to `n` jobs, waiting at most `wait` for the first. Empty when none
    /// came (or the worker is draining).
    pub async fn take(&self, n: u32, wait: Duration) -> Result<Vec<TakenJob>, PollError> {
        self.touch()?;
        let n = n.max(1);
        let (draining, buffered) = {
            let state = self.shared.lock();
            (state.draining, u32::try_from(state.waiting.len()).unwrap_or(u32::MAX))
        };
        // A draining worker gets no new credit, but still takes what was
        // assigned to it before.
        if !draining {
            let have = self
                .shared
                .inner
                .credits_of(&self.shared.worker_id, self.shared.conn)
                .ok_or(PollError::Closed)?
                .saturating_add(buffered);
            if have < n {
                self.shared.send(Kind::SlotCredit(SlotCredit { slots: n - have })).await;
            }
        }
        // Credit lives only while a take waits (the guard takes it back
        // however the take ends, its request dropped included): a worker busy
        // with what it took, or sleeping before its next take, must not be
        // handed jobs that would wait for it while other workers poll.
        let _revoke = Revoke(&self.shared);
        self.wait_for_jobs(n, wait).await
    }

    async fn wait_for_jobs(&self, n: u32, wait: Duration) -> Result<Vec<TakenJob>, PollError> {
        let deadline = tokio::time::Instant::now() + wait;
        // Set once a job is here while more are on their way (see below).
        let mut gather_until: Option<tokio::time::Instant> = None;
        loop {
            let notified = self.shared.changed.notified();
            // Jobs the registry holds for this worker, read before its own
            // state (never both locks at once).
            let held = self
                .shared
                .inner
                .held_by(&self.shared.worker_id, self.shared.conn)
                .unwrap_or(0);
            let gather = {
                let mut state = self.shared.lock();
                if state.closed {
                    return Err(PollError::Closed);
                }
                // The scheduler places a burst of queued jobs in one step,
                // but each reaches this worker through its channel: the first
                // wakes the take while the others are a moment behind. A take
                // of `n` waits for those already assigned to it (never for
                // new ones, and at most GATHER), so that a worker behind a
                // queue gets its jobs in one answer instead of one take each.
                let now = tokio::time::Instant::now();
                let gather = more_on_the_way(state.waiting.len(), state.running.len(), held, n)
                    .then(|| *gather_until.get_or_insert(now + GATHER))
                    .filter(|until| now < *until);
                if gather.is_none() && !state.waiting.is_empty() {
                    let count = state.waiting.len().min(n as usize);
                    let taken: Vec<Assign> = state.waiting.drain(..count).collect();
                    for assign in &taken {
                        state.running.insert(assign.job_id.clone(), (assign.attempt, 0));
                    }
                    return Ok(taken
                        .into_iter()
                        .map(|assign| TakenJob {
                            job_id: assign.job_id,
                            input_json: assign.input_json,
                        })
                        .collect());
                }
                if gather.is_none() && state.draining {
                    return Ok(Vec::new());
                }
                gather
            };
            if let Some(until) = gather {
                let _ = tokio::time::timeout_at(until.min(deadline), notified).await;
                continue;
            }
            if !self.nap(deadline, notified).await {
                return Ok(Vec::new());
            }
        }
    }

    /// Waits for `notified` until `deadline`; false once the deadline passed.
    /// An open request does not renew the worker's lease: the HTTP server
    /// does not drop a request whose client went away, so a dead worker's
    /// take would keep it alive, and be handed jobs, until its long poll
    /// ended. The SDK's pings (every `RUNPOD_PING_INTERVAL`, from a process
    /// of their own) keep a live worker's lease while it waits.
    async fn nap(&self, deadline: tokio::time::Instant, notified: tokio::sync::futures::Notified<'_>) -> bool {
        tokio::time::timeout_at(deadline, notified).await.is_ok()
    }

    /// The jobs to stop, waiting at most `wait` for one. Each is settled as
    /// cancelled here: the RunPod worker posts nothing for a stopped job.
    pub async fn stops(&self, wait: Duration) -> Result<Vec<String>, PollError> {
        self.touch()?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.shared.changed.notified();
            let stopped: Vec<(String, u32)> = {
                let mut state = self.shared.lock();
                if state.closed {
                    return Err(PollError::Closed);
                }
                let ids = std::mem::take(&mut state.stopping);
                ids.into_iter()
                    .filter_map(|id| state.running.remove(&id).map(|(attempt, _)| (id, attempt)))
                    .collect()
            };
            if !stopped.is_empty() {
                for (job_id, attempt) in &stopped {
                    self.shared
                        .send(Kind::Cancelled(Cancelled {
                            job_id: job_id.clone(),
                            attempt: *attempt,
                        }))
                        .await;
                }
                return Ok(stopped.into_iter().map(|(id, _)| id).collect());
            }
            if !self.nap(deadline, notified).await {
                return Ok(Vec::new());
            }
        }
    }

    /// A report about job `job_id`. Returns whether the worker held it: a
    /// repeated or late report is accepted and ignored, so the worker's own
    /// retries never settle a job twice.
    pub async fn report(&self, job_id: &str, report: Report) -> Result<bool, PollError> {
        self.touch()?;
        let attempt = {
            let mut state = self.shared.lock();
            match (&report, state.running.get(job_id).map(|(attempt, _)| *attempt)) {
                (_, None) => return Ok(false),
                (Report::Progress(_), Some(attempt)) => attempt,
                (_, Some(attempt)) => {
                    state.running.remove(job_id);
                    attempt
                }
            }
        };
        let job_id = job_id.to_owned();
        let kind = match report {
            Report::Progress(message) => Kind::Progress(Progress {
                job_id,
                attempt,
                message_json: message.to_string(),
            }),
            Report::Output(output) => Kind::Result(ResultMessage {
                job_id,
                attempt,
                output_json: output.to_string(),
                usage: Some(Usage {
                    unit: "requests".into(),
                    quantity_micros: 1_000_000,
                }),
                timings: None,
                files: Vec::new(),
            }),
            Report::Error(error) => Kind::Failure(Failure {
                job_id,
                attempt,
                error,
                retryable: false,
            }),
        };
        self.shared.send(kind).await;
        Ok(true)
    }

    /// One streamed piece of a running job's output; false if the worker
    /// does not hold the job.
    pub async fn stream(&self, job_id: &str, output: serde_json::Value) -> Result<bool, PollError> {
        self.touch()?;
        let (attempt, seq) = {
            let mut state = self.shared.lock();
            let Some((attempt, next)) = state.running.get_mut(job_id) else {
                return Ok(false);
            };
            let seq = *next;
            *next += 1;
            (*attempt, seq)
        };
        self.shared
            .send(Kind::StreamChunk(StreamChunk {
                job_id: job_id.to_owned(),
                attempt,
                seq,
                output_json: output.to_string(),
            }))
            .await;
        Ok(true)
    }

    /// Removes the worker (its container is gone): the jobs it held are
    /// reported lost and requeued.
    pub async fn close(&self) {
        self.shared
            .inner
            .deregister(&self.shared.worker_id, self.shared.conn, None)
            .await;
        self.shared.lock().closed = true;
        self.shared.changed.notify_waiters();
    }
}

/// Whether a take of `n` that has `waiting` jobs should wait for more: the
/// registry holds `held` jobs for the worker, of which `waiting + running`
/// have reached it, so the rest are assignments on their way.
fn more_on_the_way(waiting: usize, running: usize, held: usize, n: u32) -> bool {
    waiting > 0 && waiting < n as usize && held > waiting + running
}

/// Takes back a worker's unused credit when dropped.
struct Revoke<'a>(&'a Shared);

impl Drop for Revoke<'_> {
    fn drop(&mut self) {
        self.0.inner.revoke_credits(&self.0.worker_id, self.0.conn);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PollState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn send(&self, kind: Kind) {
        let message = WorkerMessage { kind: Some(kind) };
        self.inner
            .on_message(&self.worker_id, self.conn, message, Ok(Vec::new()))
            .await;
    }

    /// Files one message of the registry where the worker's polls find it.
    async fn sort(&self, message: Result<SchedulerMessage, tonic::Status>) {
        let kind = match message {
            Ok(SchedulerMessage { kind: Some(kind) }) => kind,
            Ok(_) => return,
            Err(status) => {
                tracing::info!(worker_id = %self.worker_id, %status, "polling worker dropped");
                self.lock().closed = true;
                self.changed.notify_waiters();
                return;
            }
        };
        let mut unstarted = None;
        {
            let mut state = self.lock();
            match kind {
                scheduler_message::Kind::Assign(assign) => state.waiting.push_back(assign),
                scheduler_message::Kind::Cancel(cancel) => {
                    // Not taken yet: it never starts, and is cancelled at once.
                    if let Some(index) = state.waiting.iter().position(|a| a.job_id == cancel.job_id) {
                        unstarted = state.waiting.remove(index);
                    } else if state.running.contains_key(&cancel.job_id) {
                        state.stopping.push(cancel.job_id);
                    }
                }
                scheduler_message::Kind::Drain(_) => state.draining = true,
                scheduler_message::Kind::HelloAck(_) => {}
            }
        }
        if let Some(assign) = unstarted {
            self.send(Kind::Cancelled(Cancelled {
                job_id: assign.job_id,
                attempt: assign.attempt,
            }))
            .await;
        }
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use serde_json::json;

    use crate::{Assignment, DispatchConfig, Dispatcher, Event, Report};

    const MODEL: &str = "ep_test";

    async fn next_job_event(events: &mut tokio::sync::mpsc::Receiver<Event>) -> Event {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("an event in time")
                .expect("events open");
            if !matches!(event, Event::CapacityAvailable { .. }) {
                return event;
            }
        }
    }

    #[tokio::test]
    async fn a_take_grants_credit_and_reports_become_events() {
        let (dispatcher, mut events) = Dispatcher::new(DispatchConfig::new("secret"));
        let worker = dispatcher
            .attach_polled("wk_1", MODEL, "test", Duration::from_secs(30))
            .await;
        // No credit before the worker asks.
        let job = Assignment::new("job-1", 1, MODEL, json!({"x": 1}));
        assert!(dispatcher.assign(job.clone()).is_err());
        // A take grants one slot; the job assigned then is what it returns.
        let taker = {
            let worker = worker.clone();
            tokio::spawn(async move { worker.take(1, Duration::from_secs(10)).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while dispatcher.assign(job.clone()).is_err() {
            assert!(tokio::time::Instant::now() < deadline, "no credit was granted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let taken = taker.await.unwrap().unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].job_id, "job-1");
        assert_eq!(worker.running(), vec!["job-1".to_string()]);
        // Progress is not terminal; the output is, once.
        assert!(worker.report("job-1", Report::Progress(json!("half"))).await.unwrap());
        assert!(matches!(next_job_event(&mut events).await, Event::Progress { .. }));
        assert!(worker.stream("job-1", json!({"tok": 0})).await.unwrap());
        assert!(matches!(next_job_event(&mut events).await, Event::Chunk { seq: 0, .. }));
        assert!(
            worker
                .report("job-1", Report::Output(json!({"ok": true})))
                .await
                .unwrap()
        );
        match next_job_event(&mut events).await {
            Event::Completed { job_id, output, .. } => {
                assert_eq!(job_id, "job-1");
                assert_eq!(output, json!({"ok": true}));
            }
            other => panic!("expected a completion, got {other:?}"),
        }
        // The SDK's retry of the same post changes nothing.
        assert!(
            !worker
                .report("job-1", Report::Output(json!({"ok": true})))
                .await
                .unwrap()
        );
        assert!(worker.running().is_empty());
    }

    #[test]
    fn a_take_waits_only_for_jobs_already_assigned_and_only_with_one_in_hand() {
        use super::more_on_the_way;
        // One here, two more assigned and on their way, room for three.
        assert!(more_on_the_way(1, 0, 3, 3));
        // The running ones count as arrived.
        assert!(more_on_the_way(1, 2, 4, 4));
        assert!(!more_on_the_way(1, 2, 3, 4));
        // Nothing here yet: the take waits for a job anyway, not for a burst.
        assert!(!more_on_the_way(0, 0, 3, 3));
        // Full: answers at once.
        assert!(!more_on_the_way(3, 0, 5, 3));
        // Everything assigned has arrived.
        assert!(!more_on_the_way(2, 1, 3, 4));
    }

    /// A take of `n` in a task of its own, once its credit is granted.
    async fn waiting_take(
        dispatcher: &Dispatcher,
        worker: &crate::PolledWorker,
        n: u32,
    ) -> tokio::task::JoinHandle<Result<Vec<crate::TakenJob>, crate::PollError>> {
        let taker = {
            let worker = worker.clone();
            tokio::spawn(async move { worker.take(n, Duration::from_secs(10)).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while dispatcher.free_slots(MODEL) < u64::from(n) {
            assert!(tokio::time::Instant::now() < deadline, "no credit was granted");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        taker
    }

    #[tokio::test]
    async fn an_open_take_does_not_keep_a_silent_worker_alive() {
        let mut config = DispatchConfig::new("secret");
        config.lease = Duration::from_millis(400); // the reaper looks every 100 ms
        let (dispatcher, mut events) = Dispatcher::new(config);
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        let worker = dispatcher
            .attach_polled("wk_1", MODEL, "test", Duration::from_millis(1500))
            .await;
        // The take of a worker that has gone away: its request stays open on
        // the server, and nothing else comes from it.
        let taker = waiting_take(&dispatcher, &worker, 1).await;
        // Its lease runs out well before the long poll would end, and the
        // take ends with it.
        let ended = tokio::time::timeout(Duration::from_secs(9), taker)
            .await
            .expect("the take ended before its long poll")
            .unwrap();
        assert_eq!(ended, Err(crate::PollError::Closed));
        assert!(worker.is_closed());
        assert_eq!(dispatcher.free_slots(MODEL), 0);
    }

    // On two threads, as in the server: the take wakes on the first
    // assignment while the others are still on their way to the worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_take_answers_with_every_job_assigned_to_it_in_one_burst() {
        let (dispatcher, mut events) = Dispatcher::new(DispatchConfig::new("secret"));
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        let worker = dispatcher
            .attach_polled("wk_1", MODEL, "test", Duration::from_secs(30))
            .await;
        for round in 0..20 {
            let taker = waiting_take(&dispatcher, &worker, 3).await;
            // The scheduler places a burst in one step: here all three are
            // assigned before the first reaches the worker (its state is held
            // meanwhile), and the take wakes with the first.
            let ids: Vec<String> = (0..3).map(|i| format!("job-{round}-{i}")).collect();
            {
                let _sorting = worker.shared.lock();
                for id in &ids {
                    let placed = dispatcher.assign(Assignment::new(id, 1, MODEL, json!({})));
                    assert!(placed.is_ok(), "round {round}, {id}: {placed:?}");
                }
            }
            let taken = taker.await.unwrap().unwrap();
            let taken: Vec<String> = taken.into_iter().map(|job| job.job_id).collect();
            assert_eq!(taken, ids, "round {round}");
            for id in &ids {
                assert!(worker.report(id, Report::Output(json!(null))).await.unwrap());
            }
        }
        // A take of more than was assigned answers with what there is.
        let taker = waiting_take(&dispatcher, &worker, 3).await;
        dispatcher
            .assign(Assignment::new("job-last", 1, MODEL, json!({})))
            .unwrap();
        let taken = taker.await.unwrap().unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].job_id, "job-last");
    }

    /// Assigns `job` to `worker` through a take in flight, as the scheduler does.
    async fn take_one(dispatcher: &Dispatcher, worker: &crate::PolledWorker, job: &str) {
        let taker = {
            let worker = worker.clone();
            tokio::spawn(async move { worker.take(1, Duration::from_secs(10)).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while dispatcher.assign(Assignment::new(job, 1, MODEL, json!({}))).is_err() {
            assert!(tokio::time::Instant::now() < deadline, "no credit was granted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(taker.await.unwrap().unwrap()[0].job_id, job);
    }

    #[tokio::test]
    async fn cancels_reach_the_stop_poll_and_a_closed_worker_loses_its_jobs() {
        let (dispatcher, mut events) = Dispatcher::new(DispatchConfig::new("secret"));
        let worker = dispatcher
            .attach_polled("wk_2", MODEL, "test", Duration::from_secs(30))
            .await;
        take_one(&dispatcher, &worker, "a").await;
        // Credit does not outlive the take: nothing more is assigned now.
        assert!(dispatcher.assign(Assignment::new("x", 1, MODEL, json!({}))).is_err());
        // Cancelling a running job hands it to the stop poll, and settles it.
        dispatcher.cancel("a", "user");
        assert_eq!(
            worker.stops(Duration::from_secs(5)).await.unwrap(),
            vec!["a".to_string()]
        );
        match next_job_event(&mut events).await {
            Event::Cancelled { job_id, .. } => assert_eq!(job_id, "a"),
            other => panic!("expected a cancelled, got {other:?}"),
        }
        // A job held when the worker is closed is reported lost (to be requeued).
        take_one(&dispatcher, &worker, "c").await;
        assert_eq!(worker.load(), 1);
        worker.close().await;
        match next_job_event(&mut events).await {
            Event::WorkerLost {
                worker_id,
                running_job_ids,
            } => {
                assert_eq!(worker_id, "wk_2");
                assert_eq!(running_job_ids, vec!["c".to_string()]);
            }
            other => panic!("expected the worker lost, got {other:?}"),
        }
        assert!(worker.is_closed());
        assert!(worker.take(1, Duration::from_millis(1)).await.is_err());
    }
}
