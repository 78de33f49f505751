//! Clusters: `pod_count` pods of one GPU shape, started together on a private network of their
//! own, where each member reaches the others as `node-<rank>`. A member is an ordinary pod (its
//! configuration names the cluster and its rank), so the pod reconciler runs it, bills it and keeps
//! its log; this module keeps the cluster itself and acts on its members as a group.

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::entity::{cluster, pod};
use crate::pods::{ClusterMember, POD_PREFIX, PodPrices, PodRecord, PodSpec, PodStatus, new_pod_row};
use crate::service::{ContainerError, ContainerService, new_id, now_ms};

/// Prefix of cluster ids.
pub const CLUSTER_PREFIX: &str = "cluster_";

/// What a cluster is for (the reference's types; Gantry runs them alike: roles are not assigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClusterKind {
    Application,
    Training,
    Slurm,
    Ray,
}

impl ClusterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterKind::Application => "APPLICATION",
            ClusterKind::Training => "TRAINING",
            ClusterKind::Slurm => "SLURM",
            ClusterKind::Ray => "RAY",
        }
    }

    pub fn parse(text: &str) -> Option<ClusterKind> {
        [
            ClusterKind::Application,
            ClusterKind::Training,
            ClusterKind::Slurm,
            ClusterKind::Ray,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// The shape every member has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterCompute {
    /// GPU type of every pod (`id` of `/v2/catalog/gpus`).
    #[schema(min_length = 1)]
    pub gpu_type_id: String,
    /// GPUs on each pod.
    #[schema(minimum = 1)]
    pub gpu_count_per_pod: u32,
    /// Pods in the cluster.
    #[schema(minimum = 2, maximum = 250)]
    pub pod_count: u32,
}

/// A cluster as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterRecord {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub kind: ClusterKind,
    pub compute: ClusterCompute,
    pub template: Option<String>,
    pub created_at_ms: i64,
}

impl ClusterRecord {
    fn from_row(row: cluster::Model) -> Result<Self, ContainerError> {
        Ok(ClusterRecord {
            kind: ClusterKind::parse(&row.kind)
                .ok_or_else(|| ContainerError::Corrupt(format!("cluster {}: type {}", row.id, row.kind)))?,
            compute: ClusterCompute {
                gpu_type_id: row.gpu_type_id,
                gpu_count_per_pod: u32::try_from(row.gpu_count_per_pod).unwrap_or(0),
                pod_count: u32::try_from(row.pod_count).unwrap_or(0),
            },
            id: row.id,
            user_id: row.user_id,
            name: row.name,
            template: row.template_id,
            created_at_ms: row.created_at_ms,
        })
    }
}

impl ContainerService {
    fn open_clusters(&self, owner: &str) -> sea_orm::Select<cluster::Entity> {
        cluster::Entity::find()
            .filter(cluster::Column::UserId.eq(owner))
            .filter(cluster::Column::DeletedAtMs.is_null())
    }

    /// A new cluster and its members (pods `<name>-<rank>` of `spec`), in one transaction, to be
    /// started at once.
    pub async fn create_cluster(
        &self,
        owner: &str,
        name: &str,
        kind: ClusterKind,
        compute: ClusterCompute,
        spec: PodSpec,
        prices: PodPrices,
    ) -> Result<ClusterRecord, ContainerError> {
        let now = now_ms();
        let id = new_id(CLUSTER_PREFIX);
        let tx = self.db().begin().await?;
        cluster::Entity::insert(cluster::ActiveModel {
            id: Set(id.clone()),
            user_id: Set(owner.to_owned()),
            name: Set(name.to_owned()),
            kind: Set(kind.as_str().to_owned()),
            gpu_type_id: Set(compute.gpu_type_id.clone()),
            gpu_count_per_pod: Set(i32::try_from(compute.gpu_count_per_pod).unwrap_or(i32::MAX)),
            pod_count: Set(i32::try_from(compute.pod_count).unwrap_or(i32::MAX)),
            template_id: Set(spec.template.clone()),
            created_at_ms: Set(now),
            deleted_at_ms: Set(None),
            network_removed: Set(false),
        })
        .exec_without_returning(&tx)
        .await?;
        let mut members = Vec::new();
        for rank in 0..compute.pod_count {
            let mut member = spec.clone();
            member.cluster = Some(ClusterMember {
                id: id.clone(),
                rank,
                size: compute.pod_count,
            });
            let pod_id = new_id(POD_PREFIX);
            pod::Entity::insert(new_pod_row(
                &pod_id,
                owner,
                &format!("{name}-{rank}"),
                &member,
                prices,
                now,
            )?)
            .exec_without_returning(&tx)
            .await?;
            members.push(pod_id);
        }
        tx.commit().await?;
        for pod_id in &members {
            self.pod_event(pod_id, &format!("pod created as a member of cluster {id}"))
                .await?;
        }
        self.get_cluster(owner, &id).await
    }

    pub async fn list_clusters(&self, owner: &str) -> Result<Vec<ClusterRecord>, ContainerError> {
        self.open_clusters(owner)
            .order_by_asc(cluster::Column::CreatedAtMs)
            .order_by_asc(cluster::Column::Id)
            .all(self.db())
            .await?
            .into_iter()
            .map(ClusterRecord::from_row)
            .collect()
    }

    pub async fn get_cluster(&self, owner: &str, id: &str) -> Result<ClusterRecord, ContainerError> {
        let row = self
            .open_clusters(owner)
            .filter(cluster::Column::Id.eq(id))
            .one(self.db())
            .await?
            .ok_or(ContainerError::NotFound("cluster"))?;
        ClusterRecord::from_row(row)
    }

    /// Renames a cluster (the only change a cluster takes).
    pub async fn rename_cluster(&self, owner: &str, id: &str, name: &str) -> Result<ClusterRecord, ContainerError> {
        let done = cluster::Entity::update_many()
            .col_expr(cluster::Column::Name, Expr::value(name.to_owned()))
            .filter(cluster::Column::Id.eq(id))
            .filter(cluster::Column::UserId.eq(owner))
            .filter(cluster::Column::DeletedAtMs.is_null())
            .exec(self.db())
            .await?;
        if done.rows_affected == 0 {
            return Err(ContainerError::NotFound("cluster"));
        }
        self.get_cluster(owner, id).await
    }

    /// The cluster's members, by rank (the owner's pods that name it).
    pub async fn cluster_members(&self, owner: &str, id: &str) -> Result<Vec<PodRecord>, ContainerError> {
        let mut members: Vec<PodRecord> = self
            .list_pods(owner)
            .await?
            .into_iter()
            .filter(|p| p.spec.cluster.as_ref().is_some_and(|c| c.id == id))
            .collect();
        members.sort_by_key(|p| p.spec.cluster.as_ref().map_or(0, |c| c.rank));
        Ok(members)
    }

    /// Deletes a cluster: every member is terminated (its container removed, its billing closed)
    /// and then its network. The cluster and its members are marked in one transaction, so a
    /// crash never leaves a member of a deleted cluster (which takes no delete of its own).
    pub async fn delete_cluster(&self, owner: &str, id: &str) -> Result<(), ContainerError> {
        let members: Vec<String> = self
            .cluster_members(owner, id)
            .await?
            .into_iter()
            .map(|m| m.id)
            .collect();
        let now = now_ms();
        let tx = self.db().begin().await?;
        let done = cluster::Entity::update_many()
            .col_expr(cluster::Column::DeletedAtMs, Expr::value(now))
            .filter(cluster::Column::Id.eq(id))
            .filter(cluster::Column::UserId.eq(owner))
            .filter(cluster::Column::DeletedAtMs.is_null())
            .exec(&tx)
            .await?;
        if done.rows_affected == 0 {
            return Err(ContainerError::NotFound("cluster"));
        }
        pod::Entity::update_many()
            .col_expr(pod::Column::DeletedAtMs, Expr::value(now))
            .col_expr(pod::Column::UpdatedAtMs, Expr::value(now))
            .col_expr(pod::Column::Desired, Expr::value(PodStatus::Terminated.as_str()))
            .filter(pod::Column::Id.is_in(members.iter().map(String::as_str)))
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::DeletedAtMs.is_null())
            .exec(&tx)
            .await?;
        tx.commit().await?;
        for member in &members {
            self.pod_event(member, &format!("pod deleted with cluster {id}"))
                .await?;
        }
        Ok(())
    }

    /// Deleted clusters whose network is still there, with whether a member of theirs is still
    /// being terminated.
    pub async fn clusters_to_clean(&self) -> Result<Vec<(String, bool)>, ContainerError> {
        let deleted = cluster::Entity::find()
            .filter(cluster::Column::DeletedAtMs.is_not_null())
            .filter(cluster::Column::NetworkRemoved.eq(false))
            .all(self.db())
            .await?;
        if deleted.is_empty() {
            return Ok(Vec::new());
        }
        let busy: std::collections::HashSet<String> = self
            .pods_to_reconcile()
            .await?
            .into_iter()
            .filter(|p| p.status != PodStatus::Terminated)
            .filter_map(|p| p.spec.cluster.map(|c| c.id))
            .collect();
        Ok(deleted
            .into_iter()
            .map(|c| (c.id.clone(), busy.contains(&c.id)))
            .collect())
    }

    /// Records that a deleted cluster's network is gone.
    pub async fn cluster_cleaned(&self, id: &str) -> Result<(), ContainerError> {
        cluster::Entity::update_many()
            .col_expr(cluster::Column::NetworkRemoved, Expr::value(true))
            .filter(cluster::Column::Id.eq(id))
            .exec(self.db())
            .await?;
        Ok(())
    }

    /// Every cluster id of a user (deleted ones included) by member pod id, for billing.
    pub async fn cluster_of_pods(
        &self,
        owner: &str,
    ) -> Result<std::collections::HashMap<String, String>, ContainerError> {
        let rows = pod::Entity::find()
            .filter(pod::Column::UserId.eq(owner))
            .filter(pod::Column::Body.contains("\"cluster\""))
            .all(self.db())
            .await?;
        let mut map = std::collections::HashMap::new();
        for row in rows {
            if let Ok(spec) = serde_json::from_str::<PodSpec>(&row.body)
                && let Some(member) = spec.cluster
            {
                map.insert(row.id, member.id);
            }
        }
        Ok(map)
    }
}
