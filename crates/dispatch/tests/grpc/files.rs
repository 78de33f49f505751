//! Output files on the worker stream: chunks reach the sink in order, the
//! result carries the stored files, and files of attempts that do not
//! succeed are discarded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gantry_dispatch::{Assignment, Event, FileSink, FileUpload, StoredFile};
use gantry_worker_sdk::{FILE_CHUNK_BYTES, JobContext, JobError, Model, Output, Usage};
use serde_json::{Value, json};

use crate::harness::{Server, Worker, config, worker_config};

/// Keeps files in memory: what the sink interface sees, nothing more.
#[derive(Default, Clone)]
struct MemorySink {
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    /// (key, number of writes) of every finished file.
    writes: Arc<Mutex<Vec<(String, usize)>>>,
}

struct MemoryUpload {
    sink: MemorySink,
    key: String,
    media_type: String,
    data: Vec<u8>,
    writes: usize,
}

#[gantry_dispatch::async_trait]
impl FileSink for MemorySink {
    async fn begin(
        &self,
        job_id: &str,
        attempt: u32,
        file_id: u32,
        media_type: &str,
    ) -> Result<Box<dyn FileUpload>, String> {
        Ok(Box::new(MemoryUpload {
            sink: self.clone(),
            key: format!("{job_id}/{attempt}/{file_id}"),
            media_type: media_type.to_owned(),
            data: Vec::new(),
            writes: 0,
        }))
    }

    async fn discard(&self, files: Vec<StoredFile>) {
        let mut stored = self.files.lock().unwrap();
        for file in files {
            stored.remove(&file.key);
        }
    }
}

#[gantry_dispatch::async_trait]
impl FileUpload for MemoryUpload {
    async fn write(&mut self, data: Vec<u8>) -> Result<(), String> {
        self.writes += 1;
        self.data.extend(data);
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<StoredFile, String> {
        let size = self.data.len() as u64;
        self.sink.writes.lock().unwrap().push((self.key.clone(), self.writes));
        self.sink.files.lock().unwrap().insert(self.key.clone(), self.data);
        Ok(StoredFile {
            pointer: String::new(),
            key: self.key,
            media_type: self.media_type,
            size,
            created_ms: 1,
        })
    }

    async fn abort(self: Box<Self>) {}
}

/// Sends the files the input asks for (`{"sizes": [..], "fail": bool}`).
struct Painter;

impl Model for Painter {
    fn id(&self) -> &str {
        "painter"
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let sizes: Vec<usize> = serde_json::from_value(input["sizes"].clone()).unwrap_or_default();
        for (i, size) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..*size).map(|b| (b % 251) as u8).collect();
            ctx.put_file(&format!("/images/{i}"), "image/png", &data).await?;
        }
        if input["fail"] == true {
            return Err(JobError::bad_input("failed after the files"));
        }
        Ok(Output::new(
            json!({"images": []}),
            Usage::whole("images", sizes.len() as u64),
        ))
    }
}

fn sink_config(sink: &MemorySink) -> gantry_dispatch::DispatchConfig {
    let mut config = config();
    config.files = Some(Arc::new(sink.clone()));
    config
}

#[tokio::test]
async fn files_arrive_in_chunks_and_come_with_the_result() {
    let sink = MemorySink::default();
    let mut server = Server::start_with(sink_config(&sink));
    let _worker = Worker::spawn(Painter, worker_config(&server.url(), "w-paint", 1));
    server.wait_capacity("painter").await;
    let big = FILE_CHUNK_BYTES * 2 + 17;
    let input = json!({"sizes": [big, 0]});
    server
        .dispatcher
        .assign(Assignment::new("job-f", 1, "painter", input))
        .unwrap();
    let Event::Completed { files, .. } = server.terminal("job-f").await else {
        panic!("expected Completed");
    };
    assert_eq!(files.len(), 2);
    assert_eq!((files[0].pointer.as_str(), files[0].size), ("/images/0", big as u64));
    assert_eq!((files[1].pointer.as_str(), files[1].size), ("/images/1", 0));
    assert_eq!(files[0].media_type, "image/png");
    let stored = sink.files.lock().unwrap().clone();
    let expected: Vec<u8> = (0..big).map(|b| (b % 251) as u8).collect();
    assert_eq!(stored["job-f/1/0"], expected);
    assert!(stored["job-f/1/1"].is_empty());
    // Three chunks for the big file (1 MiB, 1 MiB, 17 bytes), one for the empty one.
    let writes = sink.writes.lock().unwrap().clone();
    assert_eq!(writes, vec![("job-f/1/0".to_owned(), 3), ("job-f/1/1".to_owned(), 1)]);
}

#[tokio::test]
async fn files_of_a_failed_attempt_are_discarded() {
    let sink = MemorySink::default();
    let mut server = Server::start_with(sink_config(&sink));
    let _worker = Worker::spawn(Painter, worker_config(&server.url(), "w-fail", 1));
    server.wait_capacity("painter").await;
    server
        .dispatcher
        .assign(Assignment::new(
            "job-x",
            1,
            "painter",
            json!({"sizes": [10, 20], "fail": true}),
        ))
        .unwrap();
    assert!(matches!(
        server.terminal("job-x").await,
        Event::Failed { retryable: false, .. }
    ));
    assert!(sink.files.lock().unwrap().is_empty(), "discarded");
}

#[tokio::test]
async fn without_a_file_store_a_result_with_files_fails_retryably() {
    let mut server = Server::start();
    let _worker = Worker::spawn(Painter, worker_config(&server.url(), "w-none", 1));
    server.wait_capacity("painter").await;
    server
        .dispatcher
        .assign(Assignment::new("job-n", 1, "painter", json!({"sizes": [5]})))
        .unwrap();
    match server.terminal("job-n").await {
        Event::Failed { retryable, error, .. } => {
            assert!(retryable);
            assert!(error.contains("no file store"), "{error}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// Writes two files at once, piece by piece (`{"pieces": n}` pieces of
/// 100,000 bytes each), and begins a third that it drops unfinished after
/// its first chunk went out.
struct Weaver;

fn piece(file: u8, i: usize) -> Vec<u8> {
    (0..100_000).map(|b| ((b + i) % 241) as u8 ^ file).collect()
}

impl Model for Weaver {
    fn id(&self) -> &str {
        "weaver"
    }

    async fn run(&self, input: Value, ctx: JobContext) -> Result<Output, JobError> {
        let pieces = input["pieces"].as_u64().unwrap_or(0) as usize;
        let mut a = ctx.create_file("/a_url", "text/plain")?;
        let mut b = ctx.create_file("/b_url", "audio/wav")?;
        let mut dropped = ctx.create_file("/dropped_url", "text/plain")?;
        for i in 0..11 {
            dropped.write(&piece(9, i)).await?;
        }
        drop(dropped);
        for i in 0..pieces {
            a.write(&piece(1, i)).await?;
            b.write(&piece(2, i)).await?;
            assert_eq!(a.len(), 100_000 * (i as u64 + 1));
        }
        b.finish().await?;
        a.finish().await?;
        Ok(Output::new(json!({}), Usage::whole("files", 2)))
    }
}

#[tokio::test]
async fn files_written_piece_by_piece_stream_in_whole_chunks() {
    let sink = MemorySink::default();
    let mut server = Server::start_with(sink_config(&sink));
    let _worker = Worker::spawn(Weaver, worker_config(&server.url(), "w-weave", 1));
    server.wait_capacity("weaver").await;
    server
        .dispatcher
        .assign(Assignment::new("job-w", 1, "weaver", json!({"pieces": 25})))
        .unwrap();
    let Event::Completed { files, .. } = server.terminal("job-w").await else {
        panic!("expected Completed");
    };
    // Only the finished files are in the result, in the order they were
    // finished; the dropped one is not, and nothing of it is kept.
    let listed: Vec<(&str, u64, &str)> = files
        .iter()
        .map(|f| (f.pointer.as_str(), f.size, f.media_type.as_str()))
        .collect();
    assert_eq!(
        listed,
        vec![("/b_url", 2_500_000, "audio/wav"), ("/a_url", 2_500_000, "text/plain")]
    );
    let stored = sink.files.lock().unwrap().clone();
    assert_eq!(stored.len(), 2, "{:?}", stored.keys());
    for (file, key) in [(1u8, "job-w/1/0"), (2, "job-w/1/1")] {
        let expected: Vec<u8> = (0..25).flat_map(|i| piece(file, i)).collect();
        assert!(stored[key] == expected, "{key}");
    }
    // 2,500,000 bytes: two whole 1 MiB chunks, then the rest with `last`.
    let mut writes = sink.writes.lock().unwrap().clone();
    writes.sort();
    assert_eq!(writes, vec![("job-w/1/0".to_owned(), 3), ("job-w/1/1".to_owned(), 3)]);
}
