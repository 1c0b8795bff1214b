package route

// prefillNS is the compute time of n new tokens after c cached, in ns.
func prefillNS(rt *Rates, n, c float64) float64 {
	return n*float64(rt.PrefillPerToken) + n*(c+n/2)*float64(rt.AttnPerMPairs)*1e-6
}

// stepNS is one decode iteration of n sequences holding context tokens of
// KV, in ns.
func stepNS(rt *Rates, n, context float64) float64 {
	return float64(rt.DecodeStep) + n*float64(rt.DecodePerSeq) + context*float64(rt.DecodePerMTokens)*1e-6
}

// iterNS is one iteration that carries a prefill on a replica of n
// sequences holding context tokens, beside the prefill's compute: a decode
// step of them, or on an idle replica (n = 0) the step overhead alone,
// since nothing decodes (engine.Engine's iteration time).
func iterNS(rt *Rates, n, context float64) float64 {
	if n <= 0 {
		return float64(rt.StepOverhead)
	}
	return stepNS(rt, n, context)
}
