// Package conformance holds the suites every database and driver
// combination runs, so all dialects keep the same guarantees. A test
// package describes its combination with an Env and calls the suites, for
// example conformance.Outbox(t, env).
package conformance
