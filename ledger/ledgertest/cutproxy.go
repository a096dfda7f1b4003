package ledgertest

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// CutProxy forwards TCP connections to a PostgreSQL server and, when
// armed with a statement's text, cuts the connection that runs it at the
// worst moment of a failover: after the server answered its execution (its
// ReadyForQuery: the commit happened, the answer is lost; a notice sent
// while the statement runs, as a Citus coordinator's, is not the answer)
// or before its execution reached the server (nothing happened; the client
// cannot know). Point a pool at Addr with one connection
// (pool_max_conns=1) on a fresh pool, so that pgx prepares the statement
// (its text) before executing it (no text): the proxy recognises the
// execution as the client's next message.
type CutProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	trigger []byte
	after   bool
	cuts    atomic.Int32
	wg      sync.WaitGroup
}

// StartCutProxy listens on 127.0.0.1 and forwards to backend (host:port);
// closed when the test ends.
func StartCutProxy(t testing.TB, backend string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{ln: ln, backend: backend}
	p.wg.Go(p.accept)
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

// Addr is where clients connect (host:port).
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Arm cuts the next connection that executes a statement containing
// trigger: after the server's answer when after is true, before the
// execution reaches the server otherwise. One cut per Arm.
func (p *CutProxy) Arm(trigger string, after bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger, p.after = []byte(trigger), after
}

// Cuts counts the connections cut so far.
func (p *CutProxy) Cuts() int { return int(p.cuts.Load()) }

func (p *CutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		var d net.Dialer
		s, err := d.DialContext(context.Background(), "tcp", p.backend)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

// pipe runs one connection: the chunk after the one carrying the trigger
// (the prepare) is the execution.
func (p *CutProxy) pipe(client, server net.Conn) {
	defer client.Close()
	defer server.Close()
	const (
		idle = iota
		prepared
		executed
	)
	var state atomic.Int32
	state.Store(idle)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		var answer []byte // the server's messages since the execution, dropped
		for {
			n, err := server.Read(buf)
			if err != nil {
				_ = client.Close()
				return
			}
			if state.Load() == executed {
				answer = append(answer, buf[:n]...)
				if !readyForQuery(answer) {
					continue // the statement still runs: wait for its end
				}
				p.cuts.Add(1)
				_ = client.Close() // the answer is dropped
				_ = server.Close()
				return
			}
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if err != nil {
			break
		}
		chunk := buf[:n]
		p.mu.Lock()
		trigger, after := p.trigger, p.after
		if state.Load() == prepared {
			p.trigger = nil // one cut per arming
		}
		p.mu.Unlock()
		switch {
		case state.Load() == prepared && after:
			state.Store(executed) // forward it; drop what comes back
		case state.Load() == prepared:
			p.cuts.Add(1) // never reaches the server
			_ = client.Close()
			_ = server.Close()
		case trigger != nil && bytes.Contains(chunk, trigger):
			state.Store(prepared)
		}
		if _, err := server.Write(chunk); err != nil {
			break
		}
	}
	_ = server.Close()
	<-done
}

// readyForQuery reports whether msgs, the server's messages from a message
// boundary on, hold a ReadyForQuery: the statement's end, its transaction
// committed or rolled back. Each message is a type byte and an int32 length
// that counts itself:
// https://www.postgresql.org/docs/current/protocol-message-formats.html
func readyForQuery(msgs []byte) bool {
	for len(msgs) >= 5 {
		n := int(binary.BigEndian.Uint32(msgs[1:5]))
		if msgs[0] == 'Z' {
			return true
		}
		if n < 4 || len(msgs) < 1+n {
			return false
		}
		msgs = msgs[1+n:]
	}
	return false
}
