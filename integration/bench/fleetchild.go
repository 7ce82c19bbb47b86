package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// A fleet instance runs in a process of its own, so that it can be killed
// with SIGKILL and its CPU is not the bench's. It reports on stdout:
// "ready" once running; "a <unix ns> <n> <ids…>" for each call of its
// destination (n messages, the IDs of those the bench tracks); and
// "s <held> <looked at> <hot>" for each "status" line on stdin. It ends
// when stdin closes.

// fleetChild is an instance's process, as the bench sees it.
type fleetChild struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	statusMu sync.Mutex
	statusCh chan string
	once     sync.Once
}

func startFleetChild(ctx context.Context, r *fleetRun, i int) (*fleetChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.CreateTemp("", fmt.Sprintf("fleetbench-i%d-*.log", i))
	if err != nil {
		return nil, err
	}
	fmt.Printf("  instance %d logs to %s\n", i, logf.Name())
	cmd := exec.Command(exe, "-case", "fleet", "-fleet-max-conns", strconv.Itoa(*fleetMaxConns),
		"-fleet-handle-conns", strconv.Itoa(*fleetHandle))
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+r.instanceID(i), fleetRunEnv+"="+r.prefix, fleetBaseEnv+"="+r.o.pgURL)
	// The child dies with the bench, even when the bench is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	logf.Close()
	c := &fleetChild{cmd: cmd, stdin: stdin, statusCh: make(chan string, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "ready":
				close(ready)
			case strings.HasPrefix(line, "a "):
				f := strings.Fields(line)
				if len(f) < 3 {
					continue
				}
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				n, _ := strconv.Atoi(f[2])
				r.arr.arrive(time.Unix(0, ns), n, f[3:])
			case strings.HasPrefix(line, "s "):
				c.statusCh <- line
			}
		}
	}()
	select {
	case <-ready:
		return c, nil
	case <-time.After(time.Minute):
		err = errors.New("fleet instance not ready after a minute")
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.kill()
	return nil, err
}

// status asks the instance how many tenants it holds and has looked at.
func (c *fleetChild) status(ctx context.Context) (held, looked int, err error) {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	if _, err := io.WriteString(c.stdin, "status\n"); err != nil {
		return 0, 0, err
	}
	select {
	case line := <-c.statusCh:
		f := strings.Fields(line)
		held, _ = strconv.Atoi(f[1])
		looked, _ = strconv.Atoi(f[2])
		return held, looked, nil
	case <-time.After(30 * time.Second):
		return 0, 0, errors.New("fleet instance did not answer within 30 s")
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// kill ends the instance with SIGKILL.
func (c *fleetChild) kill() {
	c.once.Do(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	})
}

// reporter is the instances' destination: it writes each call's arrival
// to stdout and drops the messages.
type reporter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (p *reporter) Publish(_ string, msgs ...*message.Message) error {
	now := time.Now().UnixNano()
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "a %d %d", now, len(msgs))
	for _, m := range msgs {
		if m.Metadata.Get("track") == "1" {
			p.w.WriteByte(' ')
			p.w.WriteString(m.UUID)
		}
	}
	p.w.WriteByte('\n')
	return p.w.Flush()
}

func (p *reporter) Close() error { return nil }

func (p *reporter) line(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.w.WriteString(s + "\n")
	_ = p.w.Flush()
}

// runFleetChild is the instance's process.
func runFleetChild(ctx context.Context, _ options, id string) error {
	prefix, base := os.Getenv(fleetRunEnv), os.Getenv(fleetBaseEnv)
	ctl, err := pgxpool.New(ctx, dbURL(base, prefix+"ctl", "mbbench_ctl"))
	if err != nil {
		return err
	}
	defer ctl.Close()
	db, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dbURL(base, prefix+"ctl", ""), Doorbell: pgfleet.StatDoorbell, ApplicationName: id, MaxConns: int32(*fleetHandle)})
	if err != nil {
		return err
	}
	sch, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dbURL(base, prefix+"sch", ""), Doorbell: pgfleet.SlotDoorbell, ApplicationName: id, MaxConns: int32(*fleetHandle)})
	if err != nil {
		return err
	}
	out := &reporter{w: bufio.NewWriterSize(os.Stdout, 64<<10)}
	logger := watermill.NewSlogLoggerWithLevelMapping(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})), nil)
	f, err := fleet.New(fleet.Config{
		Control:           pgxv5.WrapPool(ctl),
		Store:             postgres.MustNewFleet(postgres.FleetOptions{}),
		Servers:           map[string]fleet.Server{"db": db, "sch": sch},
		Destination:       out,
		InstanceID:        id,
		MaxConns:          *fleetMaxConns,
		MaxConnsPerServer: min(8, *fleetMaxConns),
		Logger:            logger,
	})
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- f.Run(ctx) }()
	if err := f.Ready(ctx); err != nil {
		return err
	}
	out.line("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "status" {
			continue
		}
		st, err := f.Status(ctx)
		if err != nil {
			return err
		}
		looked, hot := 0, 0
		for _, t := range st.Tenants {
			if !t.LookedAt.IsZero() {
				looked++
			}
			if t.State != "idle" {
				hot++
			}
		}
		out.line(fmt.Sprintf("s %d %d %d", len(st.Tenants), looked, hot))
	}
	_ = f.Close()
	return <-runErr
}
