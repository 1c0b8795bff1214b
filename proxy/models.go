package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// modelsTTL is how long the union of the backends' models is cached.
const modelsTTL = 5 * time.Second

// modelsCache holds the last union of /v1/models. mu guards body, cards
// and at.
type modelsCache struct {
	mu    sync.Mutex
	body  []byte
	cards []modelCard
	at    time.Time
}

// modelCard is one entry of /v1/models; unknown fields are kept as they came.
type modelCard map[string]any

// serveModels answers GET /v1/models with the union, by id, of the healthy
// backends' models, cached for modelsTTL. With no healthy replica it
// answers 503 (with Retry-After), as /health does: OpenAI clients retry a
// 503 after Retry-After, while an empty list would tell them, wrongly and
// for good, that the model does not exist.
func (rt *Router) serveModels(w http.ResponseWriter, r *http.Request) {
	body, _, ok := rt.modelList(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// serveModel answers GET /v1/models/{id} with the model object of id from
// the union of /v1/models, an OpenAI 404 (model_not_found) for an id no
// healthy replica lists, and 503 as serveModels does.
func (rt *Router) serveModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	_, cards, ok := rt.modelList(w, r)
	if !ok {
		return
	}
	for _, m := range cards {
		if m["id"] == id {
			b, _ := json.Marshal(m)
			w.Header().Set("Content-Type", "application/json")
			w.Write(append(b, '\n'))
			return
		}
	}
	rt.countAPI(codeModelNotFound)
	writeParamError(w, http.StatusNotFound, errInvalidRequest, codeModelNotFound, "model",
		"The model `"+id+"` does not exist.")
}

// modelList returns the union of the healthy replicas' models, as the
// /v1/models body and as cards, from the cache when it is fresh; when
// none can be had it answers 503 itself and returns ok false.
func (rt *Router) modelList(w http.ResponseWriter, r *http.Request) (body []byte, cards []modelCard, ok bool) {
	if rt.anyHealthy(nil) < 0 {
		rt.countAPI(rt.writeNoReplica(w))
		return nil, nil, false
	}
	rt.models.mu.Lock()
	body, cards = rt.models.body, rt.models.cards
	fresh := rt.now().Sub(rt.models.at) < modelsTTL
	rt.models.mu.Unlock()
	if body != nil && fresh {
		return body, cards, true
	}
	cards, err := rt.fetchModels(r.Context())
	if err != nil {
		rt.countAPI(codeNoHealthy)
		writeUnavailable(w, rt.cfg.HealthInterval, codeNoHealthy, "no replica listed its models: "+err.Error())
		return nil, nil, false
	}
	body, _ = json.Marshal(map[string]any{"object": "list", "data": cards})
	rt.models.mu.Lock()
	rt.models.body, rt.models.cards, rt.models.at = body, cards, rt.now()
	rt.models.mu.Unlock()
	return body, cards, true
}

// fetchModels asks every healthy backend, concurrently, and merges.
func (rt *Router) fetchModels(ctx context.Context) ([]modelCard, error) {
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
	return out, nil
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
	pre, allowed := rt.sf.pass.match(r)
	if !allowed {
		rt.countAPI(codeUnknownURL)
		writeNotFound(w, r)
		return
	}
	c := rt.newCall(r, false)
	c.pass = pre
	defer c.finish(r.Context())
	body, ok := c.readBody(w, r)
	if !ok {
		return
	}
	c.id = rt.idPrefix + "pass-" + strconv.FormatUint(rt.seq.Add(1), 10) // its own, as a completion's
	if !c.passTo(rt.passReplica(r)) {
		c.status, c.errCode = http.StatusServiceUnavailable, rt.writeNoReplica(w)
		rt.countAPI(c.errCode)
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
