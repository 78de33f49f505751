//! The `jobs`, `job_chunks`, `job_progress` and `worker_presence` tables (see the migrations for the schema).

pub mod job {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "jobs")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub model: String,
        pub status: String,
        #[sea_orm(column_type = "Text")]
        pub input: String,
        #[sea_orm(column_type = "Text", nullable)]
        pub output: Option<String>,
        #[sea_orm(column_type = "Text", nullable)]
        pub error: Option<String>,
        #[sea_orm(column_type = "Text", nullable)]
        pub webhook: Option<String>,
        pub low_priority: bool,
        pub sync: bool,
        pub execution_timeout_ms: i64,
        pub ttl_ms: i64,
        /// Dispatches so far; an attempt is identified by (id, attempt).
        pub attempt: i32,
        pub max_attempts: i32,
        /// Times the job went back to the queue after a failed or lost attempt, or a retry.
        pub retries: i32,
        pub worker_id: Option<String>,
        /// Scheduler instance running the job, and until when its lease holds.
        pub owner: Option<String>,
        pub lease_until_ms: Option<i64>,
        pub run_deadline_ms: Option<i64>,
        pub created_at_ms: i64,
        pub queued_at_ms: i64,
        pub started_at_ms: Option<i64>,
        pub completed_at_ms: Option<i64>,
        /// While queued or running: the TTL deadline; once finished: the end of result retention.
        pub expires_at_ms: i64,
        pub cost_micro_usd: Option<i64>,
        pub usage_unit: Option<String>,
        pub usage_quantity_micros: Option<i64>,
        /// Stream chunks already returned by `read_stream`.
        pub chunks_read: i64,
        /// Set while the webhook's delivery is pending: 0, or until when a
        /// scheduler holds it (see `webhooks.rs`); `None` without a webhook
        /// or once delivered.
        pub webhook_due_ms: Option<i64>,
        /// The W3C `traceparent` of the span that submitted the job: the
        /// spans that follow it (assignment, run, settlement) join its trace.
        #[sea_orm(column_type = "Text", nullable)]
        pub trace_context: Option<String>,
        /// The stored output files of a completed job: a JSON array of
        /// `gantry_dispatch::StoredFile`; `None` when it has none.
        #[sea_orm(column_type = "Text", nullable)]
        pub files: Option<String>,
        /// The most the job may cost (micro-USD), counted against its
        /// owner's balance while it is queued or running (`credit.rs`).
        pub hold_micro_usd: i64,
        /// What the worker reported with the completed attempt (JSON:
        /// `{"queueMs", "loadMs", "runMs"}`); shown in the job's status.
        pub worker_timings: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}

    /// A queued job of user `u` for unit tests (other crates': the
    /// `test-util` feature).
    #[cfg(any(test, feature = "test-util"))]
    pub fn sample(id: &str, model: &str) -> Model {
        Model {
            id: id.into(),
            user_id: "u".into(),
            model: model.into(),
            status: "IN_QUEUE".into(),
            input: "{}".into(),
            output: None,
            error: None,
            webhook: None,
            low_priority: false,
            sync: false,
            execution_timeout_ms: 1_000,
            ttl_ms: 60_000,
            attempt: 0,
            max_attempts: 3,
            retries: 0,
            worker_id: None,
            owner: None,
            lease_until_ms: None,
            run_deadline_ms: None,
            created_at_ms: 1,
            queued_at_ms: 1,
            started_at_ms: None,
            completed_at_ms: None,
            expires_at_ms: i64::MAX,
            cost_micro_usd: None,
            usage_unit: None,
            usage_quantity_micros: None,
            chunks_read: 0,
            webhook_due_ms: None,
            trace_context: None,
            files: None,
            hold_micro_usd: 0,
            worker_timings: None,
        }
    }
}

pub mod chunk {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "job_chunks")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub job_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub seq: i64,
        #[sea_orm(column_type = "Text")]
        pub output: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod progress {
    use sea_orm::entity::prelude::*;

    /// The latest progress message of a job's attempt (migration
    /// `m20261124_000014_job_progress`).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "job_progress")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub job_id: String,
        pub attempt: i32,
        #[sea_orm(column_type = "Text")]
        pub message: String,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod file {
    use sea_orm::entity::prelude::*;

    /// A stored object that a committed result references (see the
    /// migration `m20261124_000009_output_files`).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "files")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false, column_type = "Text")]
        pub key: String,
        pub job_id: String,
        pub user_id: String,
        pub media_type: String,
        pub size: i64,
        pub created_at_ms: i64,
        pub expires_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}

    /// The rows of a completed job's files, expiring `lifetime_ms` after
    /// each was created.
    pub fn of_job(row: &super::job::Model, lifetime_ms: i64) -> Vec<Model> {
        let Some(files) = row.files.as_deref() else {
            return Vec::new();
        };
        let files: Vec<gantry_dispatch::StoredFile> = serde_json::from_str(files).unwrap_or_default();
        files
            .into_iter()
            .map(|f| Model {
                key: f.key,
                job_id: row.id.clone(),
                user_id: row.user_id.clone(),
                media_type: f.media_type,
                size: i64::try_from(f.size).unwrap_or(i64::MAX),
                created_at_ms: f.created_ms,
                expires_at_ms: f.created_ms.saturating_add(lifetime_ms),
            })
            .collect()
    }
}

pub mod worker_gpu {
    use sea_orm::entity::prelude::*;

    /// GPUs reported by one scheduler's workers (see `Core::publish_presence`).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "worker_gpus")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub scheduler_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub gpu_name: String,
        pub workers: i32,
        pub memory_bytes: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod presence {
    use sea_orm::entity::prelude::*;

    /// Worker counts of one scheduler instance for one model (see `Core::publish_presence`).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "worker_presence")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub scheduler_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub model: String,
        pub idle: i32,
        pub running: i32,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
