package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// modelsTTL is how long the union of the backends' models is cached.
const modelsTTL = 5 * time.Second

// modelsCache holds the last union of /v1/models. mu guards body and at.
type modelsCache struct {
	mu   sync.Mutex
	body []byte
	at   time.Time
}

// modelCard is one entry of /v1/models; unknown fields are kept as they came.
type modelCard map[string]any

// serveModels answers GET /v1/models with the union, by id, of the healthy
// backends' models, cached for modelsTTL.
func (rt *Router) serveModels(w http.ResponseWriter, r *http.Request) {
	rt.models.mu.Lock()
	body := rt.models.body
	fresh := rt.now().Sub(rt.models.at) < modelsTTL
	rt.models.mu.Unlock()
	if body == nil || !fresh {
		b, err := rt.fetchModels(r.Context())
		if err != nil {
			writeUnavailable(w, rt.cfg.HealthInterval, "no replica listed its models: "+err.Error())
			return
		}
		body = b
		rt.models.mu.Lock()
		rt.models.body, rt.models.at = b, rt.now()
		rt.models.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// fetchModels asks every healthy backend, concurrently, and merges.
func (rt *Router) fetchModels(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	bes := rt.st.bes.list()
	lists := make([][]modelCard, len(bes))
	errs := make([]error, len(bes))
	var wg sync.WaitGroup
	for i, be := range bes {
		name := be.cfg.URL
		if !rt.st.healthy(i) {
			continue
		}
		wg.Go(func() { lists[i], errs[i] = rt.fetchModelList(ctx, name) })
	}
	wg.Wait()
	seen := map[string]bool{}
	out := []modelCard{}
	var firstErr error
	ok := false
	for i := range lists {
		if errs[i] != nil {
			firstErr = errs[i]
			continue
		}
		if lists[i] != nil {
			ok = true
		}
		for _, m := range lists[i] {
			id, _ := m["id"].(string)
			if id == "" || seen[id] {
				continue
			}
			seen[id] = true
			out = append(out, m)
		}
	}
	if !ok && firstErr != nil {
		return nil, firstErr
	}
	return json.Marshal(map[string]any{"object": "list", "data": out})
}

func (rt *Router) fetchModelList(ctx context.Context, base string) ([]modelCard, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := rt.upstream.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, &statusError{base, resp.StatusCode}
	}
	var v struct {
		Data []modelCard `json:"data"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 4<<20)).Decode(&v); err != nil {
		return nil, err
	}
	if v.Data == nil {
		v.Data = []modelCard{}
	}
	return v.Data, nil
}

type statusError struct {
	url    string
	status int
}

func (e *statusError) Error() string {
	return e.url + "/v1/models: " + http.StatusText(e.status)
}

// servePassThrough forwards any other route Config.PassThrough allows to
// a healthy replica, with the same retry rule as completions; others get
// a JSON 404 and never reach a replica.
func (rt *Router) servePassThrough(w http.ResponseWriter, r *http.Request) {
	if !rt.sf.pass.allows(r) {
		rt.countAPI(codeUnknownURL)
		writeNotFound(w, r)
		return
	}
	c := rt.newCall(r, false)
	defer c.finish(r.Context())
	body, ok := c.readBody(w, r)
	if !ok {
		return
	}
	c.id = "kvr-pass"
	if !c.passTo(rt.anyHealthy(nil)) {
		c.status, c.errCode = http.StatusServiceUnavailable, "no_healthy_replica"
		writeUnavailable(w, rt.cfg.HealthInterval, "no healthy replica")
		return
	}
	out := r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	c.setBody(out, body)
	if len(body) == 0 {
		out.Body, out.ContentLength, out.GetBody = http.NoBody, 0, nil
		out.Header.Del("Content-Length")
	}
	rt.rp.ServeHTTP(w, out)
}

// passTo sends a pass-through call to replica i (-1: none), charging it
// an in-flight request with no prefill.
func (c *call) passTo(i int) bool {
	if i < 0 {
		return false
	}
	now := c.rt.now()
	tk, err := c.rt.st.fleet.Acquire(c.rt.name(i), fleet.Claim{}, now)
	if err != nil {
		return false
	}
	c.replica, c.ticket, c.sent = i, tk, now
	return true
}

// anyHealthy returns the healthy replica with the fewest in-flight requests,
// skipping those in exclude, or -1.
func (rt *Router) anyHealthy(exclude []int) int {
	var s route.Snapshot
	rt.st.fleet.Snapshot(&s, rt.now(), 0)
	best := -1
	for i := range s.Replicas {
		if !s.Replicas[i].Healthy || contains(exclude, i) {
			continue
		}
		if best < 0 || s.Replicas[i].InFlight < s.Replicas[best].InFlight {
			best = i
		}
	}
	return best
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
