// Package metadata decodes the metadata column of an outbox row into a
// Watermill message's metadata, for the polling and the change-data-capture
// forwarders alike. It imports only the standard library.
package metadata
