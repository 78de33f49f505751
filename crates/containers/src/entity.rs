//! The tables (migration `m20261128_000015_containers`). Configurations are
//! JSON documents of the types in [`crate::spec`]: they are read and written
//! whole, and the columns beside them are what queries filter on.

pub mod template {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "templates")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub name: String,
        pub public: bool,
        pub serverless: bool,
        /// The [`crate::spec::Template`] without its id, as JSON.
        pub body: String,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod registry {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "registries")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub name: String,
        /// `{"username", "password"}`, sealed ([`crate::SecretBox`]).
        pub credential: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod endpoint {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "endpoints")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        /// The [`crate::spec::EndpointSpec`] as JSON.
        pub body: String,
        pub template_id: Option<String>,
        pub version: i32,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
        /// Set by a delete: the endpoint is gone for its owner, and the
        /// reconciler removes its workers.
        pub deleted_at_ms: Option<i64>,
        /// Workers the fleet's leader wants and cannot start for want of
        /// GPUs, at its last look, and why.
        pub throttled: i32,
        pub throttled_reason: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod release {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "endpoint_releases")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub endpoint_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub version: i32,
        /// `[{field, old, new}]` as JSON.
        pub diff: String,
        pub created_by: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod worker {
    use sea_orm::entity::prelude::*;

    /// One worker container of an endpoint, from the reconciler's decision to
    /// run it to its removal; also what its seconds are billed from.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "endpoint_workers")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub endpoint_id: String,
        pub user_id: String,
        pub version: i32,
        pub image: String,
        pub gpu_count: i32,
        /// The price of the worker's compute, micro-USD per hour.
        pub hourly_micro_usd: i64,
        pub created_at_ms: i64,
        /// Seconds before this are charged.
        pub billed_until_ms: i64,
        /// When the container was removed (billing stops here).
        pub ended_at_ms: Option<i64>,
        /// Why it ended, or why it could not start.
        pub reason: Option<String>,
        /// The instance whose listener the worker calls (its session's
        /// process), from its first call; None before it.
        pub host: Option<String>,
        /// Its first call.
        pub seen_at_ms: Option<i64>,
        /// Jobs it holds, as its host last published.
        pub held_jobs: i32,
        /// Since when it has held no job, as its host last published (None
        /// while it holds one, or before its first call).
        pub idle_since_ms: Option<i64>,
        /// The leader's request to its host: `retire` or `drain`.
        pub stop_request: Option<String>,
        /// Why Kubernetes has no node for its Pod yet (the scheduler's
        /// message), while it has none: a throttled worker, not billed.
        pub unschedulable: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod pod {
    use sea_orm::entity::prelude::*;

    /// A pod (migration `m20261128_000016_pods`): what its owner asked for
    /// (`desired`, `version`, `restart_at_ms`) and what the reconciler last
    /// saw (`status`, `reason`).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "pods")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub name: String,
        /// The [`crate::pods::PodSpec`] as JSON.
        pub body: String,
        /// RUNNING, EXITED or TERMINATED.
        pub desired: String,
        pub status: String,
        pub reason: Option<String>,
        pub locked: bool,
        /// The network volume it mounts, if any (a volume in use is not deleted).
        pub volume_id: Option<String>,
        /// Bumped by a change that needs a new container.
        pub version: i32,
        /// A restart asked for at this time restarts a run begun before it.
        pub restart_at_ms: i64,
        pub hourly_micro_usd: i64,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
        pub started_at_ms: Option<i64>,
        pub deleted_at_ms: Option<i64>,
        /// What its disk costs per hour while it is stopped (migration
        /// `m20261128_000018_pod_disk`).
        pub disk_hourly_micro_usd: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod pod_run {
    use sea_orm::entity::prelude::*;

    /// One stretch of a pod's container running (`kind` [`RUN`]), or of
    /// its disk kept while it is stopped ([`DISK`]): billed from its start
    /// to its end, second by second.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "pod_runs")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub pod_id: String,
        pub user_id: String,
        pub gpu_count: i32,
        pub hourly_micro_usd: i64,
        pub created_at_ms: i64,
        pub billed_until_ms: i64,
        pub ended_at_ms: Option<i64>,
        pub kind: String,
    }

    pub const RUN: &str = "run";
    pub const DISK: &str = "disk";

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod pod_event {
    use sea_orm::entity::prelude::*;

    /// A system line of a pod's log (pull, start, stop, exit code, error).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "pod_events")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub pod_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub at_ms: i64,
        #[sea_orm(primary_key, auto_increment = false)]
        pub seq: i64,
        pub line: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod ssh_key {
    use sea_orm::entity::prelude::*;

    /// An account's SSH public keys, a JSON array of authorized_keys lines.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "ssh_keys")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: String,
        pub keys: String,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod cluster {
    use sea_orm::entity::prelude::*;

    /// A cluster (migration `m20261129_000020_clusters`); its members are pods
    /// whose configuration names it.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "clusters")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub name: String,
        /// APPLICATION, TRAINING, SLURM or RAY.
        pub kind: String,
        pub gpu_type_id: String,
        pub gpu_count_per_pod: i32,
        pub pod_count: i32,
        pub template_id: Option<String>,
        pub created_at_ms: i64,
        pub deleted_at_ms: Option<i64>,
        /// Its network is gone (after its members).
        pub network_removed: bool,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
