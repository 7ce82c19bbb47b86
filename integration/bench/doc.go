// Command bench measures millbox against the real services of this machine
// and prints numbers; it never asserts a timing. Each case prints its
// results and ends with one summary line of key=value pairs.
//
//	go run ./integration/bench -case write
//	go run ./integration/bench -case forward [-n 200000]
//	go run ./integration/bench -case forward -dest nats|redis [-n 100000]
//	go run ./integration/bench -case outage [-n 400] [-duration 10s] [-rabbit]
//
// Run with -h for every case and flag.
package main
