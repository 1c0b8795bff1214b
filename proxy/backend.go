package proxy

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// Backend is one replica: its base URL and optional extra endpoints, written
// as "http://h:8000,kv=tcp://h:5557,replay=tcp://h:5558,role=decode".
type Backend struct {
	// URL is the replica's OpenAI-compatible base URL (scheme://host:port).
	URL string
	// KV is the replica's KV-event publisher endpoint (precise mode); empty
	// means none.
	KV string
	// Replay is the replica's KV-event replay endpoint; empty means none.
	Replay string
	// Models are the model names the replica serves (option model=,
	// repeatable). Empty means the ones its GET /v1/models lists,
	// refreshed. The first is also the model its KV events are keyed
	// under when the engine's topic "kv@<host>:<port>@<model>" does not
	// name one.
	Models []string
	// Role is the replica's part in a disaggregated fleet (option role=):
	// route.RolePrefill runs prefill legs only (transfer.go), RoleDecode
	// takes requests, RoleBoth (the zero value, "both") is an ordinary
	// replica.
	Role route.Role
	// MaxNumSeqs is the engine's max_num_seqs (option max_num_seqs=): the
	// sequences it runs at once, which kv-aware prices a seat's wait
	// against. Zero means learned from its metrics (fleet.Replica).
	MaxNumSeqs int
	// Engine is the engine the replica runs (option engine=: vllm,
	// sglang or llamacpp), which decides how the remote tokenizer asks it
	// (hashing.Config.Engine) before its metrics say. Empty means the one
	// its /metrics shows.
	Engine string
}

// ParseBackend parses
// "URL[,kv=ENDPOINT][,replay=ENDPOINT][,model=NAME]...[,role=prefill|decode|both][,max_num_seqs=N][,engine=vllm|sglang|llamacpp]".
func ParseBackend(s string) (Backend, error) {
	parts := strings.Split(strings.TrimSpace(s), ",")
	b := Backend{URL: strings.TrimRight(strings.TrimSpace(parts[0]), "/")}
	if err := checkURL(b.URL); err != nil {
		return Backend{}, fmt.Errorf("backend %q: %w", s, err)
	}
	for _, opt := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(opt), "=")
		if !ok || v == "" {
			return Backend{}, fmt.Errorf("backend %q: option %q is not key=value", s, opt)
		}
		switch k {
		case "kv":
			b.KV = v
		case "replay":
			b.Replay = v
		case "model":
			b.Models = append(b.Models, v)
		case "role":
			r, err := route.ParseRole(v)
			if err != nil {
				return Backend{}, fmt.Errorf("backend %q: %w", s, err)
			}
			b.Role = r
		case "max_num_seqs":
			n, err := parseMaxNumSeqs(v)
			if err != nil {
				return Backend{}, fmt.Errorf("backend %q: %w", s, err)
			}
			b.MaxNumSeqs = n
		case "engine":
			e, err := scrape.ParseEngine(v)
			if err != nil {
				return Backend{}, fmt.Errorf("backend %q: %w", s, err)
			}
			b.Engine = e
		default:
			return Backend{}, fmt.Errorf("backend %q: unknown option %q (known: kv, replay, model, role, max_num_seqs, engine)", s, k)
		}
	}
	return b, nil
}

// parseMaxNumSeqs reads max_num_seqs: a positive integer, at most a
// million.
func parseMaxNumSeqs(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1<<20 {
		return 0, fmt.Errorf("max_num_seqs %q: want a positive integer (the engine's --max-num-seqs)", v)
	}
	return n, nil
}

// checkURL checks a backend's base URL, with a message that says how to
// fix it: a scheme (http:// or https://) and a host are needed, and the
// path must not end in /v1 (the router appends each request's own path).
func checkURL(s string) error {
	if !strings.Contains(s, "://") {
		return fmt.Errorf("URL needs a scheme, e.g. http://%s", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme must be http or https, got %q", u.Scheme)
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	if p := strings.TrimRight(u.Path, "/"); strings.HasSuffix(p, "/v1") {
		return fmt.Errorf("give the server's base URL, without /v1 (the router appends each request's path), e.g. %s://%s%s", u.Scheme, u.Host, strings.TrimSuffix(p, "/v1"))
	}
	return nil
}

// String renders b in the form ParseBackend reads.
func (b Backend) String() string {
	s := b.URL
	if b.KV != "" {
		s += ",kv=" + b.KV
	}
	if b.Replay != "" {
		s += ",replay=" + b.Replay
	}
	for _, m := range b.Models {
		s += ",model=" + m
	}
	if b.Role != route.RoleBoth {
		s += ",role=" + b.Role.String()
	}
	if b.MaxNumSeqs > 0 {
		s += ",max_num_seqs=" + strconv.Itoa(b.MaxNumSeqs)
	}
	if b.Engine != "" {
		s += ",engine=" + b.Engine
	}
	return s
}

// UnmarshalYAML reads a backend from its string form
// ("http://a:8000,kv=tcp://a:5557,model=m") or from a mapping with the
// keys url, kv, replay, models (a list, or one name), role, max_num_seqs
// and engine.
func (b *Backend) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var s string
		if err := n.Decode(&s); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		v, err := ParseBackend(s)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		*b = v
		return nil
	case yaml.MappingNode:
		return b.unmarshalMapping(n)
	}
	return fmt.Errorf("line %d: a backend is a string like http://host:port[,kv=...] or a mapping with url, kv, replay, models, role, max_num_seqs, engine", n.Line)
}

// unmarshalMapping reads the mapping form of a backend: unknown keys are
// errors, url is required and checked as --backend's is.
func (b *Backend) unmarshalMapping(n *yaml.Node) error {
	var v Backend
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		var err error
		switch k.Value {
		case "url":
			err = val.Decode(&v.URL)
			v.URL = strings.TrimRight(strings.TrimSpace(v.URL), "/")
		case "kv":
			err = val.Decode(&v.KV)
		case "replay":
			err = val.Decode(&v.Replay)
		case "models", "model":
			if val.Kind == yaml.ScalarNode {
				var m string
				err = val.Decode(&m)
				v.Models = append(v.Models, m)
			} else {
				err = val.Decode(&v.Models)
			}
		case "role":
			var r string
			if err = val.Decode(&r); err == nil {
				v.Role, err = route.ParseRole(r)
			}
		case "max_num_seqs":
			v.MaxNumSeqs, err = parseMaxNumSeqs(val.Value)
		case "engine":
			v.Engine, err = scrape.ParseEngine(val.Value)
		default:
			return fmt.Errorf("line %d: backend: unknown key %q (known: url, kv, replay, models, role, max_num_seqs, engine)", k.Line, k.Value)
		}
		if err != nil {
			return fmt.Errorf("line %d: backend %s: %w", val.Line, k.Value, err)
		}
	}
	if v.URL == "" {
		return fmt.Errorf("line %d: backend: url is required", n.Line)
	}
	if err := checkURL(v.URL); err != nil {
		return fmt.Errorf("line %d: backend %q: %w", n.Line, v.URL, err)
	}
	*b = v
	return nil
}

// MarshalYAML writes a backend in its string form.
func (b Backend) MarshalYAML() (any, error) { return b.String(), nil }
