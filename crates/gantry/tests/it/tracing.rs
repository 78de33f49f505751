//! Traces over OTLP: real `gantry` processes export their spans to an OTLP
//! (gRPC) receiver started here, and one trace follows a job from the HTTP
//! request (whose W3C `traceparent` is honoured) through the submit, the
//! scheduler's assignment, the worker's run and the settlement, across
//! processes. The batch exporter's delay is a minute, so the spans arrive
//! only because each process flushes them when it stops (SIGTERM).

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_testkit::PgDatabase;

use crate::processes::{Proc, log_field};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value;
use serde_json::{Value, json};

/// The bound of every wait in this module.
const WAIT: Duration = Duration::from_secs(30);
const WORKER_SECRET: &str = "tracing-test-worker-secret-0123456789";

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// Trace ids of the spans this one links to.
    links: Vec<String>,
    /// The span's attributes that are numbers, by key.
    numbers: Vec<(String, f64)>,
}

/// An OTLP trace receiver on 127.0.0.1 keeping every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| match attribute.value.as_ref()?.value.as_ref()? {
                    any_value::Value::StringValue(name) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
                spans.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    links: span.links.iter().map(|link| hex(&link.trace_id)).collect(),
                    numbers: span
                        .attributes
                        .iter()
                        .filter_map(|a| match a.value.as_ref()?.value.as_ref()? {
                            any_value::Value::DoubleValue(v) => Some((a.key.clone(), *v)),
                            any_value::Value::IntValue(v) => Some((a.key.clone(), *v as f64)),
                            _ => None,
                        })
                        .collect(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Starts the receiver; returns it and its `http://127.0.0.1:port`.
    async fn start() -> (Receiver, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("local addr"));
        let receiver = Receiver::default();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming_shutdown(
            service,
            tonic::transport::server::TcpIncoming::from(listener),
            std::future::pending::<()>(),
        ));
        (receiver, endpoint)
    }

    /// The spans of trace `trace_id` received so far.
    fn trace(&self, trace_id: &str) -> Vec<Received> {
        let spans = self.spans.lock().unwrap();
        spans.iter().filter(|span| span.trace_id == trace_id).cloned().collect()
    }

    /// Waits (bounded) until a span named `name` links to trace `trace_id`.
    async fn linking(&self, name: &str, trace_id: &str) -> Received {
        let started = Instant::now();
        loop {
            if let Some(span) = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .find(|span| span.name == name && span.links.iter().any(|t| t == trace_id))
            {
                return span.clone();
            }
            assert!(started.elapsed() < WAIT, "no {name} span links to trace {trace_id}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) until trace `trace_id` holds a span named `name` of
    /// each `(service, name)`; returns the trace.
    async fn until(&self, trace_id: &str, wanted: &[(&str, &str)]) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let trace = self.trace(trace_id);
            let have: BTreeSet<(&str, &str)> = trace
                .iter()
                .map(|span| (span.service.as_str(), span.name.as_str()))
                .collect();
            if wanted.iter().all(|want| have.contains(want)) {
                return trace;
            }
            assert!(
                started.elapsed() < WAIT,
                "trace {trace_id} lacks some of {wanted:?} after {WAIT:?}; it has {have:?}\nall spans: {:#?}",
                self.spans.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh trace id and a caller's span id in it, and their `traceparent`
/// (sampled).
fn caller_context() -> (String, String, String) {
    let trace_id = format!("{:016x}{:016x}", 0x7ace_u64, crate::harness::unique());
    let span_id = format!("{:016x}", 0x00ca_11e7_u64 ^ crate::harness::unique());
    let traceparent = format!("00-{trace_id}-{span_id}-01");
    (trace_id, span_id, traceparent)
}

/// The settings every process of a test shares: its own data directory,
/// ports chosen by the system, and traces sent to `endpoint`.
struct Deployment {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Deployment {
    fn new(endpoint: &str, database_url: Option<&str>) -> Deployment {
        let mut env: Vec<(String, String)> = [
            ("GANTRY_SCHEDULER__WORKER_SECRET", WORKER_SECRET),
            ("GANTRY_MANAGEMENT_ADDR", "127.0.0.1:0"),
            ("GANTRY_PUBLIC_ADDR", "127.0.0.1:0"),
            ("GANTRY_SCHEDULER__ADDR", "127.0.0.1:0"),
            ("GANTRY_HTTP__WORKERS", "1"),
            ("GANTRY_DATABASE_MAX_CONNECTIONS", "4"),
            ("GANTRY_LOG", "info"),
            ("GANTRY_SCHEDULER__BUNDLED_WORKERS", "[gantry-echo]"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            // Exported on shutdown only: what arrives was flushed at exit.
            ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(url) = database_url {
            env.push(("GANTRY_DATABASE_URL".into(), url.into()));
        }
        Deployment {
            dir: tempfile::tempdir().expect("temp dir"),
            env,
        }
    }

    /// The `gantry` binary with these settings and no inherited `GANTRY_*`/`OTEL_*`.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
        command.args(args).current_dir(self.dir.path());
        for (key, _) in std::env::vars_os() {
            let key_text = key.to_string_lossy();
            if key_text.starts_with("GANTRY_") || key_text.starts_with("OTEL_") {
                command.env_remove(key);
            }
        }
        command
            .env_remove("RUST_LOG")
            .env("GANTRY_DATA_DIR", self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// A user with credit and an `endpoints:run` key, made with the CLI (which also
    /// applies the migrations).
    fn user_key(&self) -> String {
        let email = format!("traces{}@example.test", crate::harness::unique());
        for args in [
            vec!["users", "create", email.as_str()],
            vec!["users", "set-limits", email.as_str(), "--exempt"],
            vec!["users", "add-credit", email.as_str(), "10"],
        ] {
            let output = self.command(&args).stdin(Stdio::null()).output().expect("run gantry");
            assert!(
                output.status.success(),
                "gantry {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let output = self
            .command(&["keys", "create", "--user", &email, "--scopes", "endpoints:run"])
            .stdin(Stdio::null())
            .output()
            .expect("run gantry");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let key = String::from_utf8(output.stdout).expect("utf-8").trim().to_string();
        assert!(key.starts_with("gk_"), "a key: {key:?}");
        key
    }

    fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        Proc::spawn(name, self.command(args))
    }
}

/// `POST /v2/gantry-echo/runsync` with the caller's `traceparent`; returns the job.
async fn runsync(public: &str, key: &str, traceparent: &str) -> Value {
    let response = crate::harness::http_client(WAIT)
        .post(format!("{public}/v2/gantry-echo/runsync?wait=30000"))
        .bearer_auth(key)
        .header("traceparent", traceparent)
        .json(&json!({ "input": { "n": "traced" } }))
        .send()
        .await
        .expect("runsync");
    assert_eq!(response.status(), 200);
    let job: Value = response.json().await.expect("a JSON job");
    assert_eq!(job["status"], "COMPLETED", "{job}");
    job
}

/// The span named `name` of `service` in `trace`.
fn span<'t>(trace: &'t [Received], service: &str, name: &str) -> &'t Received {
    trace
        .iter()
        .find(|span| span.service == service && span.name == name)
        .unwrap_or_else(|| panic!("no {service} span {name} in {trace:#?}"))
}

/// The request's span continues the caller's, and every span of the job
/// descends from it, in whichever process it was made.
fn assert_one_tree(trace: &[Received], caller_span_id: &str, request: &Received) {
    assert_eq!(
        request.parent_span_id, caller_span_id,
        "the request span's parent is the caller's span: {trace:#?}"
    );
    for span in trace {
        let mut at = span;
        let mut hops = 0;
        while at.span_id != request.span_id {
            at = trace
                .iter()
                .find(|parent| parent.span_id == at.parent_span_id)
                .unwrap_or_else(|| panic!("span {span:?} does not descend from the request: {trace:#?}"));
            hops += 1;
            assert!(hops < 64, "a cycle in {trace:#?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_exports_the_request_and_its_job_in_the_callers_trace() {
    let (receiver, endpoint) = Receiver::start().await;
    let deployment = Deployment::new(&endpoint, None);
    let key = deployment.user_key();
    let mut serve = deployment.spawn("serve", &["serve"]);
    let public = format!(
        "http://{}",
        log_field(&serve.wait_for_log("gantry is serving").await, "public")
    );
    let (trace_id, caller_span_id, traceparent) = caller_context();
    runsync(&public, &key, &traceparent).await;
    serve.stop().await;

    let trace = receiver
        .until(
            &trace_id,
            &[
                ("gantry", "POST /v2/{model_id}/runsync"),
                ("gantry", "job.submit"),
                ("gantry", "job.run"),
                ("gantry", "job.settle"),
            ],
        )
        .await;
    let request = span(&trace, "gantry", "POST /v2/{model_id}/runsync");
    assert_one_tree(&trace, &caller_span_id, request);
    // The job's settlement carries what the worker reported of its run.
    let settle = span(&trace, "gantry", "job.settle");
    for key in ["worker.queue_ms", "worker.load_ms", "worker.run_ms"] {
        assert!(
            settle.numbers.iter().any(|(k, v)| k == key && *v >= 0.0),
            "{key} missing: {settle:?}"
        );
    }
    assert!(
        settle.numbers.iter().any(|(k, v)| k == "worker.run_ms" && *v > 0.0),
        "{settle:?}"
    );
    // The settlement batch that committed the job is a trace of its own,
    // linked to the job's.
    let batch = receiver.linking("settlement", &trace_id).await;
    assert_ne!(batch.trace_id, trace_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_job_through_the_api_scheduler_and_worker_processes() {
    let (receiver, endpoint) = Receiver::start().await;
    let db = PgDatabase::create().await;
    let deployment = Deployment::new(&endpoint, Some(&db.url));
    let key = deployment.user_key();
    let (mut api, mut scheduler) = (
        deployment.spawn("api", &["api"]),
        deployment.spawn("scheduler", &["scheduler"]),
    );
    let public = format!(
        "http://{}",
        log_field(&api.wait_for_log("gantry api is serving").await, "public")
    );
    let scheduler_url = format!(
        "http://{}",
        log_field(
            &scheduler.wait_for_log("scheduler is listening for workers").await,
            "scheduler"
        )
    );
    let mut worker = deployment.spawn(
        "worker",
        &[
            "worker",
            "--model",
            "gantry-echo",
            "--scheduler",
            &scheduler_url,
            "--slots",
            "1",
            "--id",
            "traced-worker",
        ],
    );
    log_field(&worker.wait_for_log(": connected to the scheduler").await, "worker_id");

    let (trace_id, caller_span_id, traceparent) = caller_context();
    let job = runsync(&public, &key, &traceparent).await;
    assert_eq!(job["workerId"], "traced-worker", "{job}");
    for proc in [&mut worker, &mut scheduler, &mut api] {
        proc.stop().await;
    }

    let trace = receiver
        .until(
            &trace_id,
            &[
                ("gantry-api", "POST /v2/{model_id}/runsync"),
                ("gantry-api", "job.submit"),
                ("gantry-scheduler", "job.assign"),
                ("gantry-worker-sdk", "job.run"),
                ("gantry-scheduler", "job.settle"),
            ],
        )
        .await;
    let services: BTreeSet<&str> = trace.iter().map(|span| span.service.as_str()).collect();
    assert_eq!(
        services,
        BTreeSet::from(["gantry-api", "gantry-scheduler", "gantry-worker-sdk"]),
        "{trace:#?}"
    );
    let request = span(&trace, "gantry-api", "POST /v2/{model_id}/runsync");
    assert_one_tree(&trace, &caller_span_id, request);
    // The worker's run is a child of the scheduler's assignment.
    let assign = span(&trace, "gantry-scheduler", "job.assign");
    assert_eq!(
        span(&trace, "gantry-worker-sdk", "job.run").parent_span_id,
        assign.span_id
    );
}
