package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"
)

// Lease is the part of a coordination.k8s.io/v1 Lease leader election
// reads and writes.
type Lease struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Metadata   Meta      `json:"metadata"`
	Spec       LeaseSpec `json:"spec"`
}

// LeaseSpec is a Lease's spec; times are metav1.MicroTime strings.
type LeaseSpec struct {
	HolderIdentity       *string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds *int32  `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          *string `json:"acquireTime,omitempty"`
	RenewTime            *string `json:"renewTime,omitempty"`
	LeaseTransitions     *int32  `json:"leaseTransitions,omitempty"`
}

// microTime is metav1.MicroTime's JSON layout.
const microTime = "2006-01-02T15:04:05.000000Z07:00"

// Defaults of Election's zero fields, client-go's.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Election is leader election over one Lease, as client-go's
// tools/leaderelection does it: a candidate takes the lease when it is
// free or its holder has not renewed it for LeaseDuration, the leader
// renews it every RetryPeriod and steps down when it could not for
// RenewDeadline, and releases it when its context ends. Every write
// carries the resourceVersion read, so two candidates never both win (the
// loser gets 409 Conflict).
type Election struct {
	Client    *Client
	Namespace string
	Name      string
	// Identity names this candidate (its pod name). Required.
	Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod: zero means the defaults.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnChange, when set, is called with true when this candidate becomes
	// the leader and false when it stops being one.
	OnChange func(leader bool)
	// Logger receives transitions and failures; nil discards them.
	Logger *slog.Logger

	leader atomic.Bool
	now    func() time.Time
	// observed is the lease record last read (holder, renew time,
	// version) and observedAt when it was first seen so: a holder has
	// expired once the record has not changed for its lease duration on
	// this candidate's clock, as client-go judges it (no trust in the
	// holder's clock). Only Run's goroutine touches them.
	observed   string
	observedAt time.Time
}

// Leader reports whether this candidate holds the lease.
func (e *Election) Leader() bool { return e.leader.Load() }

// Run campaigns until ctx is done, then releases the lease if it holds
// it, and returns nil; an invalid Election is an error at once.
func (e *Election) Run(ctx context.Context) error {
	if e.Client == nil || e.Namespace == "" || e.Name == "" || e.Identity == "" {
		return errors.New("kube election: need a client, namespace, name and identity")
	}
	e.LeaseDuration = cmp.Or(e.LeaseDuration, DefaultLeaseDuration)
	e.RenewDeadline = cmp.Or(e.RenewDeadline, DefaultRenewDeadline)
	e.RetryPeriod = cmp.Or(e.RetryPeriod, DefaultRetryPeriod)
	if e.RenewDeadline >= e.LeaseDuration || e.RetryPeriod >= e.RenewDeadline {
		return errors.New("kube election: want RetryPeriod < RenewDeadline < LeaseDuration")
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.Logger == nil {
		e.Logger = slog.New(slog.DiscardHandler)
	}
	var lastRenew time.Time
	tick := time.NewTicker(e.RetryPeriod)
	defer tick.Stop()
	for {
		ok, err := e.try(ctx)
		switch {
		case ok:
			lastRenew = e.now()
			e.set(true)
		case e.Leader() && (err == nil || e.now().Sub(lastRenew) >= e.RenewDeadline):
			e.set(false) // another took it, or renewals failed too long
		}
		if err != nil && ctx.Err() == nil {
			e.Logger.Warn("lease election: renewal failed", "lease", e.Name, "err", err)
		}
		select {
		case <-ctx.Done():
			if e.Leader() {
				e.release()
				e.set(false)
			}
			return nil
		case <-tick.C:
		}
	}
}

func (e *Election) set(leader bool) {
	if e.leader.Swap(leader) == leader {
		return
	}
	e.Logger.Info("lease election", "lease", e.Name, "identity", e.Identity, "leader", leader)
	if e.OnChange != nil {
		e.OnChange(leader)
	}
}

func (e *Election) path() string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(e.Namespace) + "/leases"
}

// try acquires or renews the lease once; ok says this candidate holds it.
func (e *Election) try(ctx context.Context) (bool, error) {
	now := e.now()
	var l Lease
	err := e.Client.do(ctx, http.MethodGet, e.path()+"/"+url.PathEscape(e.Name), nil, nil, &l)
	if IsStatus(err, http.StatusNotFound) {
		l = Lease{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Metadata: Meta{Name: e.Name, Namespace: e.Namespace}}
		e.hold(&l, now, true)
		err = e.Client.do(ctx, http.MethodPost, e.path(), nil, &l, nil)
		return err == nil, ignoreConflict(err)
	}
	if err != nil {
		return false, err
	}
	holder := deref(l.Spec.HolderIdentity)
	if rec := holder + "|" + deref(l.Spec.RenewTime) + "|" + l.Metadata.ResourceVersion; rec != e.observed {
		e.observed, e.observedAt = rec, now
	}
	if holder != e.Identity && holder != "" && !e.expired(l.Spec, now) {
		return false, nil
	}
	e.hold(&l, now, holder != e.Identity)
	err = e.Client.do(ctx, http.MethodPut, e.path()+"/"+url.PathEscape(e.Name), nil, &l, nil)
	return err == nil, ignoreConflict(err)
}

// expired reports whether the lease record has not changed for its
// lease duration since this candidate first saw it.
func (e *Election) expired(spec LeaseSpec, now time.Time) bool {
	d := time.Duration(deref(spec.LeaseDurationSeconds)) * time.Second
	return now.After(e.observedAt.Add(d))
}

// hold writes this candidate into l as holder, renewed at now; acquire
// marks a new holder (acquire time, one more transition).
func (e *Election) hold(l *Lease, now time.Time, acquire bool) {
	ts := now.UTC().Format(microTime)
	secs := int32(max(e.LeaseDuration/time.Second, 1))
	if acquire {
		l.Spec.AcquireTime = &ts
		n := deref(l.Spec.LeaseTransitions)
		if l.Metadata.ResourceVersion != "" { // an existing lease changes hands
			n++
		}
		l.Spec.LeaseTransitions = &n
	}
	id := e.Identity
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &id, &secs, &ts
}

// release hands the lease back (no holder, one-second duration), as
// client-go's ReleaseOnCancel does, so a follower takes over at once.
func (e *Election) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.RetryPeriod)
	defer cancel()
	var l Lease
	if err := e.Client.do(ctx, http.MethodGet, e.path()+"/"+url.PathEscape(e.Name), nil, nil, &l); err != nil {
		return
	}
	if deref(l.Spec.HolderIdentity) != e.Identity {
		return
	}
	empty, one := "", int32(1)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &empty, &one
	if err := e.Client.do(ctx, http.MethodPut, e.path()+"/"+url.PathEscape(e.Name), nil, &l, nil); err != nil {
		e.Logger.Warn("lease election: release failed", "lease", e.Name, "err", err)
	}
}

// ignoreConflict drops a 409: another candidate wrote first; not an
// error, just not ours.
func ignoreConflict(err error) error {
	if IsStatus(err, http.StatusConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
