// Package sqlstore implements the store contract (sqladapters.Dialect) once
// for every SQL database, on top of a Builder: the SQL of one database,
// built but never executed. Each database package (sqladapters/postgres,
// sqladapters/mysql, sqladapters/sqlite) provides its Builder and embeds a
// Store in its exported dialect type; the Store runs the statements, scans
// their rows and maps the driver's errors through the Builder's
// ClassifyError, so that no caller of the contract does either.
//
// A Builder declares what its database can do: every operation not every
// database has is a method each Builder writes, answering false (or nil)
// where its database lacks it, and the store asks it rather than testing
// for optional interfaces; a database's Features follow from those
// answers. A Builder that leaves one out does not compile.
package sqlstore
