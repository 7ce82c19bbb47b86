package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file runs a PostgreSQL primary and a streaming standby of the
// test's own, on ports of their own, for failover tests: the primary can
// be killed with SIGKILL (every process of it at once, as a crash of its
// machine would end them) or stopped cleanly, and the standby promoted.
// Both start from one initdb per test process (a template copied for each
// pair), so that a pair is up in about a second.

// PostgresPairConfig configures NewPostgresPair. The zero value is a
// primary with wal_level logical and a synchronous standby.
type PostgresPairConfig struct {
	// Async leaves synchronous_standby_names unset: a commit does not wait
	// for the standby, and one the application saw may be lost with the
	// primary.
	Async bool
	// Settings are more postgresql.conf lines for both servers.
	Settings []string
}

// PostgresPair is a primary and a streaming standby made from it with
// pg_basebackup -R, each a postmaster the pair started as a child
// process (as the postgres OS user when run as root), with its data in a
// directory of its own that Close removes. With synchronous replication
// (the default) a commit returns only once the standby has flushed it, so
// that every commit the application saw survives the primary. The
// standby has no synchronous standby of its own: once promoted, it
// commits alone.
type PostgresPair struct {
	bin  string
	root string
	cred *syscall.Credential

	mu      sync.Mutex
	nodes   [2]*pgNode
	primary int
}

// pgNode is one server of the pair.
type pgNode struct {
	port int
	data string
	log  *os.File
	cmd  *exec.Cmd     // nil while stopped
	done chan struct{} // closed when cmd exited
}

var pgTemplate struct {
	once sync.Once
	dir  string
	err  error
}

// PostgresBinDir is where the pair finds initdb, postgres and
// pg_basebackup: MILLBOX_PG_BIN, else the newest /usr/lib/postgresql/*/bin
// (Debian's layout), else the directory of pg_config --bindir.
func PostgresBinDir() (string, error) {
	if d := os.Getenv("MILLBOX_PG_BIN"); d != "" {
		return d, checkPGBin(d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if checkPGBin(d) == nil {
			return d, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		return d, checkPGBin(d)
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres, pg_basebackup) not found: set MILLBOX_PG_BIN or install postgresql")
}

func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func checkPGBin(dir string) error {
	for _, b := range []string{"initdb", "postgres", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("PostgreSQL server binary %s: %w", b, err)
		}
	}
	return nil
}

// pgCredential is who runs the servers: the postgres OS user when this
// process is root (PostgreSQL refuses to run as root), else this user.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs another OS user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// pgDir makes a directory the servers' user owns.
func pgDir(cred *syscall.Credential, pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// runPG runs a PostgreSQL program as the servers' user.
func runPG(cred *syscall.Credential, dir, bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, tail(out.Bytes(), 2000))
	}
	return nil
}

// template returns the data directory of one initdb per process, which
// every pair copies: initdb is most of the time a new server takes.
func template(bin string, cred *syscall.Credential) (string, error) {
	pgTemplate.once.Do(func() {
		dir, err := pgDir(cred, "millbox-pgtemplate-")
		if err != nil {
			pgTemplate.err = err
			return
		}
		data := filepath.Join(dir, "data")
		if err := runPG(cred, dir, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
			"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
			_ = os.RemoveAll(dir)
			pgTemplate.err = err
			return
		}
		pgTemplate.dir = data
	})
	return pgTemplate.dir, pgTemplate.err
}

// RemovePostgresTemplate removes the data directory the pairs of this
// process were copied from. Call it once no pair will start any more:
// at the end of TestMain (PostgresPairs does it) or of a program.
func RemovePostgresTemplate() {
	if pgTemplate.dir != "" {
		_ = os.RemoveAll(filepath.Dir(pgTemplate.dir))
	}
}

// TestingM is what TestMain's m offers, as goleak.VerifyTestMain takes it.
type TestingM interface{ Run() int }

// PostgresPairs wraps TestMain's m so that the data directory the pairs
// are copied from is removed after the tests.
func PostgresPairs(m TestingM) TestingM { return pairsM{m} }

type pairsM struct{ m TestingM }

func (p pairsM) Run() int {
	defer RemovePostgresTemplate()
	return p.m.Run()
}

// pgSettings are the settings of both servers: logical decoding, room
// for replication connections and slots, and what keeps a small server
// quick on a shared machine (no fsync: a crash of the test's servers
// never needs their files to be durable against a power loss).
var pgSettings = []string{
	"listen_addresses = '127.0.0.1'",
	"unix_socket_directories = ''",
	"wal_level = logical",
	"max_wal_senders = 20",
	"max_replication_slots = 20",
	"max_connections = 200",
	"shared_buffers = 32MB",
	"fsync = off",
	"full_page_writes = off",
	"synchronous_commit = on",
	"hot_standby = on",
	"wal_keep_size = '512MB'",
	"max_slot_wal_keep_size = '1GB'",
	"wal_receiver_status_interval = '1s'",
	"wal_retrieve_retry_interval = '200ms'",
	"logging_collector = off",
	"log_min_messages = warning",
}

// NewPostgresPair starts a primary and its standby and waits until the
// standby streams (synchronously unless cfg.Async). Close removes them.
func NewPostgresPair(cfg PostgresPairConfig) (*PostgresPair, error) {
	bin, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	tmpl, err := template(bin, cred)
	if err != nil {
		return nil, err
	}
	root, err := pgDir(cred, "millbox-pgpair-")
	if err != nil {
		return nil, err
	}
	p := &PostgresPair{bin: bin, root: root, cred: cred}
	if err := p.start(tmpl, cfg); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *PostgresPair) start(tmpl string, cfg PostgresPairConfig) error {
	for i := range p.nodes {
		ln, port, err := listenFreePort()
		if err != nil {
			return err
		}
		_ = ln.Close()
		p.nodes[i] = &pgNode{port: port, data: filepath.Join(p.root, "node"+strconv.Itoa(i))}
	}
	a, b := p.nodes[0], p.nodes[1]
	// cp keeps the owner and the modes PostgreSQL checks.
	if out, err := exec.Command("cp", "-a", tmpl, a.data).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the template: %w: %s", err, out)
	}
	conf := append(append([]string{}, pgSettings...), cfg.Settings...)
	if !cfg.Async {
		conf = append(conf, "synchronous_standby_names = '*'")
	}
	if err := appendConf(a.data, conf...); err != nil {
		return err
	}
	if err := p.run(a); err != nil {
		return err
	}
	if err := runPG(p.cred, p.root, filepath.Join(p.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(a.port),
		"-U", "postgres", "-D", b.data, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return err
	}
	// Once promoted, the standby commits without waiting for a standby of
	// its own, as a failover manager would set it.
	if err := appendConf(b.data, "synchronous_standby_names = ''"); err != nil {
		return err
	}
	if err := p.run(b); err != nil {
		return err
	}
	p.primary = 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.waitStreaming(ctx, a, !cfg.Async)
}

func appendConf(data string, lines ...string) error {
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, "\n"+strings.Join(lines, "\n")+"\n")
	return errors.Join(err, f.Close())
}

// run starts n's postmaster in a process group of its own and waits until
// it accepts connections.
func (p *PostgresPair) run(n *pgNode) error {
	if n.log == nil {
		f, err := os.OpenFile(filepath.Join(p.root, filepath.Base(n.data)+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		n.log = f
	}
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", n.data, "-p", strconv.Itoa(n.port))
	cmd.Dir = p.root
	cmd.Stdout, cmd.Stderr = n.log, n.log
	// Its own process group, so that KillPrimary ends every process of it;
	// killed with this process, so that no server outlives a test binary
	// that was killed (its backends follow the postmaster).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres on port %d: %w", n.port, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, p.nodeURL(n))
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		select {
		case <-done:
			n.cmd = nil
			return fmt.Errorf("postgres on port %d exited: %s", n.port, p.logTail(n))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres on port %d did not accept connections within 60s (%v): %s", n.port, err, p.logTail(n))
		}
	}
}

func (p *PostgresPair) logTail(n *pgNode) string {
	b, _ := os.ReadFile(filepath.Join(p.root, filepath.Base(n.data)+".log"))
	return tail(b, 2000)
}

// waitStreaming waits until primary has a standby streaming (sync: in
// synchronous mode).
func (p *PostgresPair) waitStreaming(ctx context.Context, primary *pgNode, sync bool) error {
	want := "async"
	if sync {
		want = "sync"
	}
	for {
		var n int
		err := p.query(ctx, primary, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, []any{want}, &n)
		if err == nil && n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no %s standby streams from port %d (%v)", want, primary.port, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *PostgresPair) query(ctx context.Context, n *pgNode, sql string, args []any, dest ...any) error {
	c, err := pgx.Connect(ctx, p.nodeURL(n))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.QueryRow(ctx, sql, args...).Scan(dest...)
}

func (p *PostgresPair) nodeURL(n *pgNode) string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(n.port) + "/postgres?sslmode=disable&connect_timeout=5"
}

// URL is the multi-host URL of the pair, as an application gives it: both
// servers, target_session_attrs=read-write (a connection goes to
// whichever accepts writes) and a connect timeout.
func (p *PostgresPair) URL() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(p.nodes[0].port) + ",127.0.0.1:" + strconv.Itoa(p.nodes[1].port) +
		"/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
}

// NodeURL is the URL of server i (0 or 1) alone.
func (p *PostgresPair) NodeURL(i int) string { return p.nodeURL(p.nodes[i]) }

// Primary is the index of the server that is (or was, until it died) the
// primary.
func (p *PostgresPair) Primary() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.primary
}

// KillPrimary kills every process of the primary with SIGKILL, as a crash
// of its machine would end them (their connections close at once, which
// a machine that vanished from the network would not do), and waits
// until the postmaster is gone. The standby keeps its data; Promote makes
// it the primary.
func (p *PostgresPair) KillPrimary() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.nodes[p.primary]
	if n.cmd == nil {
		return errors.New("the primary is not running")
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	<-n.done
	n.cmd = nil
	return nil
}

// StopPrimary stops the primary cleanly (a fast shutdown: its sessions
// end, its last WAL reaches the standby) and waits until the standby has
// replayed everything the primary wrote, as a planned switchover does
// before it promotes.
func (p *PostgresPair) StopPrimary(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, s := p.nodes[p.primary], p.nodes[1-p.primary]
	if n.cmd == nil {
		return errors.New("the primary is not running")
	}
	_ = n.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-n.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	n.cmd = nil
	// The shutdown checkpoint is the primary's last record: the standby
	// has it all once it replayed past it.
	out, err := exec.Command(filepath.Join(p.bin, "pg_controldata"), n.data).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_controldata: %w: %s", err, out)
	}
	var last string
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Latest checkpoint location:"); ok {
			last = strings.TrimSpace(v)
		}
	}
	if last == "" {
		return fmt.Errorf("pg_controldata printed no checkpoint location: %s", out)
	}
	for {
		var caught bool
		err := p.query(ctx, s, `SELECT pg_last_wal_replay_lsn() > $1::pg_lsn`, []any{last}, &caught)
		if err == nil && caught {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the standby did not replay past the primary's shutdown checkpoint %s: %v", last, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// FencePrimary makes the primary read-only and leaves it running:
// default_transaction_read_only is set and the configuration reloaded, so
// that its sessions, still connected, fail every write with SQLSTATE 25006
// and new connections with target_session_attrs=read-write pass it over.
// Promote then makes the standby the primary.
func (p *PostgresPair) FencePrimary(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.nodes[p.primary]
	var ok bool
	if err := p.query(ctx, n, `ALTER SYSTEM SET default_transaction_read_only = on`, nil); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("fence the primary: %w", err)
	}
	if err := p.query(ctx, n, `SELECT pg_reload_conf()`, nil, &ok); err != nil {
		return fmt.Errorf("fence the primary: %w", err)
	}
	// The reload reaches every session before its next command.
	for {
		var ro string
		if err := p.query(ctx, n, `SHOW default_transaction_read_only`, nil, &ro); err != nil {
			return err
		}
		if ro == "on" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Promote promotes the standby (pg_promote, waiting until it accepts
// writes); it is the primary from then on. The old primary must be down
// (KillPrimary, StopPrimary): it is not turned into a standby.
func (p *PostgresPair) Promote(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.nodes[1-p.primary]
	var ok bool
	if err := p.query(ctx, s, `SELECT pg_promote(true, 60)`, nil, &ok); err != nil {
		return fmt.Errorf("promote the standby on port %d: %w", s.port, err)
	}
	if !ok {
		return fmt.Errorf("the standby on port %d did not finish its promotion within 60s", s.port)
	}
	p.primary = 1 - p.primary
	return nil
}

// Timeline returns the timeline of server i, read from its last
// checkpoint's control data: it grows with each promotion.
func (p *PostgresPair) Timeline(ctx context.Context, i int) (int, error) {
	var tl int
	err := p.query(ctx, p.nodes[i], `SELECT timeline_id FROM pg_control_checkpoint()`, nil, &tl)
	return tl, err
}

// Close kills both servers and removes their data.
func (p *PostgresPair) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.nodes {
		if n == nil {
			continue
		}
		if n.cmd != nil {
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
			n.cmd = nil
		}
		if n.log != nil {
			_ = n.log.Close()
		}
	}
	_ = os.RemoveAll(p.root)
}

// StartPostgresPair starts a pair for the test and removes it after.
// Without the PostgreSQL server binaries the test fails in CI and is
// skipped elsewhere. The servers' logs go to the test's log when it
// fails.
func StartPostgresPair(t testing.TB, cfg PostgresPairConfig) *PostgresPair {
	t.Helper()
	_, err := PostgresBinDir()
	if err == nil {
		_, err = pgCredential()
	}
	if err != nil {
		if InCI() {
			t.Fatalf("%v; CI needs a PostgreSQL of the test's own for the failover tests", err)
		}
		t.Skipf("%v; install PostgreSQL's server package to run this test", err)
	}
	start := time.Now()
	p, err := NewPostgresPair(cfg)
	if err != nil {
		t.Fatalf("start a primary and a standby: %v", err)
	}
	t.Logf("primary on %s, standby on %s (up in %v)", p.NodeURL(0), p.NodeURL(1), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range p.nodes {
				t.Logf("server log of port %d:\n%s", n.port, p.logTail(n))
			}
		}
		p.Close()
	})
	return p
}
