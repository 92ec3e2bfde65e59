-- The ledger's row id loses its index.  Nothing looks a row up by id: the
-- readers go by key, user or time, and id only breaks ties in the order
-- of GET /api/log.  Its B-tree was a tenth of what a ledger row costs the
-- database.  Ids still come from logs_id_seq, so they stay unique; the
-- key of a row is (request_id, type), which the unique index already
-- enforces, and which replication now uses to identify rows.

ALTER TABLE logs DROP CONSTRAINT IF EXISTS logs_pkey;
ALTER TABLE logs REPLICA IDENTITY USING INDEX logs_request_id_type_key;
