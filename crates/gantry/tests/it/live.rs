//! Live streaming: chunks reach SSE readers as workers send them, not when
//! they are stored, and every reader (late, or resuming) still gets each
//! chunk once and in order.
use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, DatabaseTransaction, TransactionTrait};
use serde_json::{Value, json};

use crate::harness::{Backend, Event, SseReader, TestApp};

gantry_testkit::on_both_backends!(
    chunks_reach_readers_while_the_database_cannot_store_them,
    late_and_resuming_readers_get_every_chunk_once_in_order,
);

/// Holds a write lock on the job's chunk table until dropped (rolled back):
/// nothing the scheduler settles can be stored meanwhile, reads go on.
pub async fn block_chunk_writes(database_url: &str, backend: Backend) -> DatabaseTransaction {
    let db = Database::connect(database_url).await.unwrap();
    let tx = db.begin().await.unwrap();
    match backend {
        Backend::Postgres => tx.execute_unprepared("LOCK TABLE job_chunks IN EXCLUSIVE MODE").await,
        // A write statement takes SQLite's one write lock (WAL readers go on).
        Backend::Sqlite => tx.execute_unprepared("DELETE FROM job_chunks WHERE job_id = ''").await,
    }
    .unwrap();
    tx
}

/// While `lock` blocks chunk writes, reads chunks 0..`count` (and no final
/// status) from `reader`; then releases the lock and reads to the end of the
/// stream, which repeats no chunk and ends `COMPLETED`. Returns the chunk
/// events read under the lock.
pub async fn expect_chunks_before_they_are_stored(
    reader: &mut SseReader,
    lock: DatabaseTransaction,
    count: u64,
) -> Vec<Event> {
    let mut events = Vec::new();
    while (chunk_numbers(&events).len() as u64) < count {
        let event = reader.next(Duration::from_secs(3)).await.expect("the stream goes on");
        assert_ne!(event.1, "status", "the job cannot end before its chunks are stored");
        events.push(event);
    }
    assert_eq!(chunk_numbers(&events), (0..count).collect::<Vec<_>>());
    lock.rollback().await.expect("unlock");
    let rest = reader.rest(Duration::from_secs(20)).await;
    assert!(chunk_numbers(&rest).is_empty(), "no chunk twice: {rest:?}");
    let (_, name, last) = rest.last().expect("a final event");
    assert_eq!((name.as_str(), &last["status"]), ("status", &json!("COMPLETED")));
    events
}

/// Submits an echo job with `POST /run`; its id.
async fn run_echo(app: &TestApp, key: &str, input: Value) -> String {
    let queued: Value = app
        .submit("run", key, json!({ "input": input }))
        .await
        .json()
        .await
        .unwrap();
    queued["id"].as_str().unwrap().to_string()
}

fn chunk_numbers(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter(|(_, name, _)| name == "chunk")
        .map(|(_, _, data)| data["output"]["chunk"].as_u64().unwrap())
        .collect()
}

async fn chunks_reach_readers_while_the_database_cannot_store_them(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let id = &run_echo(
        &app,
        &key,
        json!({"sleep_ms": 1000, "stream": 3, "stream_interval_ms": 20}),
    )
    .await;
    let wait = Duration::from_secs(20);
    let mut reader = SseReader::open(&app, "gantry-echo", &key, id, None).await;
    // The worker's progress message: the job runs, and the reader has read
    // what the database held.
    let (_, name, data) = reader.next(wait).await.unwrap();
    assert_eq!(
        (name.as_str(), &data),
        ("progress", &json!({"progress": {"sleeping_ms": 1000}}))
    );
    // From now on no chunk can be stored until the lock is released, well
    // within SQLite's 5 s busy wait.
    let lock = block_chunk_writes(&app.database_url, backend).await;
    let events = expect_chunks_before_they_are_stored(&mut reader, lock, 3).await;
    let ids: Vec<Option<i64>> = events.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, vec![Some(0), Some(1), Some(2)]);
    // Stored all the same: a reader that resumes after chunk 0 reads the rest.
    let resumed = SseReader::open(&app, "gantry-echo", &key, id, Some(0))
        .await
        .rest(wait)
        .await;
    assert_eq!(chunk_numbers(&resumed), vec![1, 2]);
}

async fn late_and_resuming_readers_get_every_chunk_once_in_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let id = &run_echo(&app, &key, json!({"stream": 60, "stream_interval_ms": 5})).await;
    late_and_resuming_readers_agree(|last| SseReader::open(&app, "gantry-echo", &key, id, last), 60).await;
}

/// Follows a job that streams `count` chunks with a first reader; once that
/// one has 10, a late reader and one resuming after chunk 4 join (some of
/// what they need is stored, some is on its way to the database, the rest
/// comes live). Each gets its chunks once, in order, then `COMPLETED`.
pub async fn late_and_resuming_readers_agree<F, Fut>(open: F, count: u64)
where
    F: Fn(Option<i64>) -> Fut,
    Fut: std::future::Future<Output = SseReader>,
{
    let wait = Duration::from_secs(20);
    let mut first = open(None).await;
    let mut head = Vec::new();
    while chunk_numbers(&head).len() < 10 {
        head.push(first.next(wait).await.expect("the stream goes on"));
    }
    let (mut late, mut resuming) = (open(None).await, open(Some(4)).await);
    let (late, resuming, rest) = tokio::join!(late.rest(wait), resuming.rest(wait), first.rest(wait));
    head.extend(rest);
    for (events, from) in [(&head, 0), (&late, 0), (&resuming, 5)] {
        assert_eq!(
            chunk_numbers(events),
            (from..count).collect::<Vec<_>>(),
            "every chunk once, in order"
        );
        let (_, name, last) = events.last().unwrap();
        assert_eq!((name.as_str(), &last["status"]), ("status", &json!("COMPLETED")));
    }
}
