-- compatibility: additive (a nullable column the statements of earlier binaries never name)
--
-- A session belongs to the worker start (incarnation) that began it: only that incarnation may
-- extend it, so two processes given one worker id never share a session (the second is
-- refused until the first one's session ends). Rows written before this column existed hold
-- NULL: no incarnation can extend them, they end with their ttl.
ALTER TABLE lease.members ADD COLUMN incarnation uuid;
