package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ServerProcess is a broker server the test runs as a child process of its
// own, on a port of its own, so that the test can stop and restart it
// without disturbing the shared services other tests use. Its data
// directory lives in the test's temporary directory and survives restarts.
type ServerProcess struct {
	name  string
	bin   string
	args  []string
	port  int
	dir   string
	ready func() error
	log   string

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd exited
}

// startServerProcess finds bin (in PATH, then in /usr/sbin, /usr/bin and
// /usr/local/bin),
// starts it with args (argsFor gets the port and the data directory), and
// waits until ready succeeds. When the binary is missing the test fails in
// CI and is skipped elsewhere. The server is stopped after the test.
func startServerProcess(t testing.TB, name, bin string, argsFor func(port int, dir string) []string, readyFor func(port int) func() error) *ServerProcess {
	t.Helper()
	path, err := findBinary(bin)
	if err != nil {
		if InCI() {
			t.Fatalf("%v; CI needs it for this test", err)
		}
		t.Skipf("%v; install %s to run this test", err, name)
	}
	ln, port, err := listenFreePort()
	if err != nil {
		t.Fatal(err)
	}
	_ = ln.Close() // the server binds it; the range keeps it from outgoing connections
	dir := t.TempDir()
	s := &ServerProcess{name: name, bin: path, args: argsFor(port, dir), port: port, dir: dir, ready: readyFor(port), log: filepath.Join(dir, "server.log")}
	t.Cleanup(func() { s.Stop(t) })
	s.Start(t)
	return s
}

func findBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH, /usr/sbin, /usr/bin or /usr/local/bin", name)
}

// Addr returns 127.0.0.1:port.
func (s *ServerProcess) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server (again) and waits until it serves. Starting a
// running server does nothing.
func (s *ServerProcess) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmd := exec.Command(s.bin, s.args...)
		cmd.Dir = s.dir
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", s.name, err)
		}
		exited := make(chan struct{})
		var werr error
		go func() { werr = cmd.Wait(); close(exited) }()
		if err = s.waitReady(cmd, exited, deadline); err == nil {
			s.cmd, s.exited = cmd, exited
			return
		}
		// It exited (or never answered): the port may still be held
		// by the previous process's socket for a moment. Try again for
		// a while.
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(s.log)
			t.Fatalf("%s on port %d did not start (%v, last check: %v); log:\n%s", s.name, s.port, werr, err, tail(out, 2000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitReady checks every 50 ms whether the server started by cmd serves.
// It returns nil once it does, or the last check's error when the process
// exited or the deadline passed (the process is then killed).
func (s *ServerProcess) waitReady(cmd *exec.Cmd, exited <-chan struct{}, deadline time.Time) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return err
		}
		select {
		case <-exited:
			return err
		case <-tick.C:
		}
	}
}

// Stop stops the server with SIGTERM, as a service manager does, and waits
// until it exited and its port is free. Stopping a stopped server does
// nothing.
func (s *ServerProcess) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	cmd, exited := s.cmd, s.exited
	s.cmd, s.exited = nil, nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("%s did not stop within 30s of SIGTERM; killed", s.name)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
