//! Webhook signatures per the Standard Webhooks specification
//! (<https://www.standardwebhooks.com>): each delivery carries
//! `webhook-id`, `webhook-timestamp` (Unix seconds) and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! keyed with the job owner's secret (`whsec_` + base64 of 24 random bytes).
//! The secret is created on first use and shown or rotated with
//! `gantry users webhook-secret EMAIL [--rotate]`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};
use rand::RngExt;
use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter};

use gantry_jobs::now_ms;

const PREFIX: &str = "whsec_";

fn new_secret() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    format!("{PREFIX}{}", STANDARD.encode(bytes))
}

/// The user's secret, created if there is none yet (two processes creating
/// it at once agree on the one stored first).
pub async fn secret_for(db: &DatabaseConnection, user_id: &str) -> Result<String, DbErr> {
    if let Some(row) = webhook_secret::Entity::find_by_id(user_id.to_owned()).one(db).await? {
        return Ok(row.secret);
    }
    let mut insert = Query::insert();
    insert
        .into_table(webhook_secret::Entity)
        .columns([
            webhook_secret::Column::UserId,
            webhook_secret::Column::Secret,
            webhook_secret::Column::CreatedAtMs,
        ])
        .values_panic([user_id.into(), new_secret().into(), now_ms().into()])
        .on_conflict(
            OnConflict::column(webhook_secret::Column::UserId)
                .do_nothing()
                .to_owned(),
        );
    db.execute(&insert).await?;
    webhook_secret::Entity::find_by_id(user_id.to_owned())
        .one(db)
        .await?
        .map(|row| row.secret)
        .ok_or_else(|| DbErr::RecordNotFound("webhook secret".into()))
}

/// The user's webhook signing secret: the current one, or a new one that
/// replaces it when `rotate` (deliveries from then on are signed with it).
pub async fn webhook_secret(db: &DatabaseConnection, user_id: &str, rotate: bool) -> Result<String, DbErr> {
    let current = secret_for(db, user_id).await?;
    if !rotate {
        return Ok(current);
    }
    let fresh = new_secret();
    webhook_secret::Entity::update_many()
        .col_expr(webhook_secret::Column::Secret, Expr::value(fresh.as_str()))
        .col_expr(webhook_secret::Column::CreatedAtMs, Expr::value(now_ms()))
        .filter(webhook_secret::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(fresh)
}

/// The `webhook-signature` value of a delivery.
pub fn signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = STANDARD
        .decode(secret.strip_prefix(PREFIX).unwrap_or(secret))
        .unwrap_or_else(|_| secret.as_bytes().to_vec());
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&key)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook_secrets` table: one signing secret per user.
mod webhook_secret {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "webhook_secrets")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: String,
        pub secret: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries (their test suite's fixed secret, id, timestamp and body).
    #[test]
    fn matches_the_reference_example() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let sig = signature(
            secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}
