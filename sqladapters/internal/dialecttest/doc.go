// Package dialecttest holds what the tests of every sqladapters.Dialect
// share: Builder returns the SQL builder behind a dialect, Statements lists
// each statement it builds, Exercise runs the checks of the SQL all
// dialects must pass, and Unavailable and its neighbours let a test fail in
// CI (CI=true) or skip elsewhere when a database is unreachable. The
// subpackages connect to one database each; package storetest runs the
// store contract itself against a database.
package dialecttest
