// Package retry is the one place where the forwarder decides how long to
// wait before trying something again: a failed row (the user's
// forwarder.RetryPolicy, ExponentialRetry by default), a read, delete or
// move of the database that failed, a claim at the destination, and the
// probes of a destination that is down. Every waiter asks a Policy with
// the number of the attempt that failed; none computes a delay itself.
//
// It imports only the standard library.
package retry
