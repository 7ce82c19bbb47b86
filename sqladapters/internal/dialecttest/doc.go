// Package dialecttest holds what the tests of every sqladapters.Dialect
// share: Statements lists each statement a dialect builds, Exercise runs
// the checks all dialects must pass, and Unavailable and its neighbours
// let a test fail in CI (CI=true) or skip elsewhere when a database is
// unreachable. The subpackages connect to one database each.
package dialecttest
