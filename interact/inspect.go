package interact

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

// inspectHistory is how many of the newest audit entries Inspect shows:
// the last decisions; the whole trail is `ledgerkeeper inspect`'s.
const inspectHistory = 5

// maxSection bounds one section's text (Slack allows 3000 characters).
const maxSection = 2900

// inspect answers user alone with what `ledgerkeeper inspect` shows:
// the row, the reconcile state of the current claim, the hold, open alerts
// and the last decisions, judged by the database's clock.
func (h *Handler) inspect(ctx context.Context, b book, w where, user, key string) error {
	in, err := operator.Inspect(ctx, b.pool, operator.InspectRequest{Key: key, HistoryLimit: inspectHistory, Windows: b.windows})
	if errors.Is(err, operator.ErrNoKey) {
		h.reply(w, user, explain(err, key))
		return nil
	}
	if err != nil {
		h.replyFailed(w, user)
		return err
	}
	text, blocks := h.renderInspection(in, key)
	h.reply(w, user, text, blocks...)
	return nil
}

// renderInspection is an inspection as Slack blocks: every value from the
// ledger redacted, escaped and bounded.
func (h *Handler) renderInspection(in operator.Inspection, key string) (string, []slack.Block) {
	code := func(s string, max int) string { return alerts.InlineCode(h.red.String(s), max) }
	k, j := in.Key, in.Judgement
	fallback := "Inspect " + code(key, 400)
	var row strings.Builder
	if j.Condition == operator.Purged {
		row.WriteString("*Key* " + code(key, 400) + ": the row was purged after it expired (or deleted); its audit trail remains.")
	} else {
		status := k.Status
		switch {
		case j.Held:
			status += " (held: never probed, resolved or purged until released)"
		case j.Condition == operator.InFlight:
			status += fmt.Sprintf(" (in flight: inside its window + grace of %s or heartbeating; the reconciler leaves it alone)", in.Window)
		case j.Condition == operator.Stuck:
			status += fmt.Sprintf(" (stuck: past its window + grace of %s)", in.Window)
		}
		fmt.Fprintf(&row, "*Key* %s · *tool* %s\n*Status* %s", code(k.Key, 400), code(k.Tool, 200), alerts.EscapeMrkdwn(status))
		fmt.Fprintf(&row, "\n*claimed* %s (%s ago) · *created* %s · *updated* %s · *expires* %s",
			ts(k.ClaimedAt), j.Age.Round(time.Second), ts(k.CreatedAt), ts(k.UpdatedAt), ts(k.ExpiresAt))
		if k.HeartbeatAt != nil {
			fmt.Fprintf(&row, "\n*heartbeat* %s (%s ago)", ts(*k.HeartbeatAt), j.HeartbeatAge.Round(time.Second))
		}
		fmt.Fprintf(&row, "\n*request_hash* %s · *request_body* %s", code(k.RequestHash, 80), code(string(k.RequestBody), 300))
		if k.ResponseCode != nil {
			fmt.Fprintf(&row, "\n*response* %d %s", *k.ResponseCode, code(string(k.ResponseBody), 300))
		}
	}
	var state strings.Builder
	if s := in.State; s != nil {
		fmt.Fprintf(&state, "*Reconcile* attempts %d", s.Attempts)
		if s.LastVerdict != nil {
			state.WriteString(" · last verdict " + code(*s.LastVerdict, 40))
		}
		if s.NextProbeAt != nil {
			state.WriteString(" · next probe " + ts(*s.NextProbeAt))
		}
		if j.Leased {
			state.WriteString(" · leased by " + code(*s.LeaseOwner, 120) + " until " + ts(*s.LeaseExpiresAt))
		}
		if s.LastError != nil {
			state.WriteString("\n*Last probe error* " + alerts.CodeBlock(h.red.String(*s.LastError), 800))
		}
	}
	if hd := in.Hold; hd != nil {
		sep(&state)
		state.WriteString("*Hold* by " + code(hd.Actor, 120) + " since " + ts(hd.CreatedAt) + ": " + alerts.EscapeMrkdwn(oneLine(h.red.String(hd.Reason), 300)))
	}
	if len(in.Alerts) > 0 {
		var rs []string
		for _, a := range in.Alerts {
			rs = append(rs, code(string(a.Reason), 40))
		}
		sep(&state)
		state.WriteString("*Open alerts* " + strings.Join(rs, ", "))
	}
	var hist strings.Builder
	fmt.Fprintf(&hist, "*Last decisions* (newest %d; the whole trail: `ledgerkeeper inspect`)", inspectHistory)
	if len(in.History) == 0 {
		hist.WriteString("\nnone: nothing was decided for this key yet")
	}
	for _, e := range in.History {
		detail := e.Error
		if len(e.Evidence) > 0 {
			detail = strings.TrimSpace(detail + " evidence: " + string(e.Evidence))
		}
		fmt.Fprintf(&hist, "\n• %s · %s · %s · %s", ts(e.CreatedAt), code(e.Actor, 80), code(e.Verdict, 20), code(e.Action, 40))
		if detail != "" {
			hist.WriteString(" · " + alerts.EscapeMrkdwn(oneLine(h.red.String(detail), 200)))
		}
	}
	blocks := []slack.Block{mrkdwn(clip(row.String()))}
	if state.Len() > 0 {
		blocks = append(blocks, mrkdwn(clip(state.String())))
	}
	blocks = append(blocks, mrkdwn(clip(hist.String())))
	return fallback, blocks
}

func sep(b *strings.Builder) {
	if b.Len() > 0 {
		b.WriteString("\n")
	}
}

// clip is the last guard on a section's length; every part is bounded
// already, so it only cuts what a pathological mix adds up to.
func clip(s string) string {
	if r := []rune(s); len(r) > maxSection {
		return string(r[:maxSection-1]) + "…"
	}
	return s
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }
