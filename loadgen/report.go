package loadgen

import (
	"slices"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// Rejected reports whether an error kind is the endpoint refusing the
// request (429 Too Many Requests, 503 Service Unavailable) rather than
// failing it.
func Rejected(kind string) bool { return kind == "http 429" || kind == "http 503" }

// Replicas returns the distinct Sample.Replica values of r, sorted; a run
// against a plain engine (no header) gives [""].
func (r *Result) Replicas() []string {
	var out []string
	for i := range r.Samples {
		if s := r.Samples[i].Replica; !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		out = []string{""}
	}
	return out
}

// ReportSamples converts r's samples for package report, in model time:
// At is the send time divided by the time scale. Replica is the index of
// Sample.Replica in replicas (nil means r.Replicas()), or -1 for a request
// that got no response or names a replica not listed. Requests skipped
// because the run ended are not included; requests cut short are errors.
func (r *Result) ReportSamples(replicas []string) []report.Sample {
	if replicas == nil {
		replicas = r.Replicas()
	}
	scale := r.TimeScale
	if scale <= 0 {
		scale = 1
	}
	out := make([]report.Sample, len(r.Samples))
	for i := range r.Samples {
		s := &r.Samples[i]
		rs := report.Sample{
			At:   time.Duration(float64(s.Sent) / scale),
			TTFT: s.TTFT, E2E: s.E2E, ITL: s.ITL,
			Prompt: s.PromptTokens, Cached: s.CachedTokens, Output: s.OutputTokens,
			PredictedCached: min(max(s.PredictedCached, 0), s.PromptTokens),
			Replica:         slices.Index(replicas, s.Replica),
			OK:              s.OK(), Rejected: Rejected(s.Err), Reason: s.Reason,
		}
		if !rs.OK && s.Replica == "" && !strings.HasPrefix(s.Err, "http") {
			rs.Replica = -1
		}
		out[i] = rs
	}
	return out
}

// Summarize returns the run's report.Result under the name policy (the
// policy behind the endpoint, or the target's name), over replicas as in
// ReportSamples. Its decision reasons and predicted hit rate come from the
// X-Kvrouter-Decision headers; without any (a plain engine) it has no
// prediction (report.Result.NoPrediction).
func (r *Result) Summarize(policy string, replicas []string, slo report.SLO) report.Result {
	if replicas == nil {
		replicas = r.Replicas()
	}
	return report.Summarize(r.ReportSamples(replicas), report.Options{Policy: policy, SLO: slo, Replicas: len(replicas),
		NoPrediction: !r.predicts()})
}

// predicts reports whether any response carried a prediction.
func (r *Result) predicts() bool {
	for i := range r.Samples {
		if r.Samples[i].PredictedCached >= 0 {
			return true
		}
	}
	return false
}
