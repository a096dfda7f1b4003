package expiry

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	t.Parallel()
	cfg := Config{BatchSize: 1000, BatchTarget: 10 * time.Millisecond, DutyCycle: 0.1, BatchPause: 20 * time.Millisecond}.withDefaults()

	t.Run("pause keeps the duty cycle", func(t *testing.T) {
		p := newPacer(cfg)
		if got := p.observe(9*time.Millisecond, false); got != 81*time.Millisecond {
			t.Fatalf("pause after 9ms at 10%% = %v; want 81ms", got)
		}
	})
	t.Run("pause never under BatchPause", func(t *testing.T) {
		p := newPacer(cfg)
		if got := p.observe(time.Millisecond, false); got != 20*time.Millisecond {
			t.Fatalf("pause = %v; want the 20ms floor", got)
		}
	})
	t.Run("a slow batch shrinks the next in proportion", func(t *testing.T) {
		p := newPacer(cfg)
		p.observe(12*time.Millisecond, false)
		if p.size != 833 {
			t.Fatalf("size = %d; want 833", p.size)
		}
	})
	t.Run("a very slow batch halves the next, no more", func(t *testing.T) {
		p := newPacer(cfg)
		p.observe(40*time.Millisecond, false)
		if p.size != 500 {
			t.Fatalf("size = %d; want 500", p.size)
		}
	})
	t.Run("a timeout cuts to a quarter, never under the minimum", func(t *testing.T) {
		p := newPacer(cfg)
		p.observe(time.Second, true)
		if p.size != 250 {
			t.Fatalf("size = %d; want 250", p.size)
		}
		for range 10 {
			p.observe(time.Second, true)
		}
		if p.size != 100 {
			t.Fatalf("size = %d; want the minimum, a tenth of BatchSize", p.size)
		}
	})
	t.Run("grows back slowly, up to BatchSize", func(t *testing.T) {
		p := newPacer(cfg)
		p.size = 100
		p.observe(time.Millisecond, false)
		if p.size != 110 {
			t.Fatalf("size = %d; want +10%%", p.size)
		}
		for range 100 {
			p.observe(time.Millisecond, false)
		}
		if p.size != 1000 {
			t.Fatalf("size = %d; want capped at 1000", p.size)
		}
	})
	t.Run("near the target holds", func(t *testing.T) {
		p := newPacer(cfg)
		p.size = 500
		p.observe(9*time.Millisecond, false)
		if p.size != 500 {
			t.Fatalf("size = %d; want unchanged", p.size)
		}
	})
	t.Run("duty cycle 1 pauses only BatchPause", func(t *testing.T) {
		c := cfg
		c.DutyCycle = 1
		if got := newPacer(c).observe(50*time.Millisecond, false); got != 20*time.Millisecond {
			t.Fatalf("pause = %v", got)
		}
	})
}
