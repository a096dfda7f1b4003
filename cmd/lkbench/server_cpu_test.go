package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// burnEnv makes TestBurnCPUChild the child TestServerCPUCountsLiveAndReapedChildren
// runs: it burns burnCPU of CPU, says so on stdout and waits for its
// stdin to close.
const (
	burnEnv = "LKBENCH_TEST_BURN_CPU"
	burnCPU = 200 * time.Millisecond
)

// TestBurnCPUChild is not a test: it is the child process of
// TestServerCPUCountsLiveAndReapedChildren (a server's backend, as far as
// the CPU accounting can tell).
func TestBurnCPUChild(t *testing.T) {
	if os.Getenv(burnEnv) == "" {
		t.Skip("the child of TestServerCPUCountsLiveAndReapedChildren")
	}
	x := 1
	for selfCPU() < burnCPU {
		for i := range 1_000_000 {
			x = x*31 + i
		}
	}
	fmt.Printf("burnt %d\n", x&1)
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// pgCPU sums a postmaster's CPU and its children's: here the test process
// stands for the postmaster and a child that burnt CPU for a backend. The
// child counts while it runs (its /proc stat) and after it exited and was
// reaped (the parent's cutime and cstime), and nothing else does.
func TestServerCPUCountsLiveAndReapedChildren(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestBurnCPUChild$") //nolint:gosec,noctx // G204: this test binary; the child ends when its stdin closes
	cmd.Env = append(os.Environ(), burnEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = stdin.Close()
			_ = cmd.Wait()
		}
	})
	burnt := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		burnt <- line
	}()
	if line := testwait.Recv(t, burnt, 6*testwait.Timeout); line == "" {
		t.Fatal("the child exited before it said it had burnt its CPU")
	}

	self := func(fields ...int) time.Duration {
		t.Helper()
		f, err := procStat(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		return ticks(f, fields...)
	}
	f, err := procStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	child := ticks(f, 11, 12)
	if child < burnCPU/2 {
		t.Fatalf("/proc/%d/stat says the child used %s of CPU; it burnt at least %s", cmd.Process.Pid, child, burnCPU)
	}
	tree := &pgCPU{postmaster: os.Getpid()}
	own0 := self(11, 12, 13, 14)
	live, err := tree.sample()
	if err != nil {
		t.Fatal(err)
	}
	own1 := self(11, 12, 13, 14)
	if f, err = procStat(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	child1 := ticks(f, 11, 12)
	if live < own0+child {
		t.Fatalf("with the child running: %s; want at least our own %s plus the child's %s", live, own0, child)
	}
	if live > own1+child1 {
		t.Fatalf("with the child running: %s; want at most our own %s plus the child's %s: something else was counted", live, own1, child1)
	}

	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	exited = true
	if reaped := self(13, 14); reaped < child1 {
		t.Fatalf("our cutime+cstime is %s after reaping a child that used %s", reaped, child1)
	}
	ownRun := self(11, 12)
	after, err := tree.sample()
	if err != nil {
		t.Fatal(err)
	}
	if after < ownRun+child1 {
		t.Fatalf("after the child exited: %s; want at least our own %s plus the reaped child's %s", after, ownRun, child1)
	}
}
