-- The tool catalogue's reads.


-- name: declared_versions_count
-- How many versions of declared tools there are. It only grows (each declaration and each edit
-- adds one): a process that finds it unchanged has read every declaration (tools.declared). Run
-- for every proposal of a declared tool, so no ORM query is built for it.
SELECT count(*) AS versions FROM runtime_declaredtoolversion
