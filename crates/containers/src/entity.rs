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
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
