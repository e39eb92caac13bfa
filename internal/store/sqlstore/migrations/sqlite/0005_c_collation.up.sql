-- Postgres gives its keys the "C" collation here. SQLite already compares
-- text byte by byte (BINARY), so this version changes nothing.
SELECT 1
