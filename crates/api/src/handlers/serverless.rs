//! A user's own containers: `/v2/templates`, `/v2/catalog/templates`,
//! `/v2/registries` and `/v2/serverless` (endpoints, their workers, worker
//! logs and releases). Desired state is written by `gantry_containers`; the
//! fleet of the scheduler process runs it.
use std::collections::BTreeMap;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_containers::{
    Container, CpuConfig, Endpoint, EndpointGpu, EndpointRecord, EndpointSpec, EndpointType, FlashBoot,
    PersistentMount, Registry, Release, RequestUrls, Scaling, Template, TemplateCategory, TemplateMounts, Workers,
    check_container, check_name, is_cuda_version,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::body::{Failures, RequestBody, present, present_object, read_body};
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::query::{self, Between, One, RequestQuery, Time, parse_query};
use crate::state::AppState;

/// Default container disk, GB.
const DEFAULT_DISK_GB: u32 = 20;

// --- request bodies -------------------------------------------------------

/// The container fields every create and update may carry.
#[derive(Default)]
pub struct ContainerFields {
    pub(crate) image: Option<String>,
    pub(crate) args: Option<String>,
    pub(crate) env: Option<BTreeMap<String, String>>,
    pub(crate) ports: Option<Vec<String>>,
    pub(crate) disk: Option<u32>,
    pub(crate) registry: Option<Option<String>>,
}

/// Declares a request body with the container fields besides its own (serde's
/// `flatten` cannot be combined with `deny_unknown_fields`), and `container()`
/// to take them out as [`ContainerFields`].
macro_rules! with_container_fields {
    ($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            /// Image reference: `[registry/]name[:tag][@digest]`.
            #[serde(default, deserialize_with = "present")]
            #[schema(nullable = false, min_length = 1, max_length = 512, example = "registry.example.com/team/worker:1")]
            image: Option<String>,
            /// Arguments of the entrypoint, split like a shell (quotes group; no expansion).
            #[serde(default, deserialize_with = "present")]
            #[schema(nullable = false, max_length = 8192)]
            args: Option<String>,
            /// Environment variables.
            #[serde(default, deserialize_with = "present")]
            #[schema(nullable = false)]
            env: Option<BTreeMap<String, String>>,
            /// Exposed ports as `port/protocol` (http, tcp, udp).
            #[serde(default, deserialize_with = "present")]
            #[schema(nullable = false, max_items = 32)]
            ports: Option<Vec<String>>,
            /// Container disk, GB (1 to 2048; default 20).
            #[serde(default, deserialize_with = "present")]
            #[schema(nullable = false, minimum = 1, maximum = 2048)]
            disk: Option<u32>,
            /// Registry credential id for a private image; `null` for none.
            #[serde(default)]
            #[schema(nullable = true)]
            registry: Option<Option<String>>,
            $($body)*
        }

        impl $name {
            fn container(&mut self) -> crate::handlers::serverless::ContainerFields {
                use crate::handlers::serverless::ContainerFields;
                ContainerFields {
                    image: self.image.take(),
                    args: self.args.take(),
                    env: self.env.take(),
                    ports: self.ports.take(),
                    disk: self.disk.take(),
                    registry: self.registry.take(),
                }
            }
        }
    };
}

pub(crate) use with_container_fields;

impl ContainerFields {
    /// Applies the fields present onto `base`.
    pub(crate) fn apply(self, base: &mut Container) {
        if let Some(image) = self.image {
            base.image = image;
        }
        if let Some(args) = self.args {
            base.args = args;
        }
        if let Some(env) = self.env {
            base.env = env;
        }
        if let Some(ports) = self.ports {
            base.ports = ports;
        }
        if let Some(disk) = self.disk {
            base.disk = disk;
        }
        if let Some(registry) = self.registry {
            base.registry = registry;
        }
    }
}

pub(crate) fn check_container_into(container: &Container, failures: &mut Failures) {
    for (field, problem) in check_container(container) {
        failures.fail(field, problem);
    }
}

fn check_cuda(versions: &[String], field: &str, failures: &mut Failures) {
    for version in versions {
        if !is_cuda_version(version) {
            failures.fail(field, format!("'{version}' is not a CUDA version (major.minor)"));
        }
    }
}

with_container_fields! {
/// A template to create.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTemplateRequest {
    #[schema(min_length = 1, max_length = 191, example = "my-worker")]
    name: String,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    mounts: Option<TemplateMounts>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = false)]
    public: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = false)]
    serverless: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    category: Option<TemplateCategory>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = true)]
    start_ssh: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = true)]
    start_jupyter: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    allowed_cuda_versions: Option<Vec<String>>,
}
}

impl RequestBody for CreateTemplateRequest {
    type Context = ();
    type Valid = Template;

    fn validate(mut self, _: &(), failures: &mut Failures) -> Option<Template> {
        if let Err(problem) = check_name(&self.name) {
            failures.fail("name", problem);
        }
        let fields = self.container();
        if fields.image.is_none() {
            failures.fail("image", "is required");
        }
        let mut container = empty_container();
        fields.apply(&mut container);
        check_container_into(&container, failures);
        let mounts = self.mounts.unwrap_or_default();
        check_mounts(&mounts, failures);
        let cuda = self.allowed_cuda_versions.unwrap_or_default();
        check_cuda(&cuda, "allowedCudaVersions", failures);
        Some(Template {
            id: String::new(),
            name: self.name,
            container,
            mounts,
            serverless: self.serverless.unwrap_or(false),
            public: self.public.unwrap_or(false),
            category: self.category.unwrap_or_default(),
            start_ssh: self.start_ssh.unwrap_or(true),
            start_jupyter: self.start_jupyter.unwrap_or(true),
            allowed_cuda_versions: cuda,
        })
    }
}

fn check_mounts(mounts: &TemplateMounts, failures: &mut Failures) {
    if let Some(PersistentMount { size, path }) = &mounts.persistent {
        if !(10..=4096).contains(size) {
            failures.fail(
                "mounts.persistent.size",
                format!("must be from 10 to 4096 GB (got {size})"),
            );
        }
        if !path.starts_with('/') || path.contains(['\0', '\n', ':']) || path.len() > 512 {
            failures.fail(
                "mounts.persistent.path",
                "must be an absolute path inside the container, without ':' or control characters",
            );
        }
    }
}

pub(crate) fn empty_container() -> Container {
    Container {
        image: String::new(),
        args: String::new(),
        env: BTreeMap::new(),
        ports: Vec::new(),
        disk: DEFAULT_DISK_GB,
        registry: None,
    }
}

with_container_fields! {
/// Only the fields present change; at least one is required.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(min_properties = 1)]
pub struct UpdateTemplateRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1, max_length = 191)]
    name: Option<String>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    mounts: Option<TemplateMounts>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    public: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    serverless: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    category: Option<TemplateCategory>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    start_ssh: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    start_jupyter: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    allowed_cuda_versions: Option<Vec<String>>,
}
}

/// A validated template update: applied onto the stored template.
pub struct TemplateUpdate(UpdateTemplateRequest);

impl RequestBody for UpdateTemplateRequest {
    const AT_LEAST_ONE_OF: &'static [&'static str] = &[
        "name",
        "image",
        "args",
        "env",
        "ports",
        "disk",
        "registry",
        "mounts",
        "public",
        "serverless",
        "category",
        "startSsh",
        "startJupyter",
        "allowedCudaVersions",
    ];
    type Context = ();
    type Valid = TemplateUpdate;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<TemplateUpdate> {
        if let Some(name) = &self.name
            && let Err(problem) = check_name(name)
        {
            failures.fail("name", problem);
        }
        if let Some(mounts) = &self.mounts {
            check_mounts(mounts, failures);
        }
        if let Some(cuda) = &self.allowed_cuda_versions {
            check_cuda(cuda, "allowedCudaVersions", failures);
        }
        Some(TemplateUpdate(self))
    }
}

impl TemplateUpdate {
    fn apply(self, template: &mut Template) {
        let mut update = self.0;
        let container = update.container();
        if let Some(name) = update.name {
            template.name = name;
        }
        container.apply(&mut template.container);
        if let Some(mounts) = update.mounts
            && mounts.persistent.is_some()
        {
            template.mounts = mounts;
        }
        macro_rules! set {
            ($($field:ident),*) => {$(if let Some(value) = update.$field { template.$field = value; })*};
        }
        set!(
            public,
            serverless,
            category,
            start_ssh,
            start_jupyter,
            allowed_cuda_versions
        );
    }
}

/// A registry credential to store.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRegistryRequest {
    #[schema(min_length = 1, max_length = 191, example = "my-private-registry")]
    name: String,
    /// Write-only: never returned.
    #[schema(min_length = 1, max_length = 1024)]
    username: String,
    /// Write-only: never returned or logged.
    #[schema(min_length = 1, max_length = 8192)]
    password: String,
}

pub struct NewRegistry {
    name: String,
    username: String,
    password: String,
}

impl RequestBody for CreateRegistryRequest {
    type Context = ();
    type Valid = NewRegistry;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<NewRegistry> {
        if let Err(problem) = check_name(&self.name) {
            failures.fail("name", problem);
        }
        for (field, value, most) in [("username", &self.username, 1024), ("password", &self.password, 8192)] {
            if value.is_empty() {
                failures.fail(field, "must not be empty");
            } else if value.len() > most {
                failures.fail(field, format!("must be at most {most} bytes"));
            } else if value.contains(['\0', '\n', '\r']) {
                failures.fail(field, "must not contain NUL or line breaks");
            }
        }
        Some(NewRegistry {
            name: self.name,
            username: self.username,
            password: self.password,
        })
    }
}

/// GPUs of each worker (create).
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuRequest {
    /// GPU pools (`pool` of `/v2/catalog/gpus`).
    #[schema(min_items = 1)]
    pools: Vec<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    excluded_types: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 8)]
    count: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    allowed_cuda_versions: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    min_cuda_version: Option<String>,
}

/// CPUs of each worker.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuRequest {
    /// CPU flavor (`id` of `/v2/catalog/cpus`).
    #[schema(min_length = 1)]
    id: String,
    /// vCPUs: a power of two in the flavor's range.
    #[schema(minimum = 2, maximum = 512)]
    vcpu_count: u32,
}

/// Worker counts; each field keeps its value (or default) when omitted.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkersRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 100)]
    min: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 0, maximum = 100)]
    max: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 3600)]
    idle_timeout: Option<u32>,
}

with_container_fields! {
/// A serverless endpoint to create.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateEndpointRequest {
    #[schema(min_length = 1, max_length = 191, example = "my-inference")]
    name: String,
    /// Only `QUEUE` endpoints are served (jobs through the queue).
    #[serde(rename = "type")]
    kind: EndpointType,
    scaling: Scaling,
    /// A serverless template (yours or a public one) whose container fields
    /// the body's own fields override (`env` merged per key, body winning).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1)]
    template_id: Option<String>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    gpu: Option<GpuRequest>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_items = 1, max_items = 8)]
    cpu: Option<Vec<CpuRequest>>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    workers: Option<WorkersRequest>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    data_center_ids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    network_volumes: Option<Vec<String>>,
    /// Per-job execution timeout, ms (default 300000).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 86400000)]
    timeout: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    flashboot: Option<FlashBoot>,
}
}

/// A create whose fields are each well formed; the rules that need the
/// catalog, the templates and the volumes run in [`finish_endpoint`].
pub struct EndpointDraft(CreateEndpointRequest);

impl RequestBody for CreateEndpointRequest {
    type Context = ();
    type Valid = EndpointDraft;

    fn validate(self, _: &(), _: &mut Failures) -> Option<EndpointDraft> {
        Some(EndpointDraft(self))
    }
}

with_container_fields! {
/// Only the fields present change; at least one is required.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(min_properties = 1)]
pub struct UpdateEndpointRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1, max_length = 191)]
    name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    scaling: Option<Scaling>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1)]
    template_id: Option<String>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    gpu: Option<GpuRequest>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_items = 1, max_items = 8)]
    cpu: Option<Vec<CpuRequest>>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false)]
    workers: Option<WorkersRequest>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    data_center_ids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    network_volumes: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 86400000)]
    timeout: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    flashboot: Option<FlashBoot>,
}
}

pub struct EndpointPatch(UpdateEndpointRequest);

impl RequestBody for UpdateEndpointRequest {
    const AT_LEAST_ONE_OF: &'static [&'static str] = &[
        "name",
        "scaling",
        "templateId",
        "image",
        "args",
        "env",
        "ports",
        "disk",
        "registry",
        "gpu",
        "cpu",
        "workers",
        "dataCenterIds",
        "networkVolumes",
        "timeout",
        "flashboot",
    ];
    type Context = ();
    type Valid = EndpointPatch;

    fn validate(self, _: &(), _: &mut Failures) -> Option<EndpointPatch> {
        Some(EndpointPatch(self))
    }
}

/// The parts of a create or an update, before they meet the stored state.
struct EndpointParts {
    name: Option<String>,
    kind: Option<EndpointType>,
    scaling: Option<Scaling>,
    template_id: Option<String>,
    container: ContainerFields,
    gpu: Option<GpuRequest>,
    cpu: Option<Vec<CpuRequest>>,
    workers: Option<WorkersRequest>,
    data_center_ids: Option<Vec<String>>,
    network_volumes: Option<Vec<String>>,
    timeout: Option<u64>,
    flashboot: Option<FlashBoot>,
}

impl From<CreateEndpointRequest> for EndpointParts {
    fn from(mut r: CreateEndpointRequest) -> Self {
        Self {
            container: r.container(),
            name: Some(r.name),
            kind: Some(r.kind),
            scaling: Some(r.scaling),
            template_id: r.template_id,
            gpu: r.gpu,
            cpu: r.cpu,
            workers: r.workers,
            data_center_ids: r.data_center_ids,
            network_volumes: r.network_volumes,
            timeout: r.timeout,
            flashboot: r.flashboot,
        }
    }
}

impl From<UpdateEndpointRequest> for EndpointParts {
    fn from(mut r: UpdateEndpointRequest) -> Self {
        Self {
            container: r.container(),
            name: r.name,
            kind: None,
            scaling: r.scaling,
            template_id: r.template_id,
            gpu: r.gpu,
            cpu: r.cpu,
            workers: r.workers,
            data_center_ids: r.data_center_ids,
            network_volumes: r.network_volumes,
            timeout: r.timeout,
            flashboot: r.flashboot,
        }
    }
}

/// Applies `parts` onto `base` (a new endpoint's defaults, or the stored
/// one) and checks the result against the catalog, the caller's templates,
/// registries and volumes: every failure at once (422), or the endpoint.
async fn finish_endpoint(
    state: &AppState,
    owner: &str,
    parts: EndpointParts,
    base: Option<EndpointSpec>,
) -> Result<EndpointSpec, ApiError> {
    let mut failures = Failures::default();
    let creating = base.is_none();
    let mut spec = base.unwrap_or_else(|| EndpointSpec {
        name: String::new(),
        kind: EndpointType::Queue,
        container: empty_container(),
        gpu: None,
        cpu: None,
        workers: Workers {
            min: 0,
            max: 3,
            idle_timeout: Some(5),
        },
        scaling: Scaling::QueueDelay { queue_delay: 4.0 },
        data_center_ids: Vec::new(),
        network_volumes: Vec::new(),
        timeout: 300_000,
        flashboot: FlashBoot::Off,
        template_id: None,
    });
    if let Some(name) = parts.name {
        if let Err(problem) = check_name(&name) {
            failures.fail("name", problem);
        }
        spec.name = name;
    }
    if let Some(kind) = parts.kind {
        if kind == EndpointType::LoadBalancer {
            failures.fail(
                "type",
                "LOAD_BALANCER endpoints are not served by this platform: use QUEUE (jobs through run/runsync)",
            );
        }
        spec.kind = kind;
    }
    // A template's container fields first; the body's own fields win.
    let image_given = parts.container.image.is_some();
    let registry_given = parts.container.registry.clone();
    let template_id = parts.template_id;
    if merge_container(
        state,
        owner,
        template_id.as_deref(),
        true,
        parts.container,
        &mut spec.container,
        &mut failures,
    )
    .await?
    .is_some()
    {
        spec.template_id = template_id;
    }
    if creating && !image_given && spec.container.image.is_empty() {
        failures.fail("image", "is required unless templateId names a template");
    }
    check_container_into(&spec.container, &mut failures);
    check_registry_into(state, owner, registry_given.flatten().as_deref(), &mut failures).await?;
    if let Some(scaling) = parts.scaling {
        match scaling {
            Scaling::QueueDelay { queue_delay } if !(0.5..=3600.0).contains(&queue_delay) => {
                failures.fail(
                    "scaling.queueDelay",
                    format!("must be from 0.5 to 3600 seconds (got {queue_delay})"),
                );
            }
            Scaling::RequestCount { request_count } if !(1..=10_000).contains(&request_count) => {
                failures.fail(
                    "scaling.requestCount",
                    format!("must be from 1 to 10000 (got {request_count})"),
                );
            }
            _ => {}
        }
        spec.scaling = scaling;
    }
    if let Some(workers) = parts.workers {
        spec.workers.min = workers.min.unwrap_or(spec.workers.min);
        spec.workers.max = workers.max.unwrap_or(spec.workers.max);
        if workers.idle_timeout.is_some() {
            spec.workers.idle_timeout = workers.idle_timeout;
        }
    }
    let Workers { min, max, idle_timeout } = spec.workers;
    if max > gantry_containers::WORKERS_MAX {
        failures.fail(
            "workers.max",
            format!("must be at most {} (got {max})", gantry_containers::WORKERS_MAX),
        );
    }
    if min > max {
        failures.fail("workers", format!("min ({min}) must not exceed max ({max})"));
    }
    if let Some(idle) = idle_timeout
        && !(1..=3600).contains(&idle)
    {
        failures.fail(
            "workers.idleTimeout",
            format!("must be from 1 to 3600 seconds (got {idle})"),
        );
    }
    if matches!(spec.scaling, Scaling::RequestCount { .. }) {
        // Not applicable to request-count scaling (as the reference has it).
        spec.workers.idle_timeout = None;
    } else if spec.workers.idle_timeout.is_none() {
        spec.workers.idle_timeout = Some(5);
    }
    match (parts.gpu, parts.cpu) {
        (Some(_), Some(_)) => failures.fail("", "give gpu or cpu, not both"),
        (Some(gpu), None) => {
            spec.gpu = check_gpu(state, gpu, &mut failures);
            spec.cpu = None;
        }
        (None, Some(cpu)) => {
            spec.cpu = check_cpu(state, cpu, &mut failures);
            spec.gpu = None;
        }
        (None, None) => {
            if spec.gpu.is_none() && spec.cpu.is_none() {
                spec.cpu = default_cpu(state);
            }
        }
    }
    if let Some(ids) = parts.data_center_ids {
        for id in &ids {
            if state.catalog.data_center(id).is_none() {
                failures.fail("dataCenterIds", format!("unknown data center '{id}'"));
            }
        }
        spec.data_center_ids = ids;
    }
    if let Some(ids) = parts.network_volumes {
        for id in &ids {
            if state.volumes.get(owner, id).await.is_err() {
                failures.fail("networkVolumes", format!("no network volume '{id}' of yours"));
            }
        }
        spec.network_volumes = ids;
    }
    if let Some(timeout) = parts.timeout {
        if !(1..=gantry_containers::TIMEOUT_MAX_MS).contains(&timeout) {
            failures.fail(
                "timeout",
                format!("must be from 1 to {} ms", gantry_containers::TIMEOUT_MAX_MS),
            );
        }
        spec.timeout = timeout;
    }
    if let Some(flashboot) = parts.flashboot {
        spec.flashboot = flashboot;
    }
    if failures.is_empty() {
        Ok(spec)
    } else {
        Err(failures.into_api_error())
    }
}

/// Applies a template (when `template_id` names one of the caller's, or a
/// public one, of the kind asked for) and then the body's `fields` onto
/// `container`: the body's fields win, and `env` is merged per key with the
/// body's values winning. Returns the template applied.
pub(crate) async fn merge_container(
    state: &AppState,
    owner: &str,
    template_id: Option<&str>,
    serverless: bool,
    fields: ContainerFields,
    container: &mut Container,
    failures: &mut Failures,
) -> Result<Option<Template>, ApiError> {
    let mut applied = None;
    if let Some(template_id) = template_id {
        match state.containers.usable_template(owner, template_id).await? {
            None => failures.fail("templateId", format!("no template '{template_id}' of yours or public")),
            Some(template) if template.serverless != serverless => failures.fail(
                "templateId",
                if serverless {
                    format!("template '{template_id}' is not a serverless template")
                } else {
                    format!("template '{template_id}' is a serverless template")
                },
            ),
            Some(template) => {
                *container = template.container.clone();
                applied = Some(template);
            }
        }
    }
    let template_env = container.env.clone();
    let body_env = fields.env.clone();
    fields.apply(container);
    if let (Some(_), Some(body_env)) = (&applied, body_env) {
        container.env = template_env;
        container.env.extend(body_env);
    }
    Ok(applied)
}

/// A registry credential named by a request must be one of the caller's.
pub(crate) async fn check_registry_into(
    state: &AppState,
    owner: &str,
    registry: Option<&str>,
    failures: &mut Failures,
) -> Result<(), ApiError> {
    if let Some(registry) = registry
        && !state.containers.registry_exists(owner, registry).await?
    {
        failures.fail("registry", format!("no registry credential '{registry}' of yours"));
    }
    Ok(())
}

fn check_gpu(state: &AppState, gpu: GpuRequest, failures: &mut Failures) -> Option<EndpointGpu> {
    if gpu.pools.is_empty() {
        failures.fail("gpu.pools", "must name at least one pool");
    }
    for pool in &gpu.pools {
        if !state.gpus.iter().any(|g| g.pool.as_deref() == Some(pool.as_str())) {
            failures.fail("gpu.pools", format!("unknown GPU pool '{pool}'"));
        }
    }
    let excluded: Vec<String> = gpu
        .excluded_types
        .unwrap_or_default()
        .iter()
        .map(|t| t.trim().to_owned())
        .collect();
    for id in &excluded {
        let in_pools = state
            .gpus
            .iter()
            .any(|g| &g.id == id && g.pool.as_ref().is_some_and(|p| gpu.pools.contains(p)));
        if !in_pools {
            failures.fail(
                "gpu.excludedTypes",
                format!("'{id}' is not a GPU type of the chosen pools"),
            );
        }
    }
    let count = gpu.count.unwrap_or(1);
    if !(1..=8).contains(&count) {
        failures.fail("gpu.count", format!("must be from 1 to 8 (got {count})"));
    }
    let allowed = gpu.allowed_cuda_versions.unwrap_or_default();
    check_cuda(&allowed, "gpu.allowedCudaVersions", failures);
    if let Some(min) = &gpu.min_cuda_version {
        if !is_cuda_version(min) {
            failures.fail(
                "gpu.minCudaVersion",
                format!("'{min}' is not a CUDA version (major.minor)"),
            );
        }
        if !allowed.is_empty() {
            failures.fail("gpu", "allowedCudaVersions and minCudaVersion exclude each other");
        }
    }
    Some(EndpointGpu {
        pools: gpu.pools,
        excluded_types: excluded,
        count,
        allowed_cuda_versions: allowed,
        min_cuda_version: gpu.min_cuda_version,
    })
}

fn check_cpu(state: &AppState, cpus: Vec<CpuRequest>, failures: &mut Failures) -> Option<Vec<CpuConfig>> {
    let mut out: Vec<CpuConfig> = Vec::new();
    for (i, cpu) in cpus.into_iter().enumerate() {
        let Some(flavor) = state.cpus.iter().find(|c| c.id == cpu.id) else {
            failures.fail(&format!("cpu[{i}].id"), format!("unknown CPU flavor '{}'", cpu.id));
            continue;
        };
        let n = cpu.vcpu_count;
        if !n.is_power_of_two() || n < flavor.vcpu.min.max(2) || n > flavor.vcpu.max {
            failures.fail(
                &format!("cpu[{i}].vcpuCount"),
                format!(
                    "must be a power of two from {} to {} for '{}' (got {n})",
                    flavor.vcpu.min.max(2),
                    flavor.vcpu.max,
                    flavor.id
                ),
            );
            continue;
        }
        let config = CpuConfig {
            memory: ((flavor.ram_gb_per_vcpu * f64::from(n)).round() as u32).max(1),
            id: cpu.id,
            vcpu_count: n,
        };
        if out.contains(&config) {
            failures.fail(&format!("cpu[{i}]"), "is listed twice");
        }
        out.push(config);
    }
    Some(out)
}

/// A CPU endpoint's compute when the request names none: the catalog's
/// first CPU flavor at its smallest power-of-two vCPU count.
fn default_cpu(state: &AppState) -> Option<Vec<CpuConfig>> {
    let flavor = state.cpus.first()?;
    let n = flavor.vcpu.min.max(2).next_power_of_two();
    Some(vec![CpuConfig {
        id: flavor.id.clone(),
        vcpu_count: n,
        memory: ((flavor.ram_gb_per_vcpu * f64::from(n)).round() as u32).max(1),
    }])
}

// --- responses ------------------------------------------------------------

#[derive(Serialize, ToSchema)]
pub struct ListTemplatesResponse {
    templates: Vec<Template>,
}

#[derive(Serialize, ToSchema)]
pub struct ListRegistriesResponse {
    registries: Vec<Registry>,
}

#[derive(Serialize, ToSchema)]
pub struct ListEndpointsResponse {
    endpoints: Vec<Endpoint>,
}

/// One worker of an endpoint.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerResponse {
    id: String,
    /// RUNNING (holds a job), IDLE (polling), INITIALIZING (not called in yet), THROTTLED (its Pod waits for a Kubernetes node with free GPUs) or UNHEALTHY (could not start).
    #[schema(example = "IDLE")]
    status: String,
    /// Runs an older configuration than the endpoint's (replaced once idle).
    is_stale: bool,
    version: u32,
    #[schema(minimum = 0)]
    gpu_count: u32,
    image: String,
    #[schema(minimum = 0)]
    uptime_seconds: u64,
    #[schema(format = DateTime)]
    started_at: String,
    /// Why it is unhealthy or throttled, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[derive(Serialize, ToSchema, Default)]
pub struct WorkerSummary {
    running: u32,
    idle: u32,
    initializing: u32,
    /// Workers that wait for GPUs: on Docker, those wanted and not started
    /// because the machine's GPUs are taken (or too few; not in `total`: they
    /// have no container); on Kubernetes, THROTTLED workers, whose Pods no
    /// node can take yet.
    throttled: u32,
    /// Why, while any wait: the GPU pool's words, or the Kubernetes
    /// scheduler's.
    #[serde(rename = "throttledReason", skip_serializing_if = "Option::is_none")]
    throttled_reason: Option<String>,
    unhealthy: u32,
    total: u32,
}

impl WorkerSummary {
    /// The endpoint's workers by status: those listed (`views`), and those
    /// its leader published as throttled without a container.
    pub(crate) fn of(endpoint: &EndpointRecord, views: &[gantry_containers::WorkerView]) -> WorkerSummary {
        let mut summary = WorkerSummary {
            throttled: endpoint.throttled,
            throttled_reason: endpoint.throttled_reason.clone().filter(|_| endpoint.throttled > 0),
            ..WorkerSummary::default()
        };
        for view in views {
            match view.status {
                "RUNNING" => summary.running += 1,
                "IDLE" => summary.idle += 1,
                "INITIALIZING" => summary.initializing += 1,
                "THROTTLED" => {
                    summary.throttled += 1;
                    if summary.throttled_reason.is_none() {
                        summary.throttled_reason.clone_from(&view.reason);
                    }
                }
                _ => summary.unhealthy += 1,
            }
            summary.total += 1;
        }
        summary
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListWorkersResponse {
    workers: Vec<WorkerResponse>,
    summary: WorkerSummary,
    endpoint_version: u32,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    in_progress: bool,
    workers_on_latest: u32,
    workers_total: u32,
    percent_on_latest: u32,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListReleasesResponse {
    releases: Vec<Release>,
    rollout: Rollout,
    endpoint_version: u32,
}

fn endpoint_view(state: &AppState, record: EndpointRecord) -> Endpoint {
    let spec = record.spec;
    Endpoint {
        request_urls: RequestUrls::under(&state.public_origin(), &record.id),
        id: record.id,
        name: spec.name,
        kind: spec.kind,
        container: spec.container,
        gpu: spec.gpu,
        cpu: spec.cpu,
        workers: spec.workers,
        scaling: spec.scaling,
        data_center_ids: spec.data_center_ids,
        network_volumes: spec.network_volumes,
        timeout: spec.timeout,
        flashboot: spec.flashboot,
        version: record.version,
        created_at: gantry_billing::history::format_rfc3339(record.created_at_ms),
    }
}

/// The routes that run containers answer 503 while no runtime answers.
pub(crate) fn require_runtime(state: &AppState) -> Result<(), ApiError> {
    match state.fleet.as_ref().and_then(|fleet| fleet.unavailable()) {
        Some(reason) => Err(ApiError::Unavailable(reason)),
        None => Ok(()),
    }
}

// --- templates ------------------------------------------------------------

#[utoipa::path(get, path = "/v2/templates", operation_id = "listTemplates", tag = "Templates",
    description = "The caller's templates, oldest first. Requires `endpoints:read`.",
    responses((status = 200, description = "OK", body = ListTemplatesResponse)))]
pub async fn list_templates(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let templates = state.containers.list_templates(caller.user_id()).await?;
    Ok(HttpResponse::Ok().json(ListTemplatesResponse { templates }))
}

#[utoipa::path(get, path = "/v2/catalog/templates", operation_id = "listCatalogTemplates", tag = "Templates",
    description = "Every user's public templates. Requires `catalog:read`.",
    responses((status = 200, description = "OK", body = ListTemplatesResponse)))]
pub async fn catalog_templates(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let templates = state.containers.public_templates().await?;
    Ok(HttpResponse::Ok().json(ListTemplatesResponse { templates }))
}

#[utoipa::path(post, path = "/v2/templates", operation_id = "createTemplate", tag = "Templates",
    description = "Creates a template: a reusable image, args, env, ports, disk and registry. `startSsh` and `startJupyter` default to true, `category` to NVIDIA. Requires `endpoints:write`.",
    request_body = CreateTemplateRequest,
    responses((status = 201, description = "Created", body = Template)))]
pub async fn create_template(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    let template = read_body::<CreateTemplateRequest>(&req, payload, state.body_limit, &()).await?;
    check_registry(&state, caller.user_id(), template.container.registry.as_deref()).await?;
    let template = state.containers.create_template(caller.user_id(), template).await?;
    Ok(HttpResponse::Created().json(template))
}

pub(crate) async fn check_registry(state: &AppState, owner: &str, registry: Option<&str>) -> Result<(), ApiError> {
    if let Some(id) = registry
        && !state.containers.registry_exists(owner, id).await?
    {
        return Err(ApiError::Unprocessable(vec![format!(
            "$.registry: no registry credential '{id}' of yours"
        )]));
    }
    Ok(())
}

#[utoipa::path(get, path = "/v2/templates/{id}", operation_id = "getTemplate", tag = "Templates",
    description = "One of the caller's templates. Requires `endpoints:read`.",
    params(("id" = String, Path, description = "Template id")),
    responses((status = 200, description = "OK", body = Template)))]
pub async fn get_template(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    Ok(HttpResponse::Ok().json(state.containers.get_template(caller.user_id(), &id).await?))
}

#[utoipa::path(patch, path = "/v2/templates/{id}", operation_id = "updateTemplate", tag = "Templates",
    description = "Changes the fields given. Endpoints made from the template keep what they were made with. Requires `endpoints:write`.",
    params(("id" = String, Path, description = "Template id")),
    request_body = UpdateTemplateRequest,
    responses((status = 200, description = "OK", body = Template)))]
pub async fn update_template(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    let update = read_body::<UpdateTemplateRequest>(&req, payload, state.body_limit, &()).await?;
    let mut template = state.containers.get_template(caller.user_id(), &id).await?;
    update.apply(&mut template);
    let mut failures = Failures::default();
    check_container_into(&template.container, &mut failures);
    if !failures.is_empty() {
        return Err(failures.into_api_error());
    }
    check_registry(&state, caller.user_id(), template.container.registry.as_deref()).await?;
    state.containers.update_template(caller.user_id(), &template).await?;
    Ok(HttpResponse::Ok().json(template))
}

#[utoipa::path(delete, path = "/v2/templates/{id}", operation_id = "deleteTemplate", tag = "Templates",
    description = "Deletes a template; one an endpoint was made from is in use (409). Requires `endpoints:write`.",
    params(("id" = String, Path, description = "Template id")),
    responses((status = 204, description = "Deleted. Response has no body."),
        (status = 409, description = "In use by an endpoint", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn delete_template(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    state.containers.delete_template(caller.user_id(), &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

// --- registries -----------------------------------------------------------

#[utoipa::path(get, path = "/v2/registries", operation_id = "listRegistries", tag = "Registries",
    description = "The caller's registry credentials (names only). Requires `endpoints:read`.",
    responses((status = 200, description = "OK", body = ListRegistriesResponse)))]
pub async fn list_registries(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let registries = state.containers.list_registries(caller.user_id()).await?;
    Ok(HttpResponse::Ok().json(ListRegistriesResponse { registries }))
}

#[utoipa::path(post, path = "/v2/registries", operation_id = "createRegistry", tag = "Registries",
    description = "Stores a registry credential for private images. The username and password are sealed at rest and never returned. Requires `endpoints:write`.",
    request_body = CreateRegistryRequest,
    responses((status = 201, description = "Created", body = Registry)))]
pub async fn create_registry(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    let new = read_body::<CreateRegistryRequest>(&req, payload, state.body_limit, &()).await?;
    let registry = state
        .containers
        .create_registry(caller.user_id(), &new.name, &new.username, &new.password)
        .await?;
    Ok(HttpResponse::Created().json(registry))
}

#[utoipa::path(get, path = "/v2/registries/{id}", operation_id = "getRegistry", tag = "Registries",
    description = "One registry credential (name only). Requires `endpoints:read`.",
    params(("id" = String, Path, description = "Registry credential id")),
    responses((status = 200, description = "OK", body = Registry)))]
pub async fn get_registry(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    Ok(HttpResponse::Ok().json(state.containers.get_registry(caller.user_id(), &id).await?))
}

#[utoipa::path(delete, path = "/v2/registries/{id}", operation_id = "deleteRegistry", tag = "Registries",
    description = "Deletes a registry credential; one an endpoint or template names is in use (409). Requires `endpoints:write`.",
    params(("id" = String, Path, description = "Registry credential id")),
    responses((status = 204, description = "Deleted. Response has no body."),
        (status = 409, description = "In use", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn delete_registry(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    state.containers.delete_registry(caller.user_id(), &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/v2/registries/delegations", operation_id = "listDelegations", tag = "Registries",
    description = "ECR delegations are not offered by this platform: always 501. Store a registry credential instead.",
    responses((status = 501, description = "Not offered", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn delegations(caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    Err(ApiError::NotImplemented(
        "ECR registry delegations are not offered by this platform; store a registry credential with POST /v2/registries".into(),
    ))
}

// --- endpoints ------------------------------------------------------------

#[utoipa::path(get, path = "/v2/serverless", operation_id = "listEndpoints", tag = "Serverless",
    description = "The caller's serverless endpoints, oldest first. Requires `endpoints:read`.",
    responses((status = 200, description = "OK", body = ListEndpointsResponse)))]
pub async fn list_endpoints(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let endpoints = state
        .containers
        .list_endpoints(caller.user_id())
        .await?
        .into_iter()
        .map(|record| endpoint_view(&state, record))
        .collect();
    Ok(HttpResponse::Ok().json(ListEndpointsResponse { endpoints }))
}

#[utoipa::path(post, path = "/v2/serverless", operation_id = "createEndpoint", tag = "Serverless",
    description = "Creates a serverless endpoint: workers from the image (or the template's) that take jobs from the queue, from `workers.min` to `workers.max` as the queue needs, each billed per second. Requires `endpoints:write`; 503 while no container runtime answers.",
    request_body = CreateEndpointRequest,
    responses((status = 201, description = "Created", body = Endpoint),
        (status = 503, description = "No container runtime", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn create_endpoint(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    let draft = read_body::<CreateEndpointRequest>(&req, payload, state.body_limit, &()).await?;
    require_runtime(&state)?;
    let spec = finish_endpoint(&state, caller.user_id(), draft.0.into(), None).await?;
    let record = state.containers.create_endpoint(caller.user_id(), spec).await?;
    poke(&state);
    Ok(HttpResponse::Created().json(endpoint_view(&state, record)))
}

pub(crate) fn poke(state: &AppState) {
    if let Some(fleet) = &state.fleet {
        fleet.poke();
    }
}

#[utoipa::path(get, path = "/v2/serverless/{id}", operation_id = "getEndpoint", tag = "Serverless",
    description = "One of the caller's endpoints. Requires `endpoints:read`.",
    params(("id" = String, Path, description = "Endpoint id")),
    responses((status = 200, description = "OK", body = Endpoint)))]
pub async fn get_endpoint(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let record = state.containers.get_endpoint(caller.user_id(), &id).await?;
    Ok(HttpResponse::Ok().json(endpoint_view(&state, record)))
}

#[utoipa::path(patch, path = "/v2/serverless/{id}", operation_id = "updateEndpoint", tag = "Serverless",
    description = "Changes the fields given. A change of image, args, env, ports, disk, registry, compute or volumes is a new release: new workers start on it and the older ones are replaced once idle, so no job is dropped. Requires `endpoints:write`.",
    params(("id" = String, Path, description = "Endpoint id")),
    request_body = UpdateEndpointRequest,
    responses((status = 200, description = "OK", body = Endpoint)))]
pub async fn update_endpoint(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    let patch = read_body::<UpdateEndpointRequest>(&req, payload, state.body_limit, &()).await?;
    let current = state.containers.get_endpoint(caller.user_id(), &id).await?;
    let spec = finish_endpoint(&state, caller.user_id(), patch.0.into(), Some(current.spec.clone())).await?;
    let record = state
        .containers
        .update_endpoint(caller.user_id(), &current, spec)
        .await?;
    poke(&state);
    Ok(HttpResponse::Ok().json(endpoint_view(&state, record)))
}

#[utoipa::path(delete, path = "/v2/serverless/{id}", operation_id = "deleteEndpoint", tag = "Serverless",
    description = "Deletes an endpoint: its queued jobs are removed, jobs already running finish on their workers, then the workers are removed (their time billed up to then). Requires `endpoints:write`.",
    params(("id" = String, Path, description = "Endpoint id")),
    responses((status = 204, description = "Deleted. Response has no body.")))]
pub async fn delete_endpoint(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsWrite)?;
    state.containers.delete_endpoint(caller.user_id(), &id).await?;
    state.jobs.purge_queue(caller.user_id(), &id).await?;
    poke(&state);
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/v2/serverless/{id}/workers", operation_id = "listEndpointWorkers", tag = "Serverless",
    description = "The endpoint's workers now, with a summary by status. Requires `endpoints:read`.",
    params(("id" = String, Path, description = "Endpoint id")),
    responses((status = 200, description = "OK", body = ListWorkersResponse)))]
pub async fn workers(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let endpoint = state.containers.get_endpoint(caller.user_id(), &id).await?;
    let views = match &state.fleet {
        Some(fleet) => fleet.worker_views(&endpoint.id).await?,
        None => Vec::new(),
    };
    let now = gantry_containers::service::now_ms();
    let summary = WorkerSummary::of(&endpoint, &views);
    let workers = views
        .into_iter()
        .map(|view| WorkerResponse {
            is_stale: view.version < endpoint.version,
            status: view.status.to_owned(),
            version: view.version,
            gpu_count: view.gpu_count,
            image: view.image,
            uptime_seconds: u64::try_from((now - view.started_at_ms).max(0) / 1000).unwrap_or(0),
            started_at: gantry_billing::history::format_rfc3339(view.started_at_ms),
            reason: view.reason,
            id: view.id,
        })
        .collect();
    Ok(HttpResponse::Ok().json(ListWorkersResponse {
        workers,
        summary,
        endpoint_version: endpoint.version,
    }))
}

#[utoipa::path(get, path = "/v2/serverless/{id}/releases", operation_id = "listEndpointReleases", tag = "Serverless",
    description = "Every configuration version of the endpoint, newest first, with what changed, and how far the rollout of the latest is. Requires `endpoints:read`.",
    params(("id" = String, Path, description = "Endpoint id")),
    responses((status = 200, description = "OK", body = ListReleasesResponse)))]
pub async fn releases(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let endpoint = state.containers.get_endpoint(caller.user_id(), &id).await?;
    let records = state.containers.releases(caller.user_id(), &id).await?;
    let open = state.containers.open_workers(&id).await?;
    let on = |version: u32| open.iter().filter(|w| w.version == version as i32).count() as u32;
    let total = open.len() as u32;
    let latest = on(endpoint.version);
    let releases = records
        .into_iter()
        .map(|r| Release {
            id: format!("{id}-v{}", r.version),
            version: r.version,
            source: "MANUAL".into(),
            created_by_user_id: r.created_by,
            worker_count: on(r.version),
            created_at: gantry_billing::history::format_rfc3339(r.created_at_ms),
            diff: r.diff,
        })
        .collect();
    Ok(HttpResponse::Ok().json(ListReleasesResponse {
        releases,
        rollout: Rollout {
            in_progress: latest < total,
            workers_on_latest: latest,
            workers_total: total,
            percent_on_latest: (latest * 100).checked_div(total).unwrap_or(100),
        },
        endpoint_version: endpoint.version,
    }))
}

/// Which lines a log shows.
#[derive(Deserialize, ToSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogSource {
    Container,
    System,
    All,
}

/// The query of a logs route.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogQuery {
    /// container, system or all
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    source: Option<One<LogSource>>,
    /// Lines to start with, 0 to 5000
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    tail: Option<Between<0, 5000>>,
    /// Only lines after this time (RFC 3339)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    since: Option<Time>,
    /// Keep streaming new lines
    #[serde(default, deserialize_with = "query::value")]
    follow: Option<bool>,
}

impl RequestQuery for LogQuery {
    type Valid = Self;

    fn validate(self, _: &mut Vec<String>) -> Option<Self> {
        Some(self)
    }
}

/// One log line as the SSE `data` carries it.
#[derive(Serialize)]
struct LogEvent<'a> {
    source: &'a str,
    line: &'a str,
    ts: String,
}

#[utoipa::path(get, path = "/v2/serverless/{id}/workers/{workerId}/logs", operation_id = "getWorkerLogs", tag = "Serverless",
    description = "A worker's logs as Server-Sent Events: `data: {source, line, ts}` with the line's time as the event id, so `Last-Event-ID` resumes after it. `source` is `container` (stdout and stderr), `system` (why the worker started or ended) or `all` (default); `tail` (0 to 5000, default 100) lines first, or those after `since` (RFC 3339); `follow=true` keeps the stream open while the container runs. Requires `endpoints:read`.",
    params(("id" = String, Path, description = "Endpoint id"), ("workerId" = String, Path, description = "Worker id"),
        LogQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, description = "The log as Server-Sent Events", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad query parameters or Last-Event-ID, every failure listed", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "No container runtime", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn worker_logs(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::EndpointsRead)?;
    let (endpoint_id, worker_id) = path.into_inner();
    let query = LogRequest::parse(&req)?;
    state.containers.get_endpoint(caller.user_id(), &endpoint_id).await?;
    let worker = state
        .containers
        .worker(&worker_id)
        .await?
        .filter(|w| w.endpoint_id == endpoint_id)
        .ok_or_else(|| ApiError::NotFound("worker not found".into()))?;
    let mut system = vec![(
        worker.created_at_ms.saturating_mul(1_000_000),
        format!(
            "worker {} created (image {}, version {})",
            worker.id, worker.image, worker.version
        ),
    )];
    if let Some(reason) = &worker.reason {
        let at = worker
            .ended_at_ms
            .unwrap_or(worker.created_at_ms)
            .saturating_mul(1_000_000)
            + 1;
        system.push((at, reason.clone()));
    }
    let container = gantry_containers::fleet::container_name(&worker.id);
    log_response(&state, query, &container, system, worker.ended_at_ms.is_none()).await
}

/// The query of a logs route, checked (every failure at once) and with
/// `Last-Event-ID` folded into `since`.
pub(crate) struct LogRequest {
    source: LogSource,
    tail: u32,
    since_ns: Option<i64>,
    /// `since` was given: every line after it, not only the last `tail`.
    since_given: bool,
    follow: bool,
}

impl LogRequest {
    pub(crate) fn parse(req: &HttpRequest) -> Result<Self, ApiError> {
        let query = parse_query::<LogQuery>(req)?;
        let mut since_ns = query.since.map(|t| t.0.saturating_mul(1_000_000));
        if let Some(last) = req.headers().get("last-event-id").and_then(|v| v.to_str().ok()) {
            match last.trim().parse::<i64>() {
                Ok(ns) => since_ns = Some(since_ns.map_or(ns, |s| s.max(ns))),
                Err(_) => {
                    return Err(ApiError::bad_request(
                        "Last-Event-ID must be an event id of this stream",
                    ));
                }
            }
        }
        Ok(Self {
            source: query.source.map_or(LogSource::All, |s| s.0),
            tail: query.tail.map_or(100, |t| u32::try_from(t.0).unwrap_or(5000)),
            since_ns,
            since_given: query.since.is_some(),
            follow: query.follow.unwrap_or(false),
        })
    }
}

/// A log as Server-Sent Events: the `system` lines given (ns, line) and the
/// engine's lines of `container` (while `live`), merged in time order, then
/// new container lines as they come if the caller follows.
pub(crate) async fn log_response(
    state: &AppState,
    query: LogRequest,
    container: &str,
    system: Vec<(i64, String)>,
    live: bool,
) -> Result<HttpResponse, ApiError> {
    let (source, tail, since_ns) = (query.source, query.tail, query.since_ns);
    let mut events: Vec<(i64, &'static str, String)> = Vec::new();
    if source != LogSource::Container {
        events.extend(system.into_iter().map(|(ts, line)| (ts, "system", line)));
    }
    let runtime = state.fleet.as_ref().and_then(|fleet| fleet.runtime().cloned());
    if source != LogSource::System && live {
        let Some(runtime) = &runtime else {
            return Err(ApiError::Unavailable("no container runtime is configured".into()));
        };
        let since_secs = since_ns.map(|ns| ns.div_euclid(1_000_000_000));
        match runtime.logs(container, Some(tail), since_secs).await {
            Ok(lines) => events.extend(lines.into_iter().map(|l| (l.ts_unix_nanos, "container", l.line))),
            // No container, or one the engine is removing (a replaced or
            // terminated one: "dead or marked for removal"): its lines are
            // gone, the system lines are still the log.
            Err(gantry_runtime::RuntimeError::NotFound(_) | gantry_runtime::RuntimeError::Conflict(_)) => {}
            Err(error) => {
                return Err(ApiError::Unavailable(format!(
                    "the container runtime does not answer: {error}"
                )));
            }
        }
    }
    events.sort_by_key(|(ts, _, _)| *ts);
    events.retain(|(ts, _, _)| since_ns.is_none_or(|since| *ts > since));
    if events.len() > tail as usize && !query.since_given {
        events.drain(..events.len() - tail as usize);
    }
    let mut body = String::new();
    let mut last_ts = since_ns.unwrap_or(0);
    for (ts, source, line) in &events {
        body.push_str(&log_event(*ts, source, line));
        last_ts = last_ts.max(*ts);
    }
    let follow = query.follow && source != LogSource::System && live;
    let head = futures_util::stream::once(async move { Ok::<_, actix_web::Error>(web::Bytes::from(body)) });
    let mut response = HttpResponse::Ok();
    response
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("x-accel-buffering", "no"));
    match (follow, runtime) {
        (true, Some(runtime)) => {
            use futures_util::StreamExt;
            let since_secs = Some(last_ts.div_euclid(1_000_000_000));
            let rest = runtime
                .follow_logs(container, Some(0), since_secs)
                .filter_map(move |line| async move {
                    let line = line.ok()?;
                    (line.ts_unix_nanos > last_ts)
                        .then(|| Ok(web::Bytes::from(log_event(line.ts_unix_nanos, "container", &line.line))))
                });
            Ok(response.streaming(head.chain(rest)))
        }
        _ => Ok(response.streaming(head)),
    }
}

fn log_event(ts: i64, source: &str, line: &str) -> String {
    let data = serde_json::to_string(&LogEvent {
        source,
        line,
        ts: format_nanos(ts),
    })
    .unwrap_or_default();
    crate::handlers::live::event_with_id(&ts.to_string(), &data)
}

/// RFC 3339 with nanoseconds, UTC.
fn format_nanos(ns: i64) -> String {
    let ms = ns.div_euclid(1_000_000);
    let base = gantry_billing::history::format_rfc3339(ms);
    let nanos = ns.rem_euclid(1_000_000_000);
    match base.strip_suffix('Z') {
        Some(head) => format!("{}.{nanos:09}Z", head.split('.').next().unwrap_or(head)),
        None => base,
    }
}
