// Package sqlstore implements the store contract (sqladapters.Dialect) once
// for every SQL database, on top of a Builder: the SQL of one database,
// built but never executed. Each database package (sqladapters/postgres,
// sqladapters/mysql, sqladapters/sqlite) provides its Builder and embeds a
// Store in its exported dialect type; the Store runs the statements, scans
// their rows and maps the driver's errors through the Builder's
// ClassifyError, so that no caller of the contract does either.
package sqlstore
