package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// BuildProbes builds every configured tool's probe. Probes of type "go"
// come from registry (nil: none). The returned closer releases the probes'
// resources (sql probes' pools). A probe that cannot be built is a
// configuration error naming the tool.
func BuildProbes(ctx context.Context, cfg *config.Config, registry *probes.Registry) (map[string]probes.Probe, io.Closer, error) {
	out := map[string]probes.Probe{}
	var closers closerList
	for _, name := range cfg.ToolNames() {
		pc := cfg.Tools[name].Probe
		if pc == nil {
			if registry != nil {
				if p, ok := registry.Lookup(name); ok {
					out[name] = p
				}
			}
			continue
		}
		var p probes.Probe
		switch pc.Type {
		case "http":
			headers := map[string]string{}
			for k, v := range pc.Headers {
				headers[k] = v.Reveal()
			}
			// Keep as many idle connections as the tool has probes in
			// flight: the default two per host would open and close a
			// connection per probe under load.
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConnsPerHost = cfg.Policy(name).Concurrency
			closers = append(closers, closerFunc(tr.CloseIdleConnections))
			hp, err := probes.NewHTTP(probes.HTTPConfig{
				URL: pc.URL, Method: pc.Method, Headers: headers, Timeout: pc.Timeout.D(), Match: pc.Match,
				ResponseCode: pc.ResponseCode, ResponseBody: pc.ResponseBody, MaxBodyBytes: pc.MaxBodyBytes,
				NotFoundOn404: pc.NotFoundOn404, NotFoundBody: notFoundBody(pc),
				Client: &http.Client{Transport: tr},
			})
			if err != nil {
				closers.Close()
				return nil, nil, cfg.ErrorAt("tools."+name+".probe", "%v", err)
			}
			closers = append(closers, hp)
			p = hp
		case "sql":
			sp, err := probes.NewSQL(ctx, probes.SQLConfig{
				DatabaseURL: pc.DatabaseURL.Reveal(), Query: pc.Query, Args: pc.Args, Timeout: pc.Timeout.D(),
				ResponseCode: pc.ResponseCode, ResponseBody: pc.ResponseBody,
			})
			if err != nil {
				closers.Close()
				return nil, nil, cfg.ErrorAt("tools."+name+".probe", "%v", err)
			}
			closers = append(closers, sp)
			p = sp
		case "go":
			var ok bool
			if registry != nil {
				p, ok = registry.Lookup(name)
			}
			if !ok {
				closers.Close()
				return nil, nil, cfg.ErrorAt("tools."+name+".probe.type", "probe type go, but no Go probe is registered for tool %q in this binary", name)
			}
		default:
			closers.Close()
			return nil, nil, cfg.ErrorAt("tools."+name+".probe.type", "unknown probe type %q", pc.Type)
		}
		// Not guarded here: reconcile.New guards every probe, once.
		out[name] = p
	}
	return out, closers, nil
}

// rateLimit is a probe's tools.T.probe.rate_limit for the engine (zero: no
// limit).
func rateLimit(p *config.Probe) reconcile.RateLimit {
	if p == nil || p.RateLimit == nil {
		return reconcile.RateLimit{}
	}
	return reconcile.RateLimit{RPS: p.RateLimit.RPS, Burst: p.RateLimit.Burst}
}

// canaries are a probe's tools.T.probe.self_check.canaries for the engine.
func canaries(p *config.Probe) []reconcile.Canary {
	if p == nil {
		return nil
	}
	var out []reconcile.Canary
	for _, c := range p.SelfCheck.Canaries {
		out = append(out, reconcile.Canary{Key: c.Key, Request: json.RawMessage(c.Request)})
	}
	return out
}

type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

type closerList []io.Closer

func (c closerList) Close() error {
	for _, x := range c {
		_ = x.Close()
	}
	return nil
}

// EngineConfig turns the configuration into the engine's.
func EngineConfig(cfg *config.Config, built map[string]probes.Probe, actor string) reconcile.Config {
	tools := map[string]reconcile.Policy{}
	for _, name := range cfg.ToolNames() {
		pol := cfg.Policy(name)
		var timeout time.Duration
		switch {
		case pol.Probe != nil:
			timeout = pol.Probe.Timeout.D()
		case built[name] != nil: // a Go probe registered without a probe block
			timeout = probes.DefaultTimeout
		}
		tools[name] = reconcile.Policy{
			ProbeFingerprint:      probeFingerprint(pol.Probe),
			SelfCheckDisabled:     pol.Probe != nil && !pol.Probe.SelfCheckEnabled(),
			ProbeTimeout:          timeout,
			ProcessingWindow:      pol.ProcessingWindow,
			HeartbeatTimeout:      pol.HeartbeatTimeout,
			DownstreamDedupWindow: pol.DownstreamDedupWindow,
			Concurrency:           pol.Concurrency,
			Probe:                 built[name],
			RateLimit:             rateLimit(pol.Probe),
			Canaries:              canaries(pol.Probe),
			WitnessNotRequired:    pol.Probe != nil && !pol.Probe.WitnessRequired(),
		}
	}
	// The reconcile and self_check sections are the engine's own types:
	// a new setting there needs no line here.
	rc := cfg.Reconcile
	rc.Actor = actor
	rc.Tools = tools
	rc.Default = reconcile.Policy{
		ProcessingWindow: cfg.Defaults.ProcessingWindow.D(),
		HeartbeatTimeout: cfg.Defaults.HeartbeatTimeout.D(),
	}
	rc.SelfCheck = cfg.SelfCheck
	rc.RenotifyAfter = cfg.Alerts.RenotifyAfter.D()
	// One redactor for probe errors and evidence, before they reach the
	// audit trail, logs and alerts: every secret the configuration
	// registered.
	rc.Redactor = cfg.Redactor()
	return rc
}

// probeFingerprint identifies a probe's configuration, so that a stored
// self-check vouches only for the configuration it checked: every setting
// of the probe block (not_found_body, not_found_on_404, the self-check's
// canaries and require_witness included) enters it. Secret-typed
// values (headers, database URLs) enter it masked: rotating a credential
// does not by itself re-check (a wrong one shows as unknown verdicts and
// opens the breaker).
func probeFingerprint(p *config.Probe) string {
	if p == nil {
		return ""
	}
	b, err := json.Marshal(p)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// BuildEngine builds the reconcile engine and its probes from cfg.
func BuildEngine(ctx context.Context, cfg *config.Config, pool store.Pool, registry *probes.Registry, actor string, logger *slog.Logger, metrics *reconcile.Metrics) (*reconcile.Engine, io.Closer, error) {
	built, closer, err := BuildProbes(ctx, cfg, registry)
	if err != nil {
		return nil, nil, err
	}
	return reconcile.New(EngineConfig(cfg, built, actor), pool, logger, metrics), closer, nil
}

// ReplicaID names this process in audit rows and leases: $LEDGERKEEPER_REPLICA_ID,
// else $POD_NAME / $HOSTNAME, else the host name, plus the pid.
func ReplicaID() string {
	if id := os.Getenv("LEDGERKEEPER_REPLICA_ID"); id != "" {
		return id
	}
	host := os.Getenv("POD_NAME")
	if host == "" {
		host, _ = os.Hostname()
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// ReconcileJob is serve's reconcile job on spec: one pass of eng per run,
// stopped gracefully on shutdown (WindDown: no more leases, the probes in
// flight finish within the shutdown grace and their decisions are
// written), and one Info line "reconcile pass" per pass with its counts
// (reconcile.Report.LogAttrs), an idle pass included, so an idle daemon
// still shows it is working.
func ReconcileJob(spec string, eng *reconcile.Engine, logger *slog.Logger) Job {
	return Job{Name: "reconcile", Spec: spec, WindDown: true, Run: func(ctx context.Context) error {
		rep, err := eng.Run(ctx, reconcile.Options{Stop: Stopping(ctx)})
		if err == nil || rep.Stopped {
			logger.Info("reconcile pass", rep.LogAttrs()...)
		}
		return err
	}}
}
