-- Ledger row ids in blocks: each session that writes logs takes 1,000
-- ids at a time instead of locking the sequence for every row (a few per
-- cent of a ledger write).  Ids stay unique and increase within a session;
-- rows of different sessions interleave by id only roughly, which nothing
-- relies on: GET /api/log orders by created_at, then id.
ALTER SEQUENCE logs_id_seq CACHE 1000;
