package store

// SetLeaseByShard switches leaseDueCitus's shape for the benchmark that
// compares them (and returns a function that switches it back).
func SetLeaseByShard(on bool) (restore func()) {
	was := leaseByShard.Swap(on)
	return func() { leaseByShard.Store(was) }
}
