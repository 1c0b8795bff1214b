package kube

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/url"
)

// InferenceObjective's API group and version (Gateway API Inference
// Extension, alpha).
const (
	ObjectiveGroup   = "inference.networking.x-k8s.io"
	ObjectiveVersion = "v1alpha2"
)

// objective is the part of an InferenceObjective (GIE
// apix/v1alpha2) the router reads: spec.priority (unset: 0) and
// spec.poolRef.name.
type objective struct {
	Spec struct {
		Priority *int `json:"priority"`
		PoolRef  struct {
			Name string `json:"name"`
		} `json:"poolRef"`
	} `json:"spec"`
}

// objectiveSet is the Handler of an InferenceObjective watch: the
// priorities of the objectives that name the pool, by objective name.
type objectiveSet struct {
	pool     string
	prio     map[string]int
	onChange func(map[string]int)
}

func (s *objectiveSet) Replace(objs []Object) {
	s.prio = map[string]int{}
	for _, o := range objs {
		s.put(o)
	}
	s.onChange(maps.Clone(s.prio))
}

func (s *objectiveSet) Apply(typ string, o Object) {
	delete(s.prio, o.Meta.Name)
	if typ != Deleted {
		s.put(o)
	}
	s.onChange(maps.Clone(s.prio))
}

func (s *objectiveSet) put(o Object) {
	var ob objective
	if json.Unmarshal(o.Raw, &ob) != nil || ob.Spec.PoolRef.Name != s.pool {
		return
	}
	p := 0
	if ob.Spec.Priority != nil {
		p = *ob.Spec.Priority
	}
	s.prio[o.Meta.Name] = p
}

// FollowObjectives watches the InferenceObjectives of namespace that
// reference the pool until ctx is done, calling onChange with their
// priorities by objective name after the first list and at every change.
// It returns ctx's error.
func (c *Client) FollowObjectives(ctx context.Context, namespace, pool string, onChange func(map[string]int), log *slog.Logger) error {
	col := Collection{Path: "/apis/" + ObjectiveGroup + "/" + ObjectiveVersion + "/namespaces/" + url.PathEscape(namespace) + "/inferenceobjectives"}
	return c.Follow(ctx, col, &objectiveSet{pool: pool, onChange: onChange}, log)
}
