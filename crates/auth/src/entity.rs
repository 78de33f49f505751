pub mod user {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "users")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        #[sea_orm(unique)]
        pub email: String,
        pub created_at: i64,
        pub rate_minute: Option<i64>,
        pub rate_hour: Option<i64>,
        pub rate_day: Option<i64>,
        pub rate_exempt: bool,
        /// The console password as an argon2id PHC string; `None`: no console sign-in.
        #[sea_orm(column_type = "Text", nullable)]
        pub password_hash: Option<String>,
        /// `user` or `admin` (the console's operator pages).
        pub role: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod api_key {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "api_keys")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub name: Option<String>,
        pub prefix: String,
        pub last_four: String,
        #[sea_orm(unique)]
        pub key_hash: String,
        pub scopes: String,
        pub expires_at: Option<i64>,
        pub revoked_at: Option<i64>,
        pub created_at: i64,
        /// When a request last verified with the key (Unix seconds), written
        /// at most once per minute per key.
        pub last_used_at: Option<i64>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod console_session {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "console_sessions")]
    pub struct Model {
        /// SHA-256 (hex) of the cookie's token.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub csrf_token: String,
        /// Unix milliseconds.
        pub created_at: i64,
        pub expires_at: i64,
        pub ended_at: Option<i64>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
