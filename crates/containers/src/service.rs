//! Templates, registry credentials, endpoints and their workers, always
//! scoped to their owner.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngExt;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    TransactionTrait,
};
use serde_json::{Value, json};

use gantry_billing::history::{CPU_WORKER_SECONDS, GPU_WORKER_SECONDS};
use gantry_catalog::ENDPOINT_PREFIX;

use crate::entity::{endpoint, registry, release, template, worker};
use crate::secret::{SecretBox, SecretError};
use crate::spec::{DiffEntry, EndpointSpec, Registry, Template};

pub use crate::entity::worker::Model as WorkerRecord;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The object is referenced and cannot be removed (409).
    #[error("{0}")]
    InUse(String),
    #[error("registry credential cannot be read: {0}")]
    Secret(#[from] SecretError),
    /// The container engine refused or did not answer.
    #[error("container runtime: {0}")]
    Runtime(String),
    #[error("stored configuration is unreadable: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// An endpoint as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointRecord {
    pub id: String,
    pub user_id: String,
    pub spec: EndpointSpec,
    pub version: u32,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub deleted: bool,
    /// Workers wanted and not started for want of GPUs, as the fleet's
    /// leader last published it, and why (the GPU pool's words).
    pub throttled: u32,
    pub throttled_reason: Option<String>,
}

/// A release as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseRecord {
    pub version: u32,
    pub diff: Vec<DiffEntry>,
    pub created_by: String,
    pub created_at_ms: i64,
}

#[derive(Clone)]
pub struct ContainerService {
    db: DatabaseConnection,
    secrets: Arc<SecretBox>,
}

impl ContainerService {
    pub fn new(db: DatabaseConnection, secrets: Arc<SecretBox>) -> Self {
        Self { db, secrets }
    }

    /// A network volume's size in GB (the volumes service's row), if it exists.
    pub async fn volume_size_gb(&self, volume_id: &str) -> Result<Option<u32>, ContainerError> {
        use sea_orm::ConnectionTrait;
        let db = self.db();
        let row = db
            .query_one_raw(statement(
                db.get_database_backend(),
                "SELECT size FROM network_volumes WHERE id = ?",
                vec![volume_id.into()],
            ))
            .await?;
        Ok(row
            .and_then(|r| r.try_get_by_index::<i32>(0).ok())
            .and_then(|size| u32::try_from(size).ok()))
    }

    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    // --- templates -------------------------------------------------------

    pub async fn list_templates(&self, owner: &str) -> Result<Vec<Template>, ContainerError> {
        let rows = template::Entity::find()
            .filter(template::Column::UserId.eq(owner))
            .order_by_asc(template::Column::CreatedAtMs)
            .order_by_asc(template::Column::Id)
            .all(&self.db)
            .await?;
        rows.into_iter().map(template_of).collect()
    }

    /// Every user's public templates.
    pub async fn public_templates(&self) -> Result<Vec<Template>, ContainerError> {
        let rows = template::Entity::find()
            .filter(template::Column::Public.eq(true))
            .order_by_asc(template::Column::CreatedAtMs)
            .order_by_asc(template::Column::Id)
            .all(&self.db)
            .await?;
        rows.into_iter().map(template_of).collect()
    }

    pub async fn get_template(&self, owner: &str, id: &str) -> Result<Template, ContainerError> {
        template::Entity::find_by_id(id)
            .filter(template::Column::UserId.eq(owner))
            .one(&self.db)
            .await?
            .ok_or(ContainerError::NotFound("template"))
            .and_then(template_of)
    }

    /// A template `owner` may build on: their own, or a public one.
    pub async fn usable_template(&self, owner: &str, id: &str) -> Result<Option<Template>, ContainerError> {
        let row = template::Entity::find_by_id(id)
            .filter(
                sea_orm::Condition::any()
                    .add(template::Column::UserId.eq(owner))
                    .add(template::Column::Public.eq(true)),
            )
            .one(&self.db)
            .await?;
        row.map(template_of).transpose()
    }

    /// Stores a new template (`template.id` is replaced by a fresh one).
    pub async fn create_template(&self, owner: &str, mut template: Template) -> Result<Template, ContainerError> {
        template.id = new_id("tpl_");
        let now = now_ms();
        template::ActiveModel {
            id: Set(template.id.clone()),
            user_id: Set(owner.to_owned()),
            name: Set(template.name.clone()),
            public: Set(template.public),
            serverless: Set(template.serverless),
            body: Set(to_json(&template)),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
        }
        .insert_row(&self.db)
        .await?;
        Ok(template)
    }

    /// Writes the whole template (as changed by the caller from
    /// [`ContainerService::get_template`]).
    pub async fn update_template(&self, owner: &str, template: &Template) -> Result<(), ContainerError> {
        let result = template::Entity::update_many()
            .col_expr(template::Column::Name, Expr::value(template.name.clone()))
            .col_expr(template::Column::Public, Expr::value(template.public))
            .col_expr(template::Column::Serverless, Expr::value(template.serverless))
            .col_expr(template::Column::Body, Expr::value(to_json(template)))
            .col_expr(template::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(template::Column::Id.eq(template.id.clone()))
            .filter(template::Column::UserId.eq(owner))
            .exec(&self.db)
            .await?;
        if result.rows_affected == 0 {
            return Err(ContainerError::NotFound("template"));
        }
        Ok(())
    }

    /// Deletes a template no live endpoint was made from (409 otherwise),
    /// in one statement: an endpoint made from it at the same moment either
    /// commits first (and the delete finds it) or finds the template gone.
    pub async fn delete_template(&self, owner: &str, id: &str) -> Result<(), ContainerError> {
        let deleted = self
            .db
            .execute_raw(statement(
                self.db.get_database_backend(),
                "DELETE FROM templates WHERE id = ? AND user_id = ? AND NOT EXISTS \
                 (SELECT 1 FROM endpoints WHERE template_id = ? AND deleted_at_ms IS NULL)",
                vec![id.into(), owner.into(), id.into()],
            ))
            .await?;
        if deleted.rows_affected() == 1 {
            return Ok(());
        }
        self.get_template(owner, id).await?;
        let users = endpoint::Entity::find()
            .filter(endpoint::Column::TemplateId.eq(id))
            .filter(endpoint::Column::DeletedAtMs.is_null())
            .all(&self.db)
            .await?;
        let ids: Vec<&str> = users.iter().map(|e| e.id.as_str()).collect();
        Err(ContainerError::InUse(format!(
            "template {id} is in use by endpoint(s) {}; delete them first",
            ids.join(", ")
        )))
    }

    // --- registries ------------------------------------------------------

    pub async fn list_registries(&self, owner: &str) -> Result<Vec<Registry>, ContainerError> {
        let rows = registry::Entity::find()
            .filter(registry::Column::UserId.eq(owner))
            .order_by_asc(registry::Column::CreatedAtMs)
            .order_by_asc(registry::Column::Id)
            .all(&self.db)
            .await?;
        Ok(rows.into_iter().map(|r| Registry { id: r.id, name: r.name }).collect())
    }

    pub async fn get_registry(&self, owner: &str, id: &str) -> Result<Registry, ContainerError> {
        let row = self.registry_row(owner, id).await?;
        Ok(Registry {
            id: row.id,
            name: row.name,
        })
    }

    async fn registry_row(&self, owner: &str, id: &str) -> Result<registry::Model, ContainerError> {
        registry::Entity::find_by_id(id)
            .filter(registry::Column::UserId.eq(owner))
            .one(&self.db)
            .await?
            .ok_or(ContainerError::NotFound("registry"))
    }

    /// Stores a credential; the username and password are sealed together.
    pub async fn create_registry(
        &self,
        owner: &str,
        name: &str,
        username: &str,
        password: &str,
    ) -> Result<Registry, ContainerError> {
        let id = new_id("reg_");
        let sealed = self.secrets.seal(
            &json!({"username": username, "password": password}).to_string(),
            &format!("{owner}/{id}"),
        )?;
        registry::ActiveModel {
            id: Set(id.clone()),
            user_id: Set(owner.to_owned()),
            name: Set(name.to_owned()),
            credential: Set(sealed),
            created_at_ms: Set(now_ms()),
        }
        .insert_row(&self.db)
        .await?;
        Ok(Registry {
            id,
            name: name.to_owned(),
        })
    }

    /// Deletes a credential that no live endpoint and no template names.
    pub async fn delete_registry(&self, owner: &str, id: &str) -> Result<(), ContainerError> {
        self.registry_row(owner, id).await?;
        let endpoints = self.list_endpoints(owner).await?;
        let mut users: Vec<String> = endpoints
            .iter()
            .filter(|e| e.spec.container.registry.as_deref() == Some(id))
            .map(|e| format!("endpoint {}", e.id))
            .collect();
        users.extend(
            self.list_templates(owner)
                .await?
                .iter()
                .filter(|t| t.container.registry.as_deref() == Some(id))
                .map(|t| format!("template {}", t.id)),
        );
        if !users.is_empty() {
            return Err(ContainerError::InUse(format!(
                "registry {id} is in use by {}; change or delete them first",
                users.join(", ")
            )));
        }
        registry::Entity::delete_many()
            .filter(registry::Column::Id.eq(id))
            .filter(registry::Column::UserId.eq(owner))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// The username and password of a credential, for an image pull.
    pub async fn credentials(&self, owner: &str, id: &str) -> Result<(String, String), ContainerError> {
        let row = self.registry_row(owner, id).await?;
        let plain = self.secrets.open(&row.credential, &format!("{owner}/{id}"))?;
        let value: Value = serde_json::from_str(&plain).map_err(|e| ContainerError::Corrupt(e.to_string()))?;
        let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or_default().to_owned();
        Ok((field("username"), field("password")))
    }

    pub async fn registry_exists(&self, owner: &str, id: &str) -> Result<bool, ContainerError> {
        match self.registry_row(owner, id).await {
            Ok(_) => Ok(true),
            Err(ContainerError::NotFound(_)) => Ok(false),
            Err(other) => Err(other),
        }
    }

    // --- endpoints -------------------------------------------------------

    /// The owner's endpoints (not deleted), oldest first.
    pub async fn list_endpoints(&self, owner: &str) -> Result<Vec<EndpointRecord>, ContainerError> {
        let rows = endpoint::Entity::find()
            .filter(endpoint::Column::UserId.eq(owner))
            .filter(endpoint::Column::DeletedAtMs.is_null())
            .order_by_asc(endpoint::Column::CreatedAtMs)
            .order_by_asc(endpoint::Column::Id)
            .all(&self.db)
            .await?;
        rows.into_iter().map(endpoint_of).collect()
    }

    /// The owner's endpoints (not deleted) whose workers mount network
    /// volume `volume_id`.
    pub async fn endpoints_using_volume(&self, owner: &str, volume_id: &str) -> Result<Vec<String>, ContainerError> {
        Ok(self
            .list_endpoints(owner)
            .await?
            .into_iter()
            .filter(|endpoint| endpoint.spec.network_volumes.iter().any(|id| id == volume_id))
            .map(|endpoint| endpoint.id)
            .collect())
    }

    pub async fn get_endpoint(&self, owner: &str, id: &str) -> Result<EndpointRecord, ContainerError> {
        endpoint::Entity::find_by_id(id)
            .filter(endpoint::Column::UserId.eq(owner))
            .filter(endpoint::Column::DeletedAtMs.is_null())
            .one(&self.db)
            .await?
            .ok_or(ContainerError::NotFound("endpoint"))
            .and_then(endpoint_of)
    }

    /// Every endpoint the reconciler must look at: the live ones, and the
    /// deleted ones that still have workers.
    pub async fn endpoints_to_reconcile(&self) -> Result<Vec<EndpointRecord>, ContainerError> {
        let live = endpoint::Entity::find()
            .filter(endpoint::Column::DeletedAtMs.is_null())
            .all(&self.db)
            .await?;
        let open: Vec<String> = worker::Entity::find()
            .filter(worker::Column::EndedAtMs.is_null())
            .all(&self.db)
            .await?
            .into_iter()
            .map(|w| w.endpoint_id)
            .collect();
        let mut rows = live;
        if !open.is_empty() {
            let deleted = endpoint::Entity::find()
                .filter(endpoint::Column::DeletedAtMs.is_not_null())
                .filter(endpoint::Column::Id.is_in(open))
                .all(&self.db)
                .await?;
            rows.extend(deleted);
        }
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows.into_iter().map(endpoint_of).collect()
    }

    /// Any endpoint by id, deleted or not (the reconciler and the worker
    /// gateway, which act for the platform rather than a user).
    pub async fn endpoint_by_id(&self, id: &str) -> Result<Option<EndpointRecord>, ContainerError> {
        endpoint::Entity::find_by_id(id)
            .one(&self.db)
            .await?
            .map(endpoint_of)
            .transpose()
    }

    /// Stores a new endpoint at version 1, with its first release.
    pub async fn create_endpoint(&self, owner: &str, spec: EndpointSpec) -> Result<EndpointRecord, ContainerError> {
        let id = new_id(ENDPOINT_PREFIX);
        let now = now_ms();
        let txn = self.db.begin().await?;
        endpoint::ActiveModel {
            id: Set(id.clone()),
            user_id: Set(owner.to_owned()),
            body: Set(to_json(&spec)),
            template_id: Set(spec.template_id.clone()),
            version: Set(1),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
            deleted_at_ms: Set(None),
            throttled: Set(0),
            throttled_reason: Set(None),
        }
        .insert_row(&txn)
        .await?;
        let diff = release_diff(None, &spec);
        insert_release(&txn, &id, 1, &diff, owner, now).await?;
        txn.commit().await?;
        Ok(EndpointRecord {
            id,
            user_id: owner.to_owned(),
            spec,
            version: 1,
            created_at_ms: now,
            updated_at_ms: now,
            deleted: false,
            throttled: 0,
            throttled_reason: None,
        })
    }

    /// Writes `spec` over the endpoint `current` (read by the caller). A
    /// change of what the workers run is a new version with its release;
    /// the update is refused as not found if the endpoint changed or went
    /// away since it was read, so two racing updates never lose a release.
    pub async fn update_endpoint(
        &self,
        owner: &str,
        current: &EndpointRecord,
        spec: EndpointSpec,
    ) -> Result<EndpointRecord, ContainerError> {
        let diff = release_diff(Some(&current.spec), &spec);
        let version = if diff.is_empty() {
            current.version
        } else {
            current.version + 1
        };
        let now = now_ms();
        let txn = self.db.begin().await?;
        let result = endpoint::Entity::update_many()
            .col_expr(endpoint::Column::Body, Expr::value(to_json(&spec)))
            .col_expr(endpoint::Column::TemplateId, Expr::value(spec.template_id.clone()))
            .col_expr(endpoint::Column::Version, Expr::value(version as i32))
            .col_expr(endpoint::Column::UpdatedAtMs, Expr::value(now))
            .filter(endpoint::Column::Id.eq(current.id.clone()))
            .filter(endpoint::Column::UserId.eq(owner))
            .filter(endpoint::Column::DeletedAtMs.is_null())
            .filter(endpoint::Column::Version.eq(current.version as i32))
            .filter(endpoint::Column::UpdatedAtMs.eq(current.updated_at_ms))
            .exec(&txn)
            .await?;
        if result.rows_affected == 0 {
            return Err(ContainerError::NotFound("endpoint"));
        }
        if !diff.is_empty() {
            insert_release(&txn, &current.id, version, &diff, owner, now).await?;
        }
        txn.commit().await?;
        Ok(EndpointRecord {
            spec,
            version,
            updated_at_ms: now,
            ..current.clone()
        })
    }

    /// Marks the endpoint deleted: gone for its owner at once; the
    /// reconciler drains and removes its workers.
    pub async fn delete_endpoint(&self, owner: &str, id: &str) -> Result<(), ContainerError> {
        // A deleted endpoint wants no worker: none waits for GPUs.
        let result = endpoint::Entity::update_many()
            .col_expr(endpoint::Column::DeletedAtMs, Expr::value(now_ms()))
            .col_expr(endpoint::Column::Throttled, Expr::value(0))
            .col_expr(endpoint::Column::ThrottledReason, Expr::value(Option::<String>::None))
            .filter(endpoint::Column::Id.eq(id))
            .filter(endpoint::Column::UserId.eq(owner))
            .filter(endpoint::Column::DeletedAtMs.is_null())
            .exec(&self.db)
            .await?;
        if result.rows_affected == 0 {
            return Err(ContainerError::NotFound("endpoint"));
        }
        Ok(())
    }

    /// The endpoint's releases, newest first.
    pub async fn releases(&self, owner: &str, id: &str) -> Result<Vec<ReleaseRecord>, ContainerError> {
        self.get_endpoint(owner, id).await?;
        let rows = release::Entity::find()
            .filter(release::Column::EndpointId.eq(id))
            .order_by_desc(release::Column::Version)
            .all(&self.db)
            .await?;
        rows.into_iter()
            .map(|row| {
                Ok(ReleaseRecord {
                    version: u32::try_from(row.version).unwrap_or(0),
                    diff: serde_json::from_str(&row.diff).map_err(|e| ContainerError::Corrupt(e.to_string()))?,
                    created_by: row.created_by,
                    created_at_ms: row.created_at_ms,
                })
            })
            .collect()
    }

    // --- workers ---------------------------------------------------------

    pub async fn add_worker(&self, record: WorkerRecord) -> Result<(), ContainerError> {
        worker::ActiveModel {
            id: Set(record.id),
            endpoint_id: Set(record.endpoint_id),
            user_id: Set(record.user_id),
            version: Set(record.version),
            image: Set(record.image),
            gpu_count: Set(record.gpu_count),
            hourly_micro_usd: Set(record.hourly_micro_usd),
            created_at_ms: Set(record.created_at_ms),
            billed_until_ms: Set(record.billed_until_ms),
            ended_at_ms: Set(record.ended_at_ms),
            reason: Set(record.reason),
            host: Set(record.host),
            seen_at_ms: Set(record.seen_at_ms),
            held_jobs: Set(record.held_jobs),
            idle_since_ms: Set(record.idle_since_ms),
            stop_request: Set(record.stop_request),
            unschedulable: Set(record.unschedulable),
        }
        .insert_row(&self.db)
        .await?;
        Ok(())
    }

    /// Records that a worker's container is gone (once; a later call keeps
    /// the first end).
    pub async fn end_worker(&self, id: &str, at_ms: i64, reason: &str) -> Result<(), ContainerError> {
        worker::Entity::update_many()
            .col_expr(worker::Column::EndedAtMs, Expr::value(at_ms))
            .col_expr(worker::Column::Reason, Expr::value(reason.to_owned()))
            .filter(worker::Column::Id.eq(id))
            .filter(worker::Column::EndedAtMs.is_null())
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Records that `host` holds the worker's session from `at_ms` on (its
    /// first call there): idle, holding nothing. False if the worker has
    /// ended.
    pub async fn host_worker(&self, id: &str, host: &str, at_ms: i64) -> Result<bool, ContainerError> {
        let result = worker::Entity::update_many()
            .col_expr(worker::Column::Host, Expr::value(host.to_owned()))
            .col_expr(
                worker::Column::SeenAtMs,
                sea_orm::sea_query::ExprTrait::if_null(Expr::col(worker::Column::SeenAtMs), at_ms),
            )
            .col_expr(worker::Column::HeldJobs, Expr::value(0))
            .col_expr(worker::Column::IdleSinceMs, Expr::value(at_ms))
            .filter(worker::Column::Id.eq(id))
            .filter(worker::Column::EndedAtMs.is_null())
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected == 1)
    }

    /// Publishes a hosted worker's load: the jobs it holds, and since when
    /// it has held none (None while it holds one). Only its host writes it.
    pub async fn publish_worker_load(
        &self,
        id: &str,
        host: &str,
        held_jobs: i32,
        idle_since_ms: Option<i64>,
    ) -> Result<(), ContainerError> {
        worker::Entity::update_many()
            .col_expr(worker::Column::HeldJobs, Expr::value(held_jobs))
            .col_expr(worker::Column::IdleSinceMs, Expr::value(idle_since_ms))
            .filter(worker::Column::Id.eq(id))
            .filter(worker::Column::Host.eq(host))
            .filter(worker::Column::EndedAtMs.is_null())
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Publishes why Kubernetes cannot place the worker's Pod (None: it
    /// can, or has). Only the leader writes it, when it changes.
    pub async fn publish_unschedulable(&self, id: &str, reason: Option<&str>) -> Result<(), ContainerError> {
        self.set_on_open_worker(id, worker::Column::Unschedulable, reason).await
    }

    /// Sets a text column of an open worker's record (None: NULL).
    async fn set_on_open_worker(
        &self,
        id: &str,
        column: worker::Column,
        value: Option<&str>,
    ) -> Result<(), ContainerError> {
        worker::Entity::update_many()
            .col_expr(column, Expr::value(value.map(str::to_owned)))
            .filter(worker::Column::Id.eq(id))
            .filter(worker::Column::EndedAtMs.is_null())
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Moves an open worker's billing on to `until_ms` with no charge: the
    /// time its Pod waited for a node is not billed. A charge computed
    /// before this from the old mark is not written (see [`accrue`]).
    pub async fn skip_billing(&self, id: &str, until_ms: i64) -> Result<(), ContainerError> {
        worker::Entity::update_many()
            .col_expr(worker::Column::BilledUntilMs, Expr::value(until_ms))
            .filter(worker::Column::Id.eq(id))
            .filter(worker::Column::EndedAtMs.is_null())
            .filter(worker::Column::BilledUntilMs.lt(until_ms))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Publishes how many of the endpoint's workers the leader wants and
    /// cannot start for want of GPUs, and why (None with none). Only the
    /// leader writes it, when it changes.
    pub async fn publish_throttled(&self, id: &str, count: u32, reason: Option<&str>) -> Result<(), ContainerError> {
        endpoint::Entity::update_many()
            .col_expr(
                endpoint::Column::Throttled,
                Expr::value(i32::try_from(count).unwrap_or(i32::MAX)),
            )
            .col_expr(
                endpoint::Column::ThrottledReason,
                Expr::value(reason.map(str::to_owned)),
            )
            .filter(endpoint::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Sets (or, with None, withdraws) the leader's request to a worker's
    /// host: `retire` or `drain`.
    pub async fn request_worker_stop(&self, id: &str, request: Option<&str>) -> Result<(), ContainerError> {
        self.set_on_open_worker(id, worker::Column::StopRequest, request).await
    }

    /// The open workers `host` holds the sessions of that the leader has
    /// asked it to stop.
    pub async fn stop_requests(&self, host: &str) -> Result<Vec<WorkerRecord>, ContainerError> {
        Ok(worker::Entity::find()
            .filter(worker::Column::Host.eq(host))
            .filter(worker::Column::StopRequest.is_not_null())
            .filter(worker::Column::EndedAtMs.is_null())
            .all(&self.db)
            .await?)
    }

    /// Sets why a running worker is unwell (a failed pull, a crash), without
    /// ending it.
    pub async fn note_worker(&self, id: &str, reason: &str) -> Result<(), ContainerError> {
        worker::Entity::update_many()
            .col_expr(worker::Column::Reason, Expr::value(reason.to_owned()))
            .filter(worker::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// The workers of an endpoint that have not ended, oldest first.
    pub async fn open_workers(&self, endpoint_id: &str) -> Result<Vec<WorkerRecord>, ContainerError> {
        Ok(worker::Entity::find()
            .filter(worker::Column::EndpointId.eq(endpoint_id))
            .filter(worker::Column::EndedAtMs.is_null())
            .order_by_asc(worker::Column::CreatedAtMs)
            .order_by_asc(worker::Column::Id)
            .all(&self.db)
            .await?)
    }

    /// Every worker that has not ended, of every endpoint.
    pub async fn every_open_worker(&self) -> Result<Vec<WorkerRecord>, ContainerError> {
        Ok(worker::Entity::find()
            .filter(worker::Column::EndedAtMs.is_null())
            .order_by_asc(worker::Column::CreatedAtMs)
            .order_by_asc(worker::Column::Id)
            .all(&self.db)
            .await?)
    }

    pub async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>, ContainerError> {
        Ok(worker::Entity::find_by_id(id).one(&self.db).await?)
    }

    /// Charges every worker's seconds not charged yet, up to `now_ms` (or
    /// its end): whole seconds for a running worker, up to its end for an
    /// ended one. Each interval's charge and the move of `billed_until_ms`
    /// commit together, guarded on the old value, and the ledger id names
    /// the worker and the interval's start: several processes accruing at
    /// once, or one retrying, charge every second exactly once. Returns the
    /// micro-USD charged.
    pub async fn accrue_workers(&self, now_ms: i64) -> Result<i64, ContainerError> {
        let rows = worker::Entity::find()
            .filter(
                sea_orm::Condition::any()
                    .add(worker::Column::EndedAtMs.is_null())
                    .add(Expr::cust("billed_until_ms < ended_at_ms")),
            )
            .all(&self.db)
            .await?;
        let stretches = rows.into_iter().map(|row| Stretch {
            id: row.id,
            user_id: row.user_id,
            subject: row.endpoint_id,
            unit: if row.gpu_count > 0 {
                GPU_WORKER_SECONDS
            } else {
                CPU_WORKER_SECONDS
            },
            created_at_ms: row.created_at_ms,
            billed_until_ms: row.billed_until_ms,
            ended_at_ms: row.ended_at_ms,
            hourly_micro_usd: row.hourly_micro_usd,
        });
        accrue(&self.db, "endpoint_workers", stretches, now_ms).await
    }
}

trait InsertRow {
    async fn insert_row<C: ConnectionTrait>(self, db: &C) -> Result<(), DbErr>;
}

impl<A> InsertRow for A
where
    A: sea_orm::ActiveModelTrait + Send,
{
    async fn insert_row<C: ConnectionTrait>(self, db: &C) -> Result<(), DbErr> {
        <A::Entity as EntityTrait>::insert(self)
            .exec_without_returning(db)
            .await?;
        Ok(())
    }
}

async fn insert_release<C: ConnectionTrait>(
    db: &C,
    endpoint_id: &str,
    version: u32,
    diff: &[DiffEntry],
    by: &str,
    at_ms: i64,
) -> Result<(), DbErr> {
    release::ActiveModel {
        endpoint_id: Set(endpoint_id.to_owned()),
        version: Set(version as i32),
        diff: Set(to_json(&diff)),
        created_by: Set(by.to_owned()),
        created_at_ms: Set(at_ms),
    }
    .insert_row(db)
    .await
}

/// The fields whose change replaces the workers, old and new.
/// A stretch of compute charged by the second: a serverless worker's life,
/// or one run of a pod (a row of `table` in [`accrue`]).
pub(crate) struct Stretch {
    pub id: String,
    pub user_id: String,
    /// The endpoint or pod, as the ledger's `model`.
    pub subject: String,
    /// The ledger unit (one of [`gantry_billing::history::Compute::parts`]).
    pub unit: &'static str,
    pub created_at_ms: i64,
    pub billed_until_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub hourly_micro_usd: i64,
}

/// Charges each stretch up to the last whole second before `now_ms` (or its
/// end). Each charge commits with the move of the row's `billed_until_ms` in
/// `table`, guarded on the old value, and its ledger id names the stretch and
/// the interval's start: several processes accruing at once, or one
/// retrying, charge every second exactly once. Returns the micro-USD charged.
pub(crate) async fn accrue(
    db: &DatabaseConnection,
    table: &'static str,
    stretches: impl IntoIterator<Item = Stretch>,
    now_ms: i64,
) -> Result<i64, ContainerError> {
    let backend = db.get_database_backend();
    let sql = format!("UPDATE {table} SET billed_until_ms = ? WHERE id = ? AND billed_until_ms = ?");
    let mut total = 0;
    for row in stretches {
        let Some((until, amount)) = next_charge(
            row.created_at_ms,
            row.billed_until_ms,
            row.ended_at_ms,
            now_ms,
            row.hourly_micro_usd,
        ) else {
            continue;
        };
        let charge = gantry_billing::Charge {
            user_id: row.user_id,
            job_id: format!("{}@{}", row.id, row.billed_until_ms),
            model: row.subject,
            unit: row.unit.into(),
            quantity_micros: (until - row.billed_until_ms) * 1000,
            amount_micro_usd: amount,
        };
        let txn = db.begin().await?;
        let moved = txn
            .execute_raw(statement(
                backend,
                &sql,
                vec![until.into(), row.id.into(), row.billed_until_ms.into()],
            ))
            .await?;
        if moved.rows_affected() == 1 {
            gantry_billing::record_charges(&txn, std::slice::from_ref(&charge), now_ms).await?;
            txn.commit().await?;
            total += amount;
        }
    }
    Ok(total)
}

/// The next charge of a stretch of compute that began at `created_ms`, is
/// charged up to `billed_until_ms` and ends at `ended_ms` (if it has): up to
/// the last whole second before `now_ms`, or to its end once ended. Returns
/// the new `billed_until_ms` and the amount, or `None` when nothing is due.
/// Rounding is cumulative from the start, so the parts add up to the whole
/// however the charges fall.
pub(crate) fn next_charge(
    created_ms: i64,
    billed_until_ms: i64,
    ended_ms: Option<i64>,
    now_ms: i64,
    hourly_micro_usd: i64,
) -> Option<(i64, i64)> {
    let end = ended_ms.map_or(now_ms, |ended| ended.min(now_ms));
    let until = if ended_ms.is_some_and(|ended| ended <= now_ms) {
        end
    } else {
        billed_until_ms + (end - billed_until_ms).div_euclid(1000) * 1000
    };
    if until <= billed_until_ms {
        return None;
    }
    let cost_to = |ms: i64| -> i64 {
        let elapsed = i128::from((ms - created_ms).max(0));
        i64::try_from(elapsed * i128::from(hourly_micro_usd) / 3_600_000).unwrap_or(i64::MAX)
    };
    Some((until, cost_to(until) - cost_to(billed_until_ms)))
}

pub fn release_diff(old: Option<&EndpointSpec>, new: &EndpointSpec) -> Vec<DiffEntry> {
    let view = |spec: Option<&EndpointSpec>| -> Vec<(&'static str, Value)> {
        let Some(spec) = spec else {
            return Vec::new();
        };
        let c = &spec.container;
        vec![
            ("image", json!(c.image)),
            ("args", json!(c.args)),
            ("env", json!(c.env)),
            ("ports", json!(c.ports)),
            ("disk", json!(c.disk)),
            ("registry", json!(c.registry)),
            ("gpu", json!(spec.gpu)),
            ("cpu", json!(spec.cpu)),
            ("networkVolumes", json!(spec.network_volumes)),
        ]
    };
    let before = view(old);
    view(Some(new))
        .into_iter()
        .filter_map(|(field, new)| {
            let old = before
                .iter()
                .find(|(f, _)| *f == field)
                .map_or(Value::Null, |(_, v)| v.clone());
            (old != new).then(|| DiffEntry {
                field: field.to_owned(),
                old,
                new,
            })
        })
        .collect()
}

fn template_of(row: template::Model) -> Result<Template, ContainerError> {
    let mut template: Template = serde_json::from_str(&row.body).map_err(|e| ContainerError::Corrupt(e.to_string()))?;
    template.id = row.id;
    Ok(template)
}

fn endpoint_of(row: endpoint::Model) -> Result<EndpointRecord, ContainerError> {
    Ok(EndpointRecord {
        spec: serde_json::from_str(&row.body).map_err(|e| ContainerError::Corrupt(e.to_string()))?,
        id: row.id,
        user_id: row.user_id,
        version: u32::try_from(row.version).unwrap_or(1),
        created_at_ms: row.created_at_ms,
        updated_at_ms: row.updated_at_ms,
        deleted: row.deleted_at_ms.is_some(),
        throttled: u32::try_from(row.throttled).unwrap_or(0),
        throttled_reason: row.throttled_reason,
    })
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// `prefix` and 12 random lowercase letters and digits.
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let tail: String = (0..12)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{prefix}{tail}")
}

/// A raw statement written with `?` placeholders, spelled as `backend` wants
/// them (`$1`, `$2`, … on PostgreSQL).
pub(crate) fn statement(backend: sea_orm::DbBackend, sql: &str, values: Vec<sea_orm::Value>) -> sea_orm::Statement {
    sea_orm::Statement::from_sql_and_values(backend, gantry_billing::history::placeholders(backend, sql), values)
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
