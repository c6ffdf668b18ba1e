-- compatibility: additive (three columns with defaults; no function changes)
--
-- Loads (rules P1-P5): the load-aware policy shares the work, not the bucket count. A worker
-- records the loads its application measured on the buckets it owns (`lease.shards.load`),
-- and its work as of that publication (`lease.members.load`, the sum, and `hottest`, the
-- largest), only when they moved beyond a threshold. A bucket keeps its last load through
-- release, leave and takeover (P4), so that a claimer can tell a hot bucket from a cold one.
--
-- Loads are whole millionths of the application's unit, so that every worker adds and
-- compares them exactly. The heartbeat reads them in the statement that calls
-- `lease.heartbeat` (a member's work beside its bucket count, the claimable buckets with a
-- load); no function changes, so the previous release's binaries run on unchanged.
--
-- Upgrade: additive. `leasectl migrate` while the previous release runs, then roll the
-- binaries. The previous release neither writes nor reads the columns: its members weigh 0
-- until they run this release.

ALTER TABLE lease.shards ADD COLUMN load bigint NOT NULL DEFAULT 0 CHECK (load >= 0);

ALTER TABLE lease.members
    ADD COLUMN load bigint NOT NULL DEFAULT 0 CHECK (load >= 0),
    ADD COLUMN hottest bigint NOT NULL DEFAULT 0 CHECK (hottest >= 0);
