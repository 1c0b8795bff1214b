package loadgen

import (
	"strconv"
	"strings"
)

// HeaderDecision is the response header in which kvrouter summarises its
// routing decision: "reason=prefix; predicted-cached=1024; cost=12.500ms;
// session=header; id=kvr-1-7" (proxy.HeaderDecision).
const HeaderDecision = "X-Kvrouter-Decision"

// maxDecisionHeader caps the header value parseDecision reads; kvrouter's
// is well under 200 bytes.
const maxDecisionHeader = 1024

// parseDecision reads the reason and the predicted cached tokens of an
// X-Kvrouter-Decision value. ok is false when v carries no reason (an
// empty, oversized or foreign header); predicted is -1 when the value has
// no valid predicted-cached field.
func parseDecision(v string) (reason string, predicted int, ok bool) {
	predicted = -1
	if v == "" || len(v) > maxDecisionHeader {
		return "", -1, false
	}
	for field := range strings.SplitSeq(v, ";") {
		k, val, found := strings.Cut(strings.TrimSpace(field), "=")
		if !found {
			continue
		}
		switch k {
		case "reason":
			reason = val
		case "predicted-cached":
			if n, err := strconv.Atoi(val); err == nil && n >= 0 {
				predicted = n
			}
		}
	}
	return reason, predicted, reason != ""
}
