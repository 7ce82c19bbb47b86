// Package startstop is the lifecycle that millbox's long-running
// components share (the forwarder, the inbox cleaner): Run blocks until
// its context ends or Close is called, Running and Ready tell when it runs
// or why it will not, and Close stops it within a timeout. Applications do
// not need it; it is exported so that those components mean the same by
// each of these words.
package startstop
