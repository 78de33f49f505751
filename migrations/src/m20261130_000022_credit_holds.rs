use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `credit_accounts.held_micro_usd`: the sum of the holds of the user's
/// queued and running jobs, kept by triggers on `jobs` in the transaction of
/// every write that moves a job into or out of those states (an insert, a
/// status change, a delete), on both backends. The credit admission reads it
/// from the account row it already locks, instead of summing the user's jobs
/// in flight on every submit (which read every one of them: a submit cost
/// more the deeper its caller's queue). Being kept by the database, it
/// follows every writer of `jobs`, present and future, with no path of its
/// own to forget; the parity tests of the transitions check it against the
/// sum after each one. The existing holds are summed into it here.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "ALTER TABLE credit_accounts ADD COLUMN held_micro_usd BIGINT NOT NULL DEFAULT 0",
            "INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms, held_micro_usd) \
             SELECT user_id, 0, MIN(created_at_ms), SUM(hold_micro_usd) FROM jobs \
             WHERE status IN ('IN_QUEUE', 'IN_PROGRESS') GROUP BY user_id \
             ON CONFLICT (user_id) DO UPDATE SET held_micro_usd = excluded.held_micro_usd",
        ] {
            db.execute_unprepared(statement).await?;
        }
        let triggers: &[&str] = match manager.get_database_backend() {
            DbBackend::Postgres => &[
                // Subtracts what the old row held and adds what the new one
                // holds; the WHEN of each trigger fires it only where that
                // changes (a claim, IN_QUEUE -> IN_PROGRESS, does not).
                "CREATE FUNCTION gantry_job_holds() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN \
                   IF TG_OP <> 'INSERT' AND OLD.status IN ('IN_QUEUE', 'IN_PROGRESS') THEN \
                     UPDATE credit_accounts SET held_micro_usd = held_micro_usd - OLD.hold_micro_usd \
                     WHERE user_id = OLD.user_id; \
                   END IF; \
                   IF TG_OP <> 'DELETE' AND NEW.status IN ('IN_QUEUE', 'IN_PROGRESS') THEN \
                     INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms, held_micro_usd) \
                     VALUES (NEW.user_id, 0, NEW.created_at_ms, NEW.hold_micro_usd) \
                     ON CONFLICT (user_id) DO UPDATE \
                     SET held_micro_usd = credit_accounts.held_micro_usd + excluded.held_micro_usd; \
                   END IF; \
                   RETURN NULL; \
                 END $$",
                "CREATE TRIGGER jobs_holds_insert AFTER INSERT ON jobs FOR EACH ROW \
                 WHEN (NEW.status IN ('IN_QUEUE', 'IN_PROGRESS')) EXECUTE FUNCTION gantry_job_holds()",
                "CREATE TRIGGER jobs_holds_update AFTER UPDATE OF status, hold_micro_usd, user_id ON jobs FOR EACH ROW \
                 WHEN ((OLD.status IN ('IN_QUEUE', 'IN_PROGRESS')) IS DISTINCT FROM (NEW.status IN ('IN_QUEUE', 'IN_PROGRESS')) \
                   OR OLD.hold_micro_usd IS DISTINCT FROM NEW.hold_micro_usd OR OLD.user_id IS DISTINCT FROM NEW.user_id) \
                 EXECUTE FUNCTION gantry_job_holds()",
                "CREATE TRIGGER jobs_holds_delete AFTER DELETE ON jobs FOR EACH ROW \
                 WHEN (OLD.status IN ('IN_QUEUE', 'IN_PROGRESS')) EXECUTE FUNCTION gantry_job_holds()",
            ],
            _ => &[
                "CREATE TRIGGER jobs_holds_insert AFTER INSERT ON jobs \
                 WHEN NEW.status IN ('IN_QUEUE', 'IN_PROGRESS') BEGIN \
                   INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms, held_micro_usd) \
                   VALUES (NEW.user_id, 0, NEW.created_at_ms, NEW.hold_micro_usd) \
                   ON CONFLICT (user_id) DO UPDATE \
                   SET held_micro_usd = credit_accounts.held_micro_usd + excluded.held_micro_usd; \
                 END",
                // An update is two triggers, so that each move runs one
                // statement: leaving the states in flight (a completion, a
                // failure, a cancel) takes the old hold off, entering them (a
                // retry) adds the new one; a hold or owner changed in flight
                // fires both.
                "CREATE TRIGGER jobs_holds_leave AFTER UPDATE OF status, hold_micro_usd, user_id ON jobs \
                 WHEN OLD.status IN ('IN_QUEUE', 'IN_PROGRESS') AND (NEW.status NOT IN ('IN_QUEUE', 'IN_PROGRESS') \
                   OR OLD.hold_micro_usd IS NOT NEW.hold_micro_usd OR OLD.user_id IS NOT NEW.user_id) BEGIN \
                   UPDATE credit_accounts SET held_micro_usd = held_micro_usd - OLD.hold_micro_usd \
                   WHERE user_id = OLD.user_id; \
                 END",
                "CREATE TRIGGER jobs_holds_enter AFTER UPDATE OF status, hold_micro_usd, user_id ON jobs \
                 WHEN NEW.status IN ('IN_QUEUE', 'IN_PROGRESS') AND (OLD.status NOT IN ('IN_QUEUE', 'IN_PROGRESS') \
                   OR OLD.hold_micro_usd IS NOT NEW.hold_micro_usd OR OLD.user_id IS NOT NEW.user_id) BEGIN \
                   INSERT INTO credit_accounts (user_id, balance_micro_usd, updated_at_ms, held_micro_usd) \
                   VALUES (NEW.user_id, 0, NEW.created_at_ms, NEW.hold_micro_usd) \
                   ON CONFLICT (user_id) DO UPDATE \
                   SET held_micro_usd = credit_accounts.held_micro_usd + excluded.held_micro_usd; \
                 END",
                "CREATE TRIGGER jobs_holds_delete AFTER DELETE ON jobs \
                 WHEN OLD.status IN ('IN_QUEUE', 'IN_PROGRESS') BEGIN \
                   UPDATE credit_accounts SET held_micro_usd = held_micro_usd - OLD.hold_micro_usd \
                   WHERE user_id = OLD.user_id; \
                 END",
            ],
        };
        for trigger in triggers {
            db.execute_unprepared(trigger).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let postgres = manager.get_database_backend() == DbBackend::Postgres;
        let triggers: &[&str] = if postgres {
            &["jobs_holds_insert", "jobs_holds_update", "jobs_holds_delete"]
        } else {
            &[
                "jobs_holds_insert",
                "jobs_holds_leave",
                "jobs_holds_enter",
                "jobs_holds_delete",
            ]
        };
        for trigger in triggers {
            let on = if postgres { " ON jobs" } else { "" };
            db.execute_unprepared(&format!("DROP TRIGGER {trigger}{on}")).await?;
        }
        if postgres {
            db.execute_unprepared("DROP FUNCTION gantry_job_holds()").await?;
        }
        db.execute_unprepared("ALTER TABLE credit_accounts DROP COLUMN held_micro_usd")
            .await?;
        Ok(())
    }
}
