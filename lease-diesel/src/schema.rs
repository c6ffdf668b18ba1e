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
    lease.nodes (node_id) {
        node_id -> Uuid,
        session_id -> Uuid,
        incarnation -> Uuid,
        started_at -> Timestamptz,
        heartbeat_at -> Timestamptz,
        expires_at -> Timestamptz,
        metadata -> Text,
        timeline -> BigInt,
        prior_expires_at -> Nullable<Timestamptz>,
        handed_over -> Bool,
    }
}

diesel::table! {
    lease.members (group_name, node_id) {
        group_name -> Text,
        node_id -> Uuid,
        joined_at -> Timestamptz,
        owned -> Integer,
    }
}

diesel::table! {
    lease.group_changes (group_name) {
        group_name -> Text,
        version -> BigInt,
    }
}

diesel::table! {
    lease.shards (group_name, bucket) {
        group_name -> Text,
        bucket -> Integer,
        owner_node -> Nullable<Uuid>,
        owner_session -> Nullable<Uuid>,
        token -> BigInt,
        updated_at -> Timestamptz,
        last_node -> Nullable<Uuid>,
        quarantined_until -> Nullable<Timestamptz>,
        quarantine_reason -> Nullable<Text>,
        tenures -> BigInt,
        load -> BigInt,
    }
}

diesel::table! {
    lease.tenures (group_name, bucket, slot) {
        group_name -> Text,
        bucket -> Integer,
        slot -> SmallInt,
        seq -> BigInt,
        token -> BigInt,
        owner_node -> Uuid,
        began_at -> Timestamptz,
        ended_at -> Nullable<Timestamptz>,
        reason -> Nullable<Text>,
    }
}

diesel::table! {
    lease.draining_shards (group_name, bucket) {
        group_name -> Text,
        bucket -> Integer,
        owner_node -> Nullable<Uuid>,
        owner_session -> Nullable<Uuid>,
        token -> BigInt,
    }
}
