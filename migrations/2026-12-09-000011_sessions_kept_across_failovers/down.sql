-- Back to migration 10: the heartbeat that keeps sessions and its helpers go, with the
-- columns they wrote.
DROP FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[],
                              timestamptz[], uuid, bigint, bigint);
DROP FUNCTION lease.record_timeline(bigint, timestamptz);
DROP FUNCTION lease.wal_offset();
ALTER TABLE lease.nodes DROP COLUMN crossed;
ALTER TABLE lease.server_epochs DROP COLUMN switch_offset;
