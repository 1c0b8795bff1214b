package fleet

import (
	"fmt"
	"testing"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// TestDecideOnlyWhereServed: a replica is a candidate only for the models
// it serves (declared or listed), and for any while its models are
// unknown.
func TestDecideOnlyWhereServed(t *testing.T) {
	f := newFleet(t, Config{Replicas: []Replica{{ID: a, Models: []string{"m"}}, {ID: b, Models: []string{"other"}}, {ID: c}},
		Policy: route.RoundRobin{}})
	var sc Scratch
	route := func(model string) map[int]int {
		got := map[int]int{}
		for i := range 30 {
			d, tk := f.Decide(&Request{ID: fmt.Sprint(model, i), Model: model}, nil, t0, &sc)
			got[d.Replica]++
			tk.Done(t0, NoUsage, nil)
		}
		return got
	}
	if got := route("other"); got[0] != 0 || got[1] == 0 || got[2] == 0 {
		t.Errorf("model other with c unknown: per replica %v, want none on 0, some on 1 and 2", got)
	}
	f.SetModels(c, []scrape.Model{{ID: "m"}, {ID: "sql-lora", Parent: "m"}})
	f.SetModels(a, []scrape.Model{{ID: "other"}}) // declared: ignored
	if got := route("other"); got[1] != 30 {
		t.Errorf("model other: per replica %v, want all 30 on 1", got)
	}
	if got := route("sql-lora"); got[2] != 30 {
		t.Errorf("adapter: per replica %v, want all 30 on 2", got)
	}
	if got := route(""); len(got) != 3 {
		t.Errorf("no model: per replica %v, want all three used", got)
	}
	if d, tk := f.Decide(&Request{ID: "x", Model: "nope"}, nil, t0, &sc); tk != nil || d.Replica != -1 {
		t.Errorf("unserved model: decision %+v, want a rejection", d)
	}
	for _, tt := range []struct {
		model string
		want  bool
	}{{"m", true}, {"other", true}, {"sql-lora", true}, {"nope", false}, {"", true}} {
		if got := f.Serves(tt.model); got != tt.want {
			t.Errorf("Serves(%q) = %v, want %v", tt.model, got, tt.want)
		}
	}
	if base, lora := f.ModelKey("sql-lora"); base != "m" || lora != "sql-lora" {
		t.Errorf("ModelKey(sql-lora) = %q, %q; want m, sql-lora", base, lora)
	}
	if base, lora := f.ModelKey("m"); base != "m" || lora != "" {
		t.Errorf("ModelKey(m) = %q, %q; want m, \"\"", base, lora)
	}
	if ms, known := f.Models(a); !known || len(ms) != 1 || ms[0].ID != "m" {
		t.Errorf("Models(a) = %v, %v; want the declared [m]", ms, known)
	}
}

// TestSessionFollowsModel: a session bound to a replica that does not
// serve the request's model is not pinned there.
func TestSessionFollowsModel(t *testing.T) {
	f := newFleet(t, Config{Replicas: []Replica{{ID: a, Models: []string{"m"}}, {ID: b, Models: []string{"m", "other"}}},
		Policy: route.SessionHash{}})
	var sc Scratch
	f.bind("s", f.lookup(a), t0, nil)
	d, tk := f.Decide(&Request{ID: "x", Model: "other", Session: "s"}, nil, t0, &sc)
	if sc.Request.Pinned != -1 || d.Replica != 1 {
		t.Errorf("pinned %d, chose %d; want -1 and 1", sc.Request.Pinned, d.Replica)
	}
	tk.Done(t0, NoUsage, nil)
}
