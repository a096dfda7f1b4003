package main

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages counts the pages of path in the operating system's cache
// (mincore over a mapping of the file).
func residentPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }()
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// The cold measurements rest on evictOSCache: a database file it has
// passed over is no longer in the operating system's cache.
func TestEvictOSCacheDropsADatabaseFilesCachedPages(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "base", "5", "16384")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	// Clean pages only can be dropped: the data is on disk first.
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	// On tmpfs (files kept in memory) eviction does nothing and the last
	// check fails: there the cold case would be warm.
	if n := residentPages(t, path); n == 0 {
		t.Fatal("the file was read but none of its pages is cached: this test cannot see an eviction")
	}
	if err := evictOSCache(dir); err != nil {
		t.Fatal(err)
	}
	if n := residentPages(t, path); n != 0 {
		t.Fatalf("%d pages of the file still cached after evictOSCache", n)
	}
}
