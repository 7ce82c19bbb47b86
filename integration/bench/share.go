package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

func init() {
	register("share", "three forwarder instances started together drain N prefilled messages (200 keys) to no-op publishers: each one's share, and how long a fourth instance that joins waits for its partitions", runShare)
}

// tally is a no-op destination that counts what it was given.
type tally struct{ n atomic.Int64 }

func (c *tally) Publish(_ string, msgs ...*message.Message) error {
	c.n.Add(int64(len(msgs)))
	return nil
}

func (c *tally) Close() error { return nil }

func runShare(ctx context.Context, o options) error {
	n := orDefault(o.n, 200000)
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return err
	}
	const instances, partitions = 3, 16
	poll := forwarder.DefaultPollInterval
	fmt.Printf("%d instances start together on %d prefilled messages (%d partitions, PollInterval %v)\n", instances, n, partitions, poll)
	counts := make([]*tally, instances)
	fs := make([]*forwarder.Forwarder, instances)
	errc := make(chan error, instances+1)
	for i := range fs {
		counts[i] = &tally{}
		f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: counts[i], Source: forwarder.Polling{Partitions: partitions}})
		if err != nil {
			return err
		}
		fs[i] = f
	}
	start := time.Now()
	for _, f := range fs {
		go func() { errc <- f.Run(ctx) }()
	}
	var firstShares []string
	for _, f := range fs {
		if err := f.Ready(ctx); err != nil {
			return err
		}
		firstShares = append(firstShares, fmt.Sprint(len(f.Partitions())))
	}
	for {
		total := int64(0)
		for _, c := range counts {
			total += c.n.Load()
		}
		if total >= int64(n) {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	var shares []string
	least := int64(n)
	for _, c := range counts {
		shares = append(shares, fmt.Sprint(c.n.Load()))
		least = min(least, c.n.Load())
	}
	fmt.Printf("partitions at each one's start: %s; drained in %v; messages per instance: %s\n",
		strings.Join(firstShares, " / "), took.Round(time.Millisecond), strings.Join(shares, " / "))

	// A fourth instance joins the running three.
	joiner, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: &tally{}, Source: forwarder.Polling{Partitions: partitions}})
	if err != nil {
		return err
	}
	joined := time.Now()
	go func() { errc <- joiner.Run(ctx) }()
	share := (partitions + instances) / (instances + 1)
	for len(joiner.Partitions()) < share {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	wait := time.Since(joined)
	fmt.Printf("a fourth instance held its %d partitions %v after it started (PollInterval %v)\n", share, wait.Round(time.Millisecond), poll)
	for _, f := range append(fs, joiner) {
		_ = f.Close()
	}
	for range len(fs) + 1 {
		if err := <-errc; err != nil {
			return err
		}
	}
	summary("share_least_of_three", int(least))
	summary("share_fair", n/instances)
	summary("share_join_ms", int(wait.Milliseconds()))
	return nil
}
