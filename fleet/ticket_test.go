package fleet

import (
	"testing"
	"unsafe"
)

// TestTicketSize: every decision allocates a ticket, and the whole
// decision's budget is 300 B at 1,000 replicas (docs/benchmarks.md), the
// request id included: a ticket fits the 240 B size class, a learning
// policy's features aside (learnedTicket).
func TestTicketSize(t *testing.T) {
	if n := unsafe.Sizeof(Ticket{}); n > 240 {
		t.Errorf("a Ticket is %d B; want at most 240", n)
	}
}
