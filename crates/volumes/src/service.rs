use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gantry_catalog::VolumeType;
use rand::RngExt;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    TransactionTrait,
};

use crate::cache::ListCache;
use crate::entity::{self, Column, Entity};
use crate::model::{NetworkVolume, NewVolume, VolumeUpdate};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("network volume not found")]
    NotFound,
    #[error("network volume size cannot be reduced (current {current} GB, requested {requested} GB)")]
    SizeDecrease { current: u32, requested: u32 },
    #[error("an update needs at least one of name, size")]
    EmptyUpdate,
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// Network volumes, always scoped to their owner: another user's volume is
/// indistinguishable from one that does not exist.
#[derive(Clone)]
pub struct VolumeService {
    db: DatabaseConnection,
    cache: Option<Arc<ListCache>>,
}

impl VolumeService {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db, cache: None }
    }

    /// Serves lists from memory. Only for a process that is the sole writer of the
    /// volumes table (the caller guarantees it, e.g. with a lock on the SQLite file).
    pub fn with_list_cache(mut self) -> Self {
        self.cache = Some(Arc::new(ListCache::default()));
        self
    }

    fn written(&self, owner: &str) {
        if let Some(cache) = &self.cache {
            cache.invalidate(owner);
        }
    }

    /// The owner's volumes, oldest first.
    pub async fn list(&self, owner: &str) -> Result<Arc<Vec<NetworkVolume>>, VolumeError> {
        let generation = match self.cache.as_ref().map(|c| c.get(owner)) {
            Some(Ok(hit)) => return Ok(hit),
            Some(Err(generation)) => Some(generation),
            None => None,
        };
        let rows = Entity::find()
            .filter(Column::UserId.eq(owner))
            .order_by_asc(Column::CreatedAt)
            .order_by_asc(Column::Id)
            .all(&self.db)
            .await?;
        let list = Arc::new(rows.into_iter().map(view).collect::<Vec<_>>());
        if let (Some(cache), Some(generation)) = (&self.cache, generation) {
            cache.put(owner, generation, list.clone());
        }
        Ok(list)
    }

    pub async fn get(&self, owner: &str, id: &str) -> Result<NetworkVolume, VolumeError> {
        self.find(owner, id).await.map(view)
    }

    pub async fn create(&self, owner: &str, new: NewVolume) -> Result<NetworkVolume, VolumeError> {
        let now = unix_now();
        let row = entity::Model {
            id: new_volume_id(),
            user_id: owner.to_string(),
            name: new.name.as_str().to_string(),
            size: new.size.gb() as i32,
            data_center: new.data_center,
            volume_type: new.volume_type.as_str().to_string(),
            created_at: now,
            updated_at: now,
        };
        let active = entity::ActiveModel {
            id: Set(row.id.clone()),
            user_id: Set(row.user_id.clone()),
            name: Set(row.name.clone()),
            size: Set(row.size),
            data_center: Set(row.data_center.clone()),
            volume_type: Set(row.volume_type.clone()),
            created_at: Set(now),
            updated_at: Set(now),
        };
        Entity::insert(active).exec_without_returning(&self.db).await?;
        self.written(owner);
        Ok(view(row))
    }

    /// Renames and/or grows a volume. The size guard is part of the UPDATE itself,
    /// so two racing resizes can never shrink a volume.
    pub async fn update(&self, owner: &str, id: &str, update: VolumeUpdate) -> Result<NetworkVolume, VolumeError> {
        if update.name.is_none() && update.size.is_none() {
            return Err(VolumeError::EmptyUpdate);
        }
        let mut query = Entity::update_many()
            .col_expr(Column::UpdatedAt, Expr::value(unix_now()))
            .filter(Column::Id.eq(id))
            .filter(Column::UserId.eq(owner));
        if let Some(name) = &update.name {
            query = query.col_expr(Column::Name, Expr::value(name.as_str()));
        }
        if let Some(size) = update.size {
            let gb = size.gb() as i32;
            query = query
                .col_expr(Column::Size, Expr::value(gb))
                .filter(Column::Size.lte(gb));
        }
        // The row stays locked until commit, so the read below sees exactly this update,
        // not one that a concurrent request commits in between.
        let txn = self.db.begin().await?;
        let result = query.exec(&txn).await?;
        let current = find(&txn, owner, id).await;
        txn.commit().await?;
        if result.rows_affected > 0 {
            self.written(owner);
        }
        let current = current?;
        if let (0, Some(size)) = (result.rows_affected, update.size) {
            return Err(VolumeError::SizeDecrease {
                current: current.size as u32,
                requested: size.gb(),
            });
        }
        Ok(view(current))
    }

    pub async fn delete(&self, owner: &str, id: &str) -> Result<(), VolumeError> {
        let result = Entity::delete_many()
            .filter(Column::Id.eq(id))
            .filter(Column::UserId.eq(owner))
            .exec(&self.db)
            .await?;
        if result.rows_affected == 0 {
            return Err(VolumeError::NotFound);
        }
        self.written(owner);
        Ok(())
    }

    async fn find(&self, owner: &str, id: &str) -> Result<entity::Model, VolumeError> {
        find(&self.db, owner, id).await
    }
}

async fn find(db: &impl ConnectionTrait, owner: &str, id: &str) -> Result<entity::Model, VolumeError> {
    Entity::find()
        .filter(Column::Id.eq(id))
        .filter(Column::UserId.eq(owner))
        .one(db)
        .await?
        .ok_or(VolumeError::NotFound)
}

fn view(row: entity::Model) -> NetworkVolume {
    NetworkVolume {
        id: row.id,
        name: row.name,
        size: row.size.max(0) as u32,
        data_center: row.data_center,
        volume_type: VolumeType::parse(&row.volume_type).unwrap_or(VolumeType::Standard),
    }
}

/// Microseconds since the epoch: fine enough that listing by creation time is stable.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Ten lowercase base-36 characters, like the reference's `agv6w2qcg7`.
fn new_volume_id() -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    (0..10)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}
