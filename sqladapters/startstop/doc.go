// Package startstop is the lifecycle that millbox's long-running
// components share (the forwarder, the inbox cleaner): Run blocks until
// its context ends or Close is called, Running and Ready tell when it runs
// or why it will not, and Close stops it within a timeout; and the errors
// every millbox component shares (ErrClosed, ErrRunning,
// ErrInvalidConfig), which the other packages re-export. Applications do
// not need it; it is exported so that those components mean the same by
// each of these words. It imports only the standard library, so the
// forwarder, the inbox and the destinations take it without importing
// sqladapters.
package startstop
