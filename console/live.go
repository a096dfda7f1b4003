package console

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// DefaultRefresh is how often the overview's script fetches its live part.
const DefaultRefresh = 15 * time.Second

// LiveConfig configures the overview's auto-refresh and its chart of stuck
// keys over the last 24 hours.
type LiveConfig struct {
	// ProbePauses returns the tools whose probing a downstream has paused
	// (HTTP 429 or 503 with Retry-After), each with the pause's end, as
	// serve's reconcile engine knows them (reconcile.Engine.ProbePauses):
	// the overview shows these and the ledger's (store.ProbePauses, which
	// every replica writes and honours), the later end of each. Nil: the
	// ledger's only (`ledgerkeeper console`).
	ProbePauses func() map[string]time.Time
	// Refresh is how often the overview's script fetches its live part;
	// 0: DefaultRefresh.
	Refresh time.Duration

	// now is the chart's clock (tests); nil: time.Now.
	now func() time.Time
}

// chartDay is the span of the stuck-keys chart.
const chartDay = 24 * time.Hour

// The chart's drawing: one unit of x per sample bucket (288 a day), y from
// chartBase (0 stuck) up to chartTop (the day's maximum).
const (
	chartWidth  = int(chartDay / store.SampleEvery)
	chartHeight = 64
	chartBase   = 60
	chartTop    = 8
)

// liveView is what the overview's live part adds: when it was read, the
// charts, the probe pauses and the refresh interval for the script.
type liveView struct {
	At        time.Time
	RefreshMS int64
	Charts    []stuckChart
	// Pauses are the paused tools and when each pause ends: the ledger's
	// (every replica's) and serve's own engine's.
	Pauses map[string]time.Time
}

// PauseOf is when tool's probing pause ends, nil when it is not paused
// (or the pause is not known here).
func (v liveView) PauseOf(tool string) *time.Time {
	if until, ok := v.Pauses[tool]; ok {
		return &until
	}
	return nil
}

// stuckChart is one tool's stuck keys over the last day, drawn as SVG
// polylines (one per run of samples without a gap) and said in words.
type stuckChart struct {
	Tool    string
	Samples int
	// Lines are the polylines' points attributes, "x,y x,y …".
	Lines []string
	// Max is the day's largest stuck count (the chart's top).
	Max int
	// Text says the chart: its maximum and when, and the latest count.
	Text string
}

// Label is the chart's accessible name.
func (c stuckChart) Label() string {
	return c.Tool + ": stuck keys over the last 24 hours, " + c.Text
}

// routesLive registers the live overview's routes: the live part alone,
// for the overview's script to fetch.
func (h *Handler) routesLive(mux *http.ServeMux) {
	h.cfg.Live.Refresh = cmp.Or(h.cfg.Live.Refresh, DefaultRefresh)
	if h.cfg.Live.now == nil {
		h.cfg.Live.now = time.Now
	}
	mux.HandleFunc("GET "+h.base+"overview/live", h.overviewLive)
}

// overviewLive answers the overview's live part as an HTML fragment, the
// same data the page shows; a failure is a 500 with a line, which the
// script reports while it keeps the last data.
func (h *Handler) overviewLive(w http.ResponseWriter, r *http.Request) {
	d, what, err := h.loadOverview(r.Context())
	if err != nil {
		h.log.Error("console: "+what, "user", userOf(r), "err", h.red.Error(err))
		http.Error(w, what+" failed: the database did not answer (see serve's log)", http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := h.pages["overview"].ExecuteTemplate(&buf, "live", page{Title: "Overview", User: userOf(r), Data: d}); err != nil {
		h.log.Error("console: render", "page", "overview/live", "err", h.red.Error(err))
		http.Error(w, "the overview could not be drawn (see serve's log)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// loadLive reads the live part's own data into d: the samples of the last
// day (a chart for every tool listed and every tool sampled) and the probe
// pauses. A tool that is paused or sampled but has no key gets a line in
// the table too.
func (h *Handler) loadLive(ctx context.Context, d *overviewData) error {
	now := h.cfg.Live.now().UTC()
	v := liveView{At: now, RefreshMS: h.cfg.Live.Refresh.Milliseconds()}
	samples, err := store.StuckSamplesSince(ctx, h.cfg.Pool, now.Add(-chartDay))
	if err != nil {
		return err
	}
	byTool := map[string][]store.StuckSample{}
	for _, s := range samples {
		byTool[s.Tool] = append(byTool[s.Tool], s)
	}
	// Pauses are shared through the ledger (every replica honours them,
	// store.ProbePauses); serve's own engine may know of a later end not
	// written yet. The later end is shown.
	v.Pauses, err = store.ProbePauses(ctx, h.cfg.Pool)
	if err != nil {
		return err
	}
	for tool, until := range v.Pauses {
		if !until.After(now) {
			delete(v.Pauses, tool)
		}
	}
	if h.cfg.Live.ProbePauses != nil {
		for tool, until := range h.cfg.Live.ProbePauses() {
			if until.After(now) && until.After(v.Pauses[tool]) {
				v.Pauses[tool] = until
			}
		}
	}
	listed := map[string]bool{}
	for _, t := range d.Tools {
		listed[t.Tool] = true
	}
	for _, tool := range slices.Sorted(maps.Keys(byTool)) {
		if !listed[tool] {
			d.Tools = append(d.Tools, toolView{ToolStats: store.ToolStats{Tool: tool}})
			listed[tool] = true
		}
	}
	for _, tool := range slices.Sorted(maps.Keys(v.Pauses)) {
		if !listed[tool] {
			d.Tools = append(d.Tools, toolView{ToolStats: store.ToolStats{Tool: tool}})
			listed[tool] = true
		}
	}
	for _, t := range d.Tools {
		v.Charts = append(v.Charts, drawStuck(t.Tool, byTool[t.Tool], now))
	}
	d.Live = v
	return nil
}

// drawStuck draws a tool's samples (oldest first, within the day before
// now) for the overview.
func drawStuck(tool string, samples []store.StuckSample, now time.Time) stuckChart {
	c := stuckChart{Tool: tool, Samples: len(samples)}
	if len(samples) == 0 {
		c.Text = "no samples yet"
		return c
	}
	maxAt := samples[0].At
	for _, s := range samples {
		if s.Stuck >= c.Max {
			c.Max, maxAt = s.Stuck, s.At
		}
	}
	start := now.Add(-chartDay)
	scale := float64(max(c.Max, 1))
	var line []string
	var prev time.Time
	for i, s := range samples {
		// A gap of more than two buckets (no serve observing) breaks the
		// line rather than drawing across it.
		if i > 0 && s.At.Sub(prev) > 2*store.SampleEvery {
			c.Lines = append(c.Lines, points(line))
			line = nil
		}
		x := float64(s.At.Sub(start)) / float64(store.SampleEvery)
		y := chartBase - float64(s.Stuck)/scale*(chartBase-chartTop)
		line = append(line, coord(x)+","+coord(y))
		prev = s.At
	}
	c.Lines = append(c.Lines, points(line))
	last := samples[len(samples)-1]
	var b strings.Builder
	if c.Max == 0 {
		b.WriteString("none stuck in the day")
	} else {
		fmt.Fprintf(&b, "max %d at %s", c.Max, maxAt.UTC().Format("15:04 UTC"))
	}
	if now.Sub(last.At) <= 2*store.SampleEvery {
		fmt.Fprintf(&b, ", now %d", last.Stuck)
	} else {
		fmt.Fprintf(&b, ", %d at the last sample, %s (none since: is serve running?)", last.Stuck, last.At.UTC().Format("15:04 UTC"))
	}
	if len(samples) == 1 {
		b.WriteString("; 1 sample")
	} else {
		fmt.Fprintf(&b, "; %d samples", len(samples))
	}
	c.Text = b.String()
	return c
}

// points is a polyline's points: a lone sample is drawn as a dot (a
// zero-length line with round caps).
func points(line []string) string {
	if len(line) == 1 {
		line = append(line, line[0])
	}
	return strings.Join(line, " ")
}

// coord is a coordinate with at most one decimal.
func coord(v float64) string {
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}
