//! `gantry`: runs the platform and administers users and API keys.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gantry_api::{Application, Settings, connect_database};
use gantry_auth::{AuthError, AuthService, ScopeSet, UserLimits, parse_duration};

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
    /// Run the whole platform in one process.
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Manage users.
    #[command(subcommand)]
    Users(UsersCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
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
    init_tracing(&settings.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("gantry: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("gantry: {err}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

async fn run(command: Command, settings: Settings) -> CliResult {
    match command {
        Command::Serve => serve(settings).await,
        Command::Migrate => {
            connect_database(&settings).await?;
            eprintln!("migrations applied");
            Ok(())
        }
        Command::Users(cmd) => users(cmd, auth_service(&settings).await?).await,
        Command::Keys(cmd) => keys(cmd, auth_service(&settings).await?).await,
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
    let app = Application::build(settings).await?;
    bootstrap_admin(&app.state().auth).await?;
    // Listen for signals before announcing readiness, so an early SIGTERM is graceful too.
    let signal = shutdown_signal()?;
    let handles = app.handles();
    tokio::spawn(async move {
        signal.await;
        tracing::info!("shutting down: finishing in-flight requests");
        for handle in handles {
            handle.stop(true).await;
        }
    });
    tracing::info!(
        management = %app.management_addr(),
        public = %app.public_addr(),
        "gantry is serving"
    );
    app.run_until_stopped().await?;
    Ok(())
}

/// On a first start with no users, create an admin and print one all-scopes key, once.
async fn bootstrap_admin(auth: &AuthService) -> CliResult {
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
    println!(
        "Created the first user, {email}, with an API key that has every scope.\n\
         It is shown only this once; store it now:\n\n    {key}\n",
        email = user.email,
        key = issued.key.expose()
    );
    Ok(())
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

async fn users(cmd: UsersCommand, auth: AuthService) -> CliResult {
    match cmd {
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
                    "{:<22} {:<14} {:<8} {:<12} {:<12} {:<12} {}",
                    key.id,
                    format!("{}…{}", key.prefix, key.last_four),
                    state,
                    key.created_at,
                    key.expires_at.map(|t| t.to_string()).unwrap_or_else(|| "never".into()),
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
