//! The `lease` schema as diesel sees it (migrations in the workspace's `migrations/`).

diesel::table! {
    lease.groups (name) {
        name -> Text,
        shard_count -> Integer,
        created_at -> Timestamptz,
        generation -> BigInt,
        previous_count -> Nullable<Integer>,
    }
}

diesel::table! {
    lease.members (group_name, worker_id) {
        group_name -> Text,
        worker_id -> Uuid,
        session_id -> Uuid,
        expires_at -> Timestamptz,
        joined_at -> Timestamptz,
        heartbeat_at -> Timestamptz,
        owned -> Integer,
        metadata -> Text,
        incarnation -> Nullable<Uuid>,
    }
}

diesel::table! {
    lease.shards (group_name, bucket) {
        group_name -> Text,
        bucket -> Integer,
        owner_worker -> Nullable<Uuid>,
        owner_session -> Nullable<Uuid>,
        token -> BigInt,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    lease.draining_shards (group_name, bucket) {
        group_name -> Text,
        bucket -> Integer,
        owner_worker -> Nullable<Uuid>,
        owner_session -> Nullable<Uuid>,
        token -> BigInt,
    }
}
