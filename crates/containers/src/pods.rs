//! Pods: a user's long-running container, started, stopped and reached by
//! its owner, billed by the second while it runs.
//!
//! A pod is desired state in the database (`desired`: RUNNING, EXITED or
//! TERMINATED, plus a `version` bumped by any change that needs a new
//! container and a `restart_at_ms` a restart sets); the reconciler
//! ([`crate::Fleet`]) drives the container engine towards it and writes back
//! what it saw (`status`, `reason`) and each stretch the container ran
//! (`pod_runs`, which is what is charged). Every query is scoped to the
//! pod's owner.

use std::collections::BTreeMap;

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::entity::{pod, pod_event, pod_run, ssh_key};
use crate::service::{ContainerError, ContainerService, Stretch, accrue, new_id, now_ms};
use crate::spec::Container;
use gantry_billing::history::{CPU_POD_SECONDS, GPU_POD_SECONDS, POD_DISK_SECONDS};

/// Prefix of pod ids.
pub const POD_PREFIX: &str = "pod_";
/// Most SSH keys of one account.
pub const SSH_KEYS_MAX: usize = 64;

/// Lifecycle status of a pod, as the reference names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PodStatus {
    Provisioning,
    Starting,
    Running,
    Exited,
    Error,
    Terminated,
}

impl PodStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PodStatus::Provisioning => "PROVISIONING",
            PodStatus::Starting => "STARTING",
            PodStatus::Running => "RUNNING",
            PodStatus::Exited => "EXITED",
            PodStatus::Error => "ERROR",
            PodStatus::Terminated => "TERMINATED",
        }
    }

    pub fn parse(text: &str) -> Option<PodStatus> {
        Some(match text {
            "PROVISIONING" => PodStatus::Provisioning,
            "STARTING" => PodStatus::Starting,
            "RUNNING" => PodStatus::Running,
            "EXITED" => PodStatus::Exited,
            "ERROR" => PodStatus::Error,
            "TERMINATED" => PodStatus::Terminated,
            _ => return None,
        })
    }

    /// The actions valid in this status, in the reference's order.
    pub fn actions(self) -> Vec<PodAction> {
        match self {
            PodStatus::Provisioning | PodStatus::Starting => vec![PodAction::Stop, PodAction::Terminate],
            PodStatus::Running => vec![PodAction::Stop, PodAction::Restart, PodAction::Terminate],
            PodStatus::Exited | PodStatus::Error => vec![PodAction::Start, PodAction::Terminate],
            PodStatus::Terminated => Vec::new(),
        }
    }
}

/// A state transition a pod's owner asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PodAction {
    Start,
    Stop,
    Restart,
    Terminate,
}

impl PodAction {
    pub fn as_str(self) -> &'static str {
        match self {
            PodAction::Start => "start",
            PodAction::Stop => "stop",
            PodAction::Restart => "restart",
            PodAction::Terminate => "terminate",
        }
    }
}

/// GPUs of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGpu {
    /// GPU type (`id` of `/v2/catalog/gpus`).
    pub id: String,
    #[schema(minimum = 1)]
    pub count: u32,
}

/// CPUs of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodCpu {
    /// CPU flavor (`id` of `/v2/catalog/cpus`).
    pub id: String,
    #[schema(minimum = 1)]
    pub vcpu_count: u32,
    /// Memory in GB (the flavor's RAM per vCPU × vCPUs).
    #[schema(minimum = 1)]
    pub memory: u32,
}

/// A pod's persistent disk: a volume of its own, mounted at `path`, that
/// outlives stops, restarts and configuration changes and goes with the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodPersistentMount {
    /// Size in GB (at least 10).
    #[schema(minimum = 10)]
    pub size: u32,
    /// Absolute path in the container.
    pub path: String,
}

/// A network volume mounted into a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodNetworkMount {
    /// Id of one of the caller's network volumes (fixed once created).
    #[schema(min_length = 1)]
    pub volume_id: String,
    /// Absolute path in the container.
    pub path: String,
}

/// Storage mounted into a pod: a persistent disk of its own (GPU pods) or
/// one network volume, not both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodMounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<PodPersistentMount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 1)]
    pub network: Vec<PodNetworkMount>,
}

/// What a pod runs, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(flatten)]
    pub container: Container,
    pub mounts: PodMounts,
    pub gpu: Option<PodGpu>,
    pub cpu: Option<PodCpu>,
    /// SECURE or COMMUNITY.
    pub cloud: String,
    /// The template it was made from (a one-time source of settings).
    pub template: Option<String>,
    /// The cluster it belongs to, if it is a member of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterMember>,
}

/// A pod's place in its cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterMember {
    /// The cluster's id.
    pub id: String,
    /// Its rank: 0 is the primary.
    pub rank: u32,
    /// How many pods the cluster has.
    pub size: u32,
}

impl ClusterMember {
    /// The name the other members reach this one by.
    pub fn host(&self) -> String {
        node_name(self.rank)
    }
}

/// The name of the member of rank `rank` on its cluster's network.
pub fn node_name(rank: u32) -> String {
    format!("node-{rank}")
}

/// The private network of a cluster.
pub fn cluster_network_name(cluster_id: &str) -> String {
    format!("gantry-{cluster_id}")
}

impl PodSpec {
    pub fn gpu_count(&self) -> u32 {
        self.gpu.as_ref().map_or(0, |gpu| gpu.count)
    }
}

/// A pod as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub spec: PodSpec,
    pub desired: PodStatus,
    pub status: PodStatus,
    pub reason: Option<String>,
    pub locked: bool,
    pub version: u32,
    pub restart_at_ms: i64,
    pub hourly_micro_usd: i64,
    /// The price of its disk while it is stopped.
    pub disk_hourly_micro_usd: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub deleted: bool,
}

impl PodRecord {
    fn from_row(row: pod::Model) -> Result<Self, ContainerError> {
        let spec: PodSpec =
            serde_json::from_str(&row.body).map_err(|e| ContainerError::Corrupt(format!("pod {}: {e}", row.id)))?;
        let status = |text: &str| {
            PodStatus::parse(text).ok_or_else(|| ContainerError::Corrupt(format!("pod {}: status {text}", row.id)))
        };
        Ok(PodRecord {
            desired: status(&row.desired)?,
            status: status(&row.status)?,
            id: row.id,
            user_id: row.user_id,
            name: row.name,
            spec,
            reason: row.reason,
            locked: row.locked,
            version: u32::try_from(row.version).unwrap_or(0),
            restart_at_ms: row.restart_at_ms,
            hourly_micro_usd: row.hourly_micro_usd,
            disk_hourly_micro_usd: row.disk_hourly_micro_usd,
            created_at_ms: row.created_at_ms,
            updated_at_ms: row.updated_at_ms,
            started_at_ms: row.started_at_ms,
            deleted: row.deleted_at_ms.is_some(),
        })
    }

    /// Its price per hour in USD now: its compute while it runs, its disk
    /// while it is stopped after a run, nothing otherwise.
    pub fn cost(&self) -> f64 {
        let micro_usd = match self.status {
            PodStatus::Running => self.hourly_micro_usd,
            PodStatus::Exited if self.started_at_ms.is_some() => self.disk_hourly_micro_usd,
            _ => 0,
        };
        micro_usd as f64 / 1e6
    }
}

/// What a pod costs per hour, in micro-USD: running (its GPUs or vCPUs), and
/// stopped (its disk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodPrices {
    pub hourly_micro_usd: i64,
    pub disk_hourly_micro_usd: i64,
}

/// The row of a new pod, to be started at once.
pub(crate) fn new_pod_row(
    id: &str,
    owner: &str,
    name: &str,
    spec: &PodSpec,
    prices: PodPrices,
    now: i64,
) -> Result<pod::ActiveModel, ContainerError> {
    let body = serde_json::to_string(spec).map_err(|e| ContainerError::Corrupt(e.to_string()))?;
    Ok(pod::ActiveModel {
        id: Set(id.to_owned()),
        user_id: Set(owner.to_owned()),
        name: Set(name.to_owned()),
        body: Set(body),
        desired: Set(PodStatus::Running.as_str().to_owned()),
        status: Set(PodStatus::Provisioning.as_str().to_owned()),
        reason: Set(None),
        locked: Set(false),
        volume_id: Set(spec.mounts.network.first().map(|m| m.volume_id.clone())),
        version: Set(1),
        restart_at_ms: Set(0),
        hourly_micro_usd: Set(prices.hourly_micro_usd),
        disk_hourly_micro_usd: Set(prices.disk_hourly_micro_usd),
        created_at_ms: Set(now),
        updated_at_ms: Set(now),
        started_at_ms: Set(None),
        deleted_at_ms: Set(None),
    })
}

/// What an update changes; `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct PodChange {
    pub name: Option<String>,
    /// A new configuration: a new container on the next start (or now, if running).
    pub spec: Option<PodSpec>,
    pub locked: Option<bool>,
}

/// Why an action cannot be taken (409).
#[derive(Debug, Clone, PartialEq)]
pub struct ActionRefused {
    pub status: PodStatus,
    pub reason: String,
}

impl ContainerService {
    fn open_pods(&self, owner: &str) -> sea_orm::Select<pod::Entity> {
        pod::Entity::find()
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::DeletedAtMs.is_null())
    }

    pub async fn list_pods(&self, owner: &str) -> Result<Vec<PodRecord>, ContainerError> {
        self.open_pods(owner)
            .order_by_asc(pod::Column::CreatedAtMs)
            .order_by_asc(pod::Column::Id)
            .all(self.db())
            .await?
            .into_iter()
            .map(PodRecord::from_row)
            .collect()
    }

    pub async fn get_pod(&self, owner: &str, id: &str) -> Result<PodRecord, ContainerError> {
        let row = self
            .open_pods(owner)
            .filter(pod::Column::Id.eq(id))
            .one(self.db())
            .await?
            .ok_or(ContainerError::NotFound("pod"))?;
        PodRecord::from_row(row)
    }

    /// A new pod, to be started at once.
    pub async fn create_pod(
        &self,
        owner: &str,
        name: &str,
        spec: PodSpec,
        prices: PodPrices,
    ) -> Result<PodRecord, ContainerError> {
        let id = new_id(POD_PREFIX);
        pod::Entity::insert(new_pod_row(&id, owner, name, &spec, prices, now_ms())?)
            .exec_without_returning(self.db())
            .await?;
        self.pod_event(&id, "pod created").await?;
        self.get_pod(owner, &id).await
    }

    /// Applies `change`; a new configuration bumps the version, so the
    /// reconciler replaces the container (the persistent mount stays).
    pub async fn update_pod(
        &self,
        owner: &str,
        id: &str,
        change: PodChange,
        prices: Option<PodPrices>,
    ) -> Result<PodRecord, ContainerError> {
        let current = self.get_pod(owner, id).await?;
        let mut update = pod::Entity::update_many()
            .col_expr(pod::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(pod::Column::Id.eq(id))
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::DeletedAtMs.is_null());
        if let Some(name) = &change.name {
            update = update.col_expr(pod::Column::Name, Expr::value(name.clone()));
        }
        if let Some(locked) = change.locked {
            update = update.col_expr(pod::Column::Locked, Expr::value(locked));
        }
        let mut restarted = false;
        if let Some(spec) = &change.spec
            && spec != &current.spec
        {
            let body = serde_json::to_string(spec).map_err(|e| ContainerError::Corrupt(e.to_string()))?;
            update = update
                .col_expr(pod::Column::Body, Expr::value(body))
                .col_expr(
                    pod::Column::Version,
                    sea_orm::sea_query::ExprTrait::add(Expr::col(pod::Column::Version), 1),
                )
                .col_expr(pod::Column::Reason, Expr::value(Option::<String>::None));
            if let Some(prices) = prices {
                update = update
                    .col_expr(pod::Column::HourlyMicroUsd, Expr::value(prices.hourly_micro_usd))
                    .col_expr(
                        pod::Column::DiskHourlyMicroUsd,
                        Expr::value(prices.disk_hourly_micro_usd),
                    );
            }
            // A pod that could not start is tried again with the fix.
            if current.status == PodStatus::Error && current.desired == PodStatus::Running {
                update = update.col_expr(pod::Column::Status, Expr::value(PodStatus::Provisioning.as_str()));
            }
            restarted = true;
        }
        update.exec(self.db()).await?;
        if restarted {
            self.pod_event(id, "configuration changed: the container is replaced on its next start")
                .await?;
        }
        self.get_pod(owner, id).await
    }

    /// Takes `action` if the pod's status allows it (checked and written in
    /// one statement, so two racing actions cannot both pass).
    pub async fn pod_action(
        &self,
        owner: &str,
        id: &str,
        action: PodAction,
    ) -> Result<Result<PodRecord, ActionRefused>, ContainerError> {
        let current = self.get_pod(owner, id).await?;
        if !current.status.actions().contains(&action) {
            return Ok(Err(ActionRefused {
                status: current.status,
                reason: format!("a pod that is {} cannot {}", current.status.as_str(), action.as_str()),
            }));
        }
        if current.locked && matches!(action, PodAction::Stop | PodAction::Restart) {
            return Ok(Err(ActionRefused {
                status: current.status,
                reason: format!("the pod is locked: unlock it to {}", action.as_str()),
            }));
        }
        let now = now_ms();
        let mut update = pod::Entity::update_many()
            .col_expr(pod::Column::UpdatedAtMs, Expr::value(now))
            .filter(pod::Column::Id.eq(id))
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::DeletedAtMs.is_null())
            .filter(pod::Column::Status.eq(current.status.as_str()))
            .filter(pod::Column::Version.eq(current.version as i32));
        update = match action {
            PodAction::Start => update
                .col_expr(pod::Column::Desired, Expr::value(PodStatus::Running.as_str()))
                .col_expr(pod::Column::Status, Expr::value(PodStatus::Provisioning.as_str()))
                .col_expr(pod::Column::Reason, Expr::value(Option::<String>::None)),
            PodAction::Stop => update.col_expr(pod::Column::Desired, Expr::value(PodStatus::Exited.as_str())),
            PodAction::Restart => update.col_expr(pod::Column::RestartAtMs, Expr::value(now)),
            // TERMINATED once the reconciler has removed the container and
            // closed its run.
            PodAction::Terminate => update.col_expr(pod::Column::Desired, Expr::value(PodStatus::Terminated.as_str())),
        };
        let done = update.exec(self.db()).await?;
        if done.rows_affected == 0 {
            // It changed under us: answer from what it is now.
            let now = self.get_pod(owner, id).await?;
            return Ok(Err(ActionRefused {
                status: now.status,
                reason: format!("the pod changed to {} meanwhile; try again", now.status.as_str()),
            }));
        }
        self.pod_event(id, &format!("{} asked for", action.as_str())).await?;
        Ok(Ok(self.get_pod(owner, id).await?))
    }

    /// The caller's pods (not terminated) that mount network volume `volume_id`.
    pub async fn pods_using_volume(&self, owner: &str, volume_id: &str) -> Result<Vec<String>, ContainerError> {
        // A deleted pod mounts the volume until its container is removed.
        Ok(pod::Entity::find()
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::VolumeId.eq(volume_id))
            .filter(pod::Column::Status.ne(PodStatus::Terminated.as_str()))
            .all(self.db())
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect())
    }

    /// Deletes a pod: gone for its owner at once; the reconciler removes its
    /// container and persistent mount, and charges it up to then.
    pub async fn delete_pod(&self, owner: &str, id: &str) -> Result<(), ContainerError> {
        let now = now_ms();
        let done = pod::Entity::update_many()
            .col_expr(pod::Column::DeletedAtMs, Expr::value(now))
            .col_expr(pod::Column::UpdatedAtMs, Expr::value(now))
            .col_expr(pod::Column::Desired, Expr::value(PodStatus::Terminated.as_str()))
            .filter(pod::Column::Id.eq(id))
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::DeletedAtMs.is_null())
            .exec(self.db())
            .await?;
        if done.rows_affected == 0 {
            return Err(ContainerError::NotFound("pod"));
        }
        self.pod_event(id, "pod deleted").await?;
        Ok(())
    }

    /// Every pod the reconciler has work on: all but those terminated and
    /// already cleaned up.
    pub async fn pods_to_reconcile(&self) -> Result<Vec<PodRecord>, ContainerError> {
        pod::Entity::find()
            .filter(
                sea_orm::Condition::any()
                    .add(pod::Column::Status.ne(PodStatus::Terminated.as_str()))
                    .add(pod::Column::Desired.ne(PodStatus::Terminated.as_str())),
            )
            .order_by_asc(pod::Column::CreatedAtMs)
            .all(self.db())
            .await?
            .into_iter()
            .map(PodRecord::from_row)
            .collect()
    }

    /// Writes what the reconciler saw, unless the pod's configuration
    /// changed meanwhile (`version`). A line for the pod's log goes with a
    /// change of status.
    pub async fn set_pod_status(
        &self,
        pod: &PodRecord,
        status: PodStatus,
        reason: Option<&str>,
        started_at_ms: Option<i64>,
    ) -> Result<(), ContainerError> {
        let mut update = pod::Entity::update_many()
            .col_expr(pod::Column::Status, Expr::value(status.as_str()))
            .col_expr(pod::Column::Reason, Expr::value(reason.map(str::to_owned)))
            .filter(pod::Column::Id.eq(pod.id.as_str()))
            .filter(pod::Column::Version.eq(pod.version as i32))
            .filter(pod::Column::Desired.eq(pod.desired.as_str()));
        if let Some(at) = started_at_ms {
            update = update.col_expr(pod::Column::StartedAtMs, Expr::value(at));
        }
        // A terminated pod stays terminated whatever the engine says.
        if status != PodStatus::Terminated {
            update = update.filter(pod::Column::Status.ne(PodStatus::Terminated.as_str()));
        }
        update.exec(self.db()).await?;
        Ok(())
    }

    /// The pod stopped by itself (its process exited, or it could not
    /// start): it stays stopped until its owner starts it.
    pub async fn pod_exited(&self, pod: &PodRecord, status: PodStatus, reason: &str) -> Result<(), ContainerError> {
        pod::Entity::update_many()
            .col_expr(pod::Column::Status, Expr::value(status.as_str()))
            .col_expr(pod::Column::Desired, Expr::value(PodStatus::Exited.as_str()))
            .col_expr(pod::Column::Reason, Expr::value(reason.to_owned()))
            .filter(pod::Column::Id.eq(pod.id.as_str()))
            .filter(pod::Column::Version.eq(pod.version as i32))
            .filter(pod::Column::Desired.eq(PodStatus::Running.as_str()))
            .filter(pod::Column::Status.ne(PodStatus::Terminated.as_str()))
            .exec(self.db())
            .await?;
        self.pod_event(&pod.id, reason).await
    }

    /// Starts a billed run of `pod` at `at_ms`, unless one is open; the
    /// charge for its stopped disk ends there.
    pub async fn open_pod_run(&self, pod: &PodRecord, at_ms: i64) -> Result<(), ContainerError> {
        self.end_stretch(&pod.id, pod_run::DISK, at_ms).await?;
        if self.open_run_of(&pod.id).await?.is_some() {
            return Ok(());
        }
        self.begin_stretch(pod, pod_run::RUN, at_ms).await
    }

    async fn begin_stretch(&self, pod: &PodRecord, kind: &str, at_ms: i64) -> Result<(), ContainerError> {
        let (gpu_count, hourly) = if kind == pod_run::RUN {
            (pod.spec.gpu_count() as i32, pod.hourly_micro_usd)
        } else {
            (0, pod.disk_hourly_micro_usd)
        };
        pod_run::Entity::insert(pod_run::ActiveModel {
            id: Set(new_id(if kind == pod_run::RUN { "run_" } else { "disk_" })),
            pod_id: Set(pod.id.clone()),
            user_id: Set(pod.user_id.clone()),
            gpu_count: Set(gpu_count),
            hourly_micro_usd: Set(hourly),
            created_at_ms: Set(at_ms),
            billed_until_ms: Set(at_ms),
            ended_at_ms: Set(None),
            kind: Set(kind.to_owned()),
        })
        .exec_without_returning(self.db())
        .await?;
        Ok(())
    }

    /// Ends the open stretch of `kind` of a pod at `at_ms`; whether one was open.
    async fn end_stretch(&self, pod_id: &str, kind: &str, at_ms: i64) -> Result<bool, ContainerError> {
        let done = pod_run::Entity::update_many()
            .col_expr(pod_run::Column::EndedAtMs, Expr::value(at_ms))
            .filter(pod_run::Column::PodId.eq(pod_id))
            .filter(pod_run::Column::Kind.eq(kind))
            .filter(pod_run::Column::EndedAtMs.is_null())
            .exec(self.db())
            .await?;
        Ok(done.rows_affected > 0)
    }

    /// The open run of a pod, if its container runs.
    pub async fn open_run_of(&self, pod_id: &str) -> Result<Option<pod_run::Model>, ContainerError> {
        Ok(pod_run::Entity::find()
            .filter(pod_run::Column::PodId.eq(pod_id))
            .filter(pod_run::Column::Kind.eq(pod_run::RUN))
            .filter(pod_run::Column::EndedAtMs.is_null())
            .one(self.db())
            .await?)
    }

    /// Ends the open run of a pod at `at_ms` (billing of its compute stops
    /// there). Unless the pod is being terminated, the charge for the disk
    /// it keeps while stopped begins there, until its next run or its end.
    pub async fn close_pod_run(&self, pod: &PodRecord, at_ms: i64) -> Result<(), ContainerError> {
        let ended = self.end_stretch(&pod.id, pod_run::RUN, at_ms).await?;
        if ended && pod.desired != PodStatus::Terminated && pod.disk_hourly_micro_usd > 0 {
            let open = pod_run::Entity::find()
                .filter(pod_run::Column::PodId.eq(pod.id.as_str()))
                .filter(pod_run::Column::Kind.eq(pod_run::DISK))
                .filter(pod_run::Column::EndedAtMs.is_null())
                .one(self.db())
                .await?;
            if open.is_none() {
                self.begin_stretch(pod, pod_run::DISK, at_ms).await?;
            }
        }
        Ok(())
    }

    /// Ends the charge for a stopped pod's disk at `at_ms`: the disk is gone.
    pub async fn close_pod_disk(&self, pod_id: &str, at_ms: i64) -> Result<(), ContainerError> {
        self.end_stretch(pod_id, pod_run::DISK, at_ms).await?;
        Ok(())
    }

    /// Every run of a pod, oldest first.
    pub async fn pod_runs(&self, pod_id: &str) -> Result<Vec<pod_run::Model>, ContainerError> {
        self.pod_stretches(pod_id, pod_run::RUN).await
    }

    /// Every stretch of `kind` (runs, or stopped disk) of a pod, oldest first.
    pub async fn pod_stretches(&self, pod_id: &str, kind: &str) -> Result<Vec<pod_run::Model>, ContainerError> {
        Ok(pod_run::Entity::find()
            .filter(pod_run::Column::PodId.eq(pod_id))
            .filter(pod_run::Column::Kind.eq(kind))
            .order_by_asc(pod_run::Column::CreatedAtMs)
            .all(self.db())
            .await?)
    }

    /// Charges every pod run and stopped disk up to the last whole second
    /// (or its end), once: each charge moves `billed_until_ms` in the same
    /// transaction.
    pub async fn accrue_pods(&self, now_ms: i64) -> Result<i64, ContainerError> {
        let rows = pod_run::Entity::find()
            .filter(
                sea_orm::Condition::any()
                    .add(pod_run::Column::EndedAtMs.is_null())
                    .add(Expr::cust("billed_until_ms < ended_at_ms")),
            )
            .all(self.db())
            .await?;
        let stretches = rows.into_iter().map(|row| Stretch {
            id: row.id,
            user_id: row.user_id,
            subject: row.pod_id,
            unit: if row.kind == pod_run::DISK {
                POD_DISK_SECONDS
            } else if row.gpu_count > 0 {
                GPU_POD_SECONDS
            } else {
                CPU_POD_SECONDS
            },
            created_at_ms: row.created_at_ms,
            billed_until_ms: row.billed_until_ms,
            ended_at_ms: row.ended_at_ms,
            hourly_micro_usd: row.hourly_micro_usd,
        });
        accrue(self.db(), "pod_runs", stretches, now_ms).await
    }

    /// Adds a system line to a pod's log.
    pub async fn pod_event(&self, pod_id: &str, line: &str) -> Result<(), ContainerError> {
        let at = now_ms();
        let before = pod_event::Entity::find()
            .filter(pod_event::Column::PodId.eq(pod_id))
            .filter(pod_event::Column::AtMs.eq(at))
            .count(self.db())
            .await?;
        let mut seq = i64::try_from(before).unwrap_or(i64::MAX);
        // Lines of one pod written in the same millisecond by the reconciler
        // and an API call take the next free place, not an error.
        loop {
            let written = pod_event::Entity::insert(pod_event::ActiveModel {
                pod_id: Set(pod_id.to_owned()),
                at_ms: Set(at),
                seq: Set(seq),
                line: Set(line.to_owned()),
            })
            .exec_without_returning(self.db())
            .await;
            match written {
                Err(error)
                    if matches!(error.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
                        && seq < i64::try_from(before).unwrap_or(0) + 64 =>
                {
                    seq += 1;
                }
                other => return other.map(|_| ()).map_err(ContainerError::from),
            }
        }
    }

    /// The system lines of a pod's log: (ms, line), oldest first.
    pub async fn pod_events(&self, pod_id: &str) -> Result<Vec<(i64, i64, String)>, ContainerError> {
        Ok(pod_event::Entity::find()
            .filter(pod_event::Column::PodId.eq(pod_id))
            .order_by_asc(pod_event::Column::AtMs)
            .order_by_asc(pod_event::Column::Seq)
            .all(self.db())
            .await?
            .into_iter()
            .map(|e| (e.at_ms, e.seq, e.line))
            .collect())
    }

    /// An account's SSH public keys.
    pub async fn ssh_keys(&self, owner: &str) -> Result<Vec<String>, ContainerError> {
        let row = ssh_key::Entity::find_by_id(owner.to_owned()).one(self.db()).await?;
        match row {
            Some(row) => serde_json::from_str(&row.keys).map_err(|e| ContainerError::Corrupt(e.to_string())),
            None => Ok(Vec::new()),
        }
    }

    /// Replaces an account's SSH public keys.
    pub async fn put_ssh_keys(&self, owner: &str, keys: &[String]) -> Result<(), ContainerError> {
        let keys = serde_json::to_string(keys).map_err(|e| ContainerError::Corrupt(e.to_string()))?;
        let model = ssh_key::ActiveModel {
            user_id: Set(owner.to_owned()),
            keys: Set(keys),
            updated_at_ms: Set(now_ms()),
        };
        ssh_key::Entity::insert(model)
            .on_conflict(
                sea_orm::sea_query::OnConflict::column(ssh_key::Column::UserId)
                    .update_columns([ssh_key::Column::Keys, ssh_key::Column::UpdatedAtMs])
                    .to_owned(),
            )
            .exec_without_returning(self.db())
            .await?;
        Ok(())
    }
}

/// Checks one authorized_keys line as the reference's pattern has it:
/// `<type> <base64-key> [comment]`, the type starting `ssh-`, `ecdsa-` or
/// `sk-`, and the key valid base64.
pub fn check_ssh_key(line: &str) -> Result<(), String> {
    if line.contains(['\n', '\r']) {
        return Err("must be one line".into());
    }
    let mut parts = line.splitn(3, [' ', '\t']);
    let kind = parts.next().unwrap_or("");
    let key = parts.next().unwrap_or("");
    if !["ssh-", "ecdsa-", "sk-"].iter().any(|p| kind.starts_with(p)) || kind.len() <= 4 {
        return Err(format!(
            "key type '{kind}' is not an SSH key type (ssh-…, ecdsa-… or sk-…)"
        ));
    }
    if key.is_empty() {
        return Err("the base64 key is missing".into());
    }
    use base64::Engine;
    if base64::engine::general_purpose::STANDARD.decode(key).is_err() {
        return Err("the key is not valid base64".into());
    }
    Ok(())
}

/// The container name of a pod.
pub fn pod_container_name(pod_id: &str) -> String {
    format!("gantry-{pod_id}")
}

/// The volume holding a pod's persistent mount.
pub fn pod_volume_name(pod_id: &str) -> String {
    format!("gantry-{pod_id}-disk")
}

/// The engine volume holding a network volume's files.
pub fn network_volume_name(volume_id: &str) -> String {
    format!("gantry-vol-{volume_id}")
}

/// The environment a pod's container starts with: its own, plus
/// `RUNPOD_POD_ID` and the GPU count as RunPod images expect them.
pub fn pod_env(pod: &PodRecord) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = pod.spec.container.env.clone();
    env.entry("RUNPOD_POD_ID".into()).or_insert_with(|| pod.id.clone());
    env.entry("RUNPOD_GPU_COUNT".into())
        .or_insert_with(|| pod.spec.gpu_count().to_string());
    if let Some(member) = &pod.spec.cluster {
        // What torchrun, Slurm or Ray setups read to find each other (RunPod's
        // names): the primary, this node, their number and the GPUs in all.
        let gpus = pod.spec.gpu_count();
        for (name, value) in [
            ("PRIMARY_ADDR", node_name(0)),
            ("MASTER_ADDR", node_name(0)),
            ("PRIMARY_PORT", "29500".to_owned()),
            ("MASTER_PORT", "29500".to_owned()),
            ("NODE_ADDR", member.host()),
            ("NODE_RANK", member.rank.to_string()),
            ("NUM_NODES", member.size.to_string()),
            ("NUM_TRAINERS", gpus.to_string()),
            ("WORLD_SIZE", (gpus * member.size).to_string()),
            ("RUNPOD_CLUSTER_ID", member.id.clone()),
        ] {
            env.entry(name.into()).or_insert(value);
        }
    }
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_follow_the_status() {
        assert_eq!(
            PodStatus::Running.actions(),
            vec![PodAction::Stop, PodAction::Restart, PodAction::Terminate]
        );
        assert_eq!(
            PodStatus::Exited.actions(),
            vec![PodAction::Start, PodAction::Terminate]
        );
        assert!(PodStatus::Terminated.actions().is_empty());
        for status in [
            PodStatus::Provisioning,
            PodStatus::Starting,
            PodStatus::Running,
            PodStatus::Exited,
            PodStatus::Error,
            PodStatus::Terminated,
        ] {
            assert_eq!(PodStatus::parse(status.as_str()), Some(status));
        }
    }

    #[test]
    fn ssh_keys_are_checked_like_the_reference() {
        let good = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILXGDN/SclOozk1xsDztpmhGiKkkrfQB9SKoO8dSIQQZ me@example.com";
        assert_eq!(check_ssh_key(good), Ok(()));
        assert_eq!(check_ssh_key("ecdsa-sha2-nistp256 AAAA"), Ok(()));
        for bad in [
            "rsa AAAA",
            "ssh-ed25519",
            "ssh-ed25519 not*base64",
            "ssh- AAAA",
            "ssh-rsa AAAA\nssh-rsa AAAA",
        ] {
            assert!(check_ssh_key(bad).is_err(), "{bad}");
        }
    }
}
