use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::middleware::ErrorHandlers;
use actix_web::{App, HttpServer, web};
use gantry_catalog::ModelCatalog;
use gantry_dispatch::Dispatcher;
use gantry_ratelimit::Policy;

use crate::connection::ProblemIo;
use crate::middleware::ensure_problem;
use crate::routes::{self, Endpoint};
use crate::state::{AppState, Services, Surface};

/// How the two listeners behave.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Listen address of the management REST API.
    pub management_addr: String,
    /// Listen address of the public model endpoints.
    pub public_addr: String,
    /// Largest request body accepted.
    pub body_limit: usize,
    /// How long a request body may take to arrive (408 after it).
    pub body_timeout: Duration,
    /// How long a request head (request line and header fields) may take to
    /// arrive on a new connection (408 after it).
    pub head_timeout: Duration,
    /// HTTP worker threads per listener.
    pub workers: usize,
    /// Default quotas of each listener (users can have their own).
    pub management_policy: Policy,
    pub public_policy: Policy,
}

/// Why a listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The running HTTP side: both listeners, started by `start`.
pub struct Application {
    state: web::Data<AppState>,
    management_addr: SocketAddr,
    public_addr: SocketAddr,
    servers: Vec<actix_web::dev::Server>,
    handles: Vec<ServerHandle>,
}

impl Application {
    /// Binds both listeners and serves `services` on them.
    pub fn start(services: Services, http: HttpConfig) -> Result<Self, ListenError> {
        // A JSON value always renders.
        let openapi = crate::openapi::openapi_json().to_string();
        let openapi_public = crate::openapi::public_openapi_json_with(services.manifest).to_string();
        let files = services.files.clone();
        let state = web::Data::new(AppState {
            body_limit: http.body_limit,
            body_timeout: http.body_timeout.max(Duration::from_millis(1)),
            policies: (http.management_policy, http.public_policy),
            openapi: openapi.into(),
            openapi_public: openapi_public.into(),
            public_origin: std::sync::OnceLock::new(),
            services,
        });
        let workers = http.workers.max(1);
        let (management, management_addr) = serve(
            &http.management_addr,
            state.clone(),
            Surface::Management,
            workers,
            http.head_timeout,
        )?;
        let (public, public_addr) = serve(
            &http.public_addr,
            state.clone(),
            Surface::Public,
            workers,
            http.head_timeout,
        )?;
        if let Some(files) = &files {
            files.listening_at(public_addr);
        }
        let _ = state.public_origin.set(format!("http://{public_addr}"));
        Ok(Self {
            handles: vec![management.handle(), public.handle()],
            servers: vec![management, public],
            state,
            management_addr,
            public_addr,
        })
    }

    pub fn management_addr(&self) -> SocketAddr {
        self.management_addr
    }

    pub fn public_addr(&self) -> SocketAddr {
        self.public_addr
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Handles that stop the listeners gracefully.
    pub fn handles(&self) -> Vec<ServerHandle> {
        self.handles.clone()
    }

    /// Serves until both listeners stop (see `handles`).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let results = futures_util::future::join_all(self.servers).await;
        results.into_iter().collect()
    }
}

fn serve(
    addr: &str,
    state: web::Data<AppState>,
    surface: Surface,
    workers: usize,
    head_timeout: Duration,
) -> Result<(actix_web::dev::Server, SocketAddr), ListenError> {
    let bind_err = |source| ListenError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(bind_err)?;
    let local = listener.local_addr()?;
    let console = surface == Surface::Management && state.console.enabled;
    let endpoints: Arc<Vec<Endpoint>> = Arc::new(match surface {
        Surface::Management => routes::management_endpoints(),
        Surface::Public => {
            let mut all = routes::public_endpoints();
            all.extend(routes::worker_protocol_endpoints());
            all
        }
    });
    // Built from actix's parts rather than `HttpServer`, to put `ProblemIo`
    // between the socket and the HTTP/1 dispatcher (see `connection.rs`).
    let builder = actix_server::Server::build();
    let shutdown = builder.graceful_shutdown_signal();
    let server = builder
        .workers(workers)
        .disable_signals()
        .shutdown_timeout(10)
        .listen(format!("gantry-{surface:?}-{local}"), listener, move || {
            let endpoints = endpoints.clone();
            let app = App::new()
                .app_data(state.clone())
                .app_data(surface)
                .wrap(actix_web::middleware::from_fn(crate::middleware::refuse_nul_in_path))
                .wrap(ErrorHandlers::new().default_handler(ensure_problem))
                .wrap(actix_web::middleware::from_fn(crate::middleware::observe))
                .configure(move |cfg| {
                    if console {
                        crate::console::register(cfg, &endpoints, &routes::public_endpoints());
                    }
                    routes::register(cfg, &endpoints);
                })
                .default_service(web::to(routes::not_found));
            let shutdown = shutdown.clone();
            let http = actix_http::HttpService::build()
                .graceful_shutdown_signal(move || {
                    let shutdown = shutdown.clone();
                    async move { shutdown.notified().await }
                })
                .keep_alive(actix_http::KeepAlive::Timeout(Duration::from_secs(5)))
                .client_request_timeout(head_timeout)
                .client_disconnect_timeout(Duration::from_secs(1))
                .local_addr(local)
                .h1(actix_service::map_config(
                    actix_service::IntoServiceFactory::into_factory(app),
                    |_| actix_web::dev::AppConfig::default(),
                ));
            use actix_service::ServiceFactoryExt as _;
            actix_service::fn_service(|io: tokio::net::TcpStream| async move {
                let peer = io.peer_addr().ok();
                let _ = io.set_nodelay(true);
                Ok::<_, actix_http::error::DispatchError>((ProblemIo::new(io), peer))
            })
            .and_then(http)
        })
        .map_err(bind_err)?
        .run();
    Ok((server, local))
}

/// A listener that serves only `GET /metrics`, for the roles without HTTP
/// listeners of their own (`gantry scheduler`): `metrics_addr`.
pub fn metrics_server(
    addr: &str,
    census: gantry_jobs::Census,
    models: Arc<ModelCatalog>,
    dispatcher: Option<Dispatcher>,
) -> Result<(actix_web::dev::Server, SocketAddr), ListenError> {
    let bind_err = |source| ListenError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(bind_err)?;
    let local = listener.local_addr()?;
    let server = HttpServer::new(move || {
        let (census, models, dispatcher) = (census.clone(), models.clone(), dispatcher.clone());
        App::new().route(
            "/metrics",
            web::get().to(move || {
                let (census, models, dispatcher) = (census.clone(), models.clone(), dispatcher.clone());
                async move {
                    let ids: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
                    match gantry_jobs::render_metrics(&census, &ids, dispatcher.as_ref()).await {
                        Ok(text) => actix_web::HttpResponse::Ok()
                            .content_type(gantry_telemetry::CONTENT_TYPE)
                            .body(text),
                        Err(error) => {
                            tracing::warn!(%error, "metrics could not be read");
                            actix_web::HttpResponse::ServiceUnavailable().finish()
                        }
                    }
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .map_err(bind_err)?
    .run();
    Ok((server, local))
}

/// `GET /metrics` of a process without a database (`gantry worker`): what
/// this process observed itself (its workers' jobs, run times and slots).
pub fn process_metrics_server(addr: &str) -> Result<(actix_web::dev::Server, SocketAddr), ListenError> {
    let bind_err = |source| ListenError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(bind_err)?;
    let local = listener.local_addr()?;
    let server = HttpServer::new(|| {
        App::new().route(
            "/metrics",
            web::get().to(|| async {
                let mut out = gantry_telemetry::Exposition::new();
                gantry_telemetry::metrics().write(&mut out);
                actix_web::HttpResponse::Ok()
                    .content_type(gantry_telemetry::CONTENT_TYPE)
                    .body(out.finish())
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .map_err(bind_err)?
    .run();
    Ok((server, local))
}
