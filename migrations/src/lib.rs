//! One migration set for both backends: SQLite (embedded) and PostgreSQL (distributed).
pub use sea_orm_migration::prelude::*;

mod m20261121_000001_accounts_and_volumes;
mod m20261121_000002_user_rate_limits;
mod m20261121_000003_jobs_and_billing;
mod m20261121_000004_worker_presence;
mod m20261122_000005_fewer_job_indexes;
mod m20261122_000006_narrow_job_writes;
mod m20261122_000007_webhook_outbox;
mod m20261123_000008_job_trace_context;
mod m20261124_000009_output_files;
mod m20261124_000010_webhook_secrets;
mod m20261124_000011_credit;
mod m20261124_000012_storage_charges;
mod m20261124_000013_worker_gpus;
mod m20261124_000014_job_progress;
mod m20261128_000015_containers;
mod m20261128_000016_pods;
mod m20261128_000017_console;
mod m20261128_000018_pod_disk;
mod m20261129_000019_worker_timings;
mod m20261129_000020_clusters;
mod m20261130_000021_worker_hosts;
mod m20261130_000022_credit_holds;
mod m20261130_000023_throttled_workers;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261121_000001_accounts_and_volumes::Migration),
            Box::new(m20261121_000002_user_rate_limits::Migration),
            Box::new(m20261121_000003_jobs_and_billing::Migration),
            Box::new(m20261121_000004_worker_presence::Migration),
            Box::new(m20261122_000005_fewer_job_indexes::Migration),
            Box::new(m20261122_000006_narrow_job_writes::Migration),
            Box::new(m20261122_000007_webhook_outbox::Migration),
            Box::new(m20261123_000008_job_trace_context::Migration),
            Box::new(m20261124_000009_output_files::Migration),
            Box::new(m20261124_000010_webhook_secrets::Migration),
            Box::new(m20261124_000011_credit::Migration),
            Box::new(m20261124_000012_storage_charges::Migration),
            Box::new(m20261124_000013_worker_gpus::Migration),
            Box::new(m20261124_000014_job_progress::Migration),
            Box::new(m20261128_000015_containers::Migration),
            Box::new(m20261128_000016_pods::Migration),
            Box::new(m20261128_000017_console::Migration),
            Box::new(m20261128_000018_pod_disk::Migration),
            Box::new(m20261129_000019_worker_timings::Migration),
            Box::new(m20261129_000020_clusters::Migration),
            Box::new(m20261130_000021_worker_hosts::Migration),
            Box::new(m20261130_000022_credit_holds::Migration),
            Box::new(m20261130_000023_throttled_workers::Migration),
        ]
    }
}
