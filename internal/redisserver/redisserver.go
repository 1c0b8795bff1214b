// Package redisserver runs a real redis-server for the tests that share
// state through Redis (peers, proxy).
package redisserver

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Server is a redis-server process on a loopback port, without
// persistence, stopped when the test ends.
type Server struct {
	t    testing.TB
	bin  string
	Addr string   // host:port
	args []string // more redis-server options
	cmd  *exec.Cmd
}

// Start starts a redis-server on a free loopback port, with args as more
// options (e.g. an ACL user; PING must stay allowed to the default user,
// which Start's readiness check uses). Without the binary
// the test skips, except in CI ($CI set), where it fails: .ci/run installs
// Debian's redis-server.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server missing in CI (.ci/run installs it): %v", err)
		}
		t.Skipf("redis-server not installed (apt-get install redis-server, or run .ci/run): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &Server{t: t, bin: bin, Addr: addr, args: args}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr }

// start runs the process and waits until it answers PING.
func (s *Server) start() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	dir := s.t.TempDir()
	s.cmd = exec.Command(s.bin, append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--loglevel", "warning"}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(s.Addr) == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("redis-server on %s did not answer PING in 10 s", s.Addr)
}

// Kill ends the process with SIGKILL (kill -9) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

// Stop stops the process with SIGSTOP: it keeps its connections and
// answers nothing until Continue (a stalled Redis).
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Continue resumes a process Stop stopped (SIGCONT).
func (s *Server) Continue() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("redis-server is not running")
	}
	if err := syscall.Kill(s.cmd.Process.Pid, sig); err != nil {
		s.t.Fatalf("signal redis-server: %v", err)
	}
}

// Restart starts the server again, empty, on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

func (s *Server) stop() { s.Kill() }

// ping sends one PING and reads +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %s", strconv.Quote(line))
	}
	return nil
}
