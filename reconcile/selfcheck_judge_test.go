package reconcile

import "testing"

// The self-check's judgement over 0-4 samples, every mix of passed,
// failed, unanswered, not rendered and witness-only, and the made-up key's
// verdicts.
func TestJudge(t *testing.T) {
	t.Parallel()
	var (
		absentOK         = SampleCheck{Verdict: "not_found", Passed: true}
		absentFound      = SampleCheck{Verdict: "found"}
		absentUnknown    = SampleCheck{Verdict: "unknown"}
		absentUnanswered = SampleCheck{Verdict: "unknown", Unreachable: true}
		absentNotRender  = SampleCheck{Verdict: "unknown", NotRendered: true, Error: "{request.ref}: the key has no request body"}
		pass             = SampleCheck{Verdict: "found", Passed: true, Source: SourceCompleted}
		fail             = SampleCheck{Verdict: "not_found", Source: SourceCompleted}
		unanswered       = SampleCheck{Verdict: "unknown", Unreachable: true, Source: SourceCompleted}
		notRendered      = SampleCheck{Verdict: "unknown", NotRendered: true, Source: SourceCanary}
		oldGone          = SampleCheck{Verdict: "not_found", WitnessOnly: true, Source: SourceNewest}
		oldFound         = SampleCheck{Verdict: "found", Passed: true, WitnessOnly: true, Source: SourceNewest}
	)
	cases := []struct {
		name          string
		absent        SampleCheck
		samples       []SampleCheck
		want          string
		witnessed     bool
		disagreements int
	}{
		{"no sample, made-up key absent", absentOK, nil, CheckTrusted, false, 0},
		{"no sample, made-up key found", absentFound, nil, CheckUntrusted, false, 0},
		{"no sample, made-up key unknown (a router's page)", absentUnknown, nil, CheckUntrusted, false, 0},
		{"no sample, made-up key unanswered", absentUnanswered, nil, CheckInconclusive, false, 0},
		{"made-up key not rendered is inconclusive, never untrusted", absentNotRender, nil, CheckInconclusive, false, 0},
		{"made-up key not rendered, samples pass", absentNotRender, []SampleCheck{pass}, CheckInconclusive, true, 0},
		{"one sample passed", absentOK, []SampleCheck{pass}, CheckTrusted, true, 0},
		{"one sample failed", absentOK, []SampleCheck{fail}, CheckUntrusted, false, 0},
		{"one sample unanswered", absentOK, []SampleCheck{unanswered}, CheckInconclusive, false, 0},
		{"one canary not rendered", absentOK, []SampleCheck{notRendered}, CheckInconclusive, false, 0},
		{"two samples, both failed", absentOK, []SampleCheck{fail, fail}, CheckUntrusted, false, 0},
		{"two samples, one failed", absentOK, []SampleCheck{pass, fail}, CheckTrusted, true, 1},
		{"two samples, one failed one unanswered", absentOK, []SampleCheck{fail, unanswered}, CheckInconclusive, false, 0},
		{"three samples, two failed", absentOK, []SampleCheck{pass, fail, fail}, CheckUntrusted, true, 0},
		{"three samples, one failed", absentOK, []SampleCheck{pass, pass, fail}, CheckTrusted, true, 1},
		{"three samples, one failed one unanswered", absentOK, []SampleCheck{pass, fail, unanswered}, CheckTrusted, true, 1},
		{"three samples, all unanswered", absentOK, []SampleCheck{unanswered, unanswered, unanswered}, CheckInconclusive, false, 0},
		{"four samples, two failed (not most)", absentOK, []SampleCheck{pass, pass, fail, fail}, CheckTrusted, true, 2},
		{"four samples, three failed", absentOK, []SampleCheck{pass, fail, fail, fail}, CheckUntrusted, true, 0},
		{"an old key gone downstream is no failure", absentOK, []SampleCheck{oldGone}, CheckTrusted, false, 0},
		{"an old key found witnesses", absentOK, []SampleCheck{oldFound}, CheckTrusted, true, 0},
		{"samples pass but the made-up key was found", absentFound, []SampleCheck{pass, pass, pass}, CheckUntrusted, true, 0},
		{"samples pass, made-up key unanswered", absentUnanswered, []SampleCheck{pass}, CheckInconclusive, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := CheckResult{Absent: c.absent, Samples: c.samples}
			judge(&r)
			if r.Outcome != c.want || r.Witnessed() != c.witnessed || r.PresentUnverified == c.witnessed || r.Disagreements != c.disagreements {
				t.Fatalf("outcome %s witnessed %v unverified %v disagreements %d; want %s, %v, %d (%s)",
					r.Outcome, r.Witnessed(), r.PresentUnverified, r.Disagreements, c.want, c.witnessed, c.disagreements, r.Summary)
			}
		})
	}
}
