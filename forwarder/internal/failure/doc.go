// Package failure holds what the polling forwarder and the change-data-
// capture reader share about a failed publish: telling an unreachable
// destination from a bad message, marking a message that can never be
// published, and the error text stored with the row (the waits before
// another attempt are package retry's). It may import the destination
// contract (forwarder/destination) only.
package failure
