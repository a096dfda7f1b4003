package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// echoServer echoes every connection's bytes back and records what it
// received and how many connections it accepted.
type echoServer struct {
	ln    net.Listener
	mu    sync.Mutex
	got   bytes.Buffer
	conns []net.Conn
	wg    sync.WaitGroup
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Go(func() {
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					e.mu.Lock()
					e.got.Write(buf[:n])
					e.mu.Unlock()
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			_ = c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) received() (string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got.String(), len(e.conns)
}

func dialProxy(t *testing.T, p *hangProxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads its echo, within 5 s.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo of %q through the proxy: got %q, %v", msg, buf, err)
	}
}

// silent writes msg and expects nothing back within quiet.
func silent(t *testing.T, c net.Conn, msg string, quiet time.Duration) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(quiet))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the hung proxy answered %q (err %v): it must forward nothing", buf[:n], err)
	}
}

// closedByProxy expects c's next read to end (EOF or reset), within 5 s.
func closedByProxy(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 64))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after heal the connection held while hung must be closed; read gave %v", err)
	}
}

func TestHangProxyForwardsNothingFromTheTriggerUntilHealed(t *testing.T) {
	echo := startEcho(t)
	p, err := startHangProxy(echo.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	const quiet = 300 * time.Millisecond

	c1 := dialProxy(t, p)
	roundTrip(t, c1, "before arming")
	p.arm("STOP")
	roundTrip(t, c1, "armed, no trigger yet")
	if _, hung := p.hungAt(); hung {
		t.Fatal("hung before its trigger went through")
	}

	// The message carrying the trigger hangs the proxy and never reaches
	// the server; neither does anything after it, on any connection.
	silent(t, c1, "a statement with STOP in it", quiet)
	if _, hung := p.hungAt(); !hung {
		t.Fatal("the trigger went through and the proxy did not hang")
	}
	silent(t, c1, "more", quiet)
	c2 := dialProxy(t, p)
	silent(t, c2, "a new connection", quiet)
	got, conns := echo.received()
	if want := "before arming" + "armed, no trigger yet"; got != want || conns != 1 {
		t.Fatalf("the server received %q on %d connections; want %q on 1", got, conns, want)
	}

	// Healed: the held connections are closed, new ones forwarded again.
	p.heal()
	closedByProxy(t, c1)
	closedByProxy(t, c2)
	c3 := dialProxy(t, p)
	roundTrip(t, c3, "after heal")
	testwait.Eventually(t, func() bool { _, n := echo.received(); return n == 2 }, 5*time.Second, "the server to see the connection made after heal")
	if _, hung := p.hungAt(); !hung {
		t.Fatal("heal forgot when the proxy hung (the benchmark reads it after healing)")
	}
}
