package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Event types of a watch stream.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
	Bookmark = "BOOKMARK"
	Error    = "ERROR"
)

// Meta is the part of an object's metadata the router reads.
type Meta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	DeletionTimestamp *string           `json:"deletionTimestamp,omitempty"`
}

// Object is one object as a list or an event carries it: its metadata
// and its whole JSON.
type Object struct {
	Meta Meta
	Raw  json.RawMessage
}

// Handler receives a followed collection's state. Replace gives the whole
// collection (after a list: the first, and after a 410 or a reconnect
// that needed one); Apply one change. Both run on Follow's goroutine.
type Handler interface {
	Replace(objs []Object)
	Apply(typ string, obj Object)
}

// Collection is what Follow lists and watches: the path of a namespaced
// collection and its selectors.
type Collection struct {
	// Path is the collection's path, e.g. /api/v1/namespaces/llm/pods.
	Path string
	// LabelSelector and FieldSelector filter it ("app=vllm",
	// "metadata.name=pool"); empty selects everything.
	LabelSelector, FieldSelector string
}

// watchTimeout is the timeoutSeconds a watch asks for; the server ends
// the stream then and Follow watches again from where it was.
const watchTimeout = 5 * time.Minute

// errGone is a watch's 410: the resource version is too old; relist.
var errGone = errors.New("kube: resource version too old (410 Gone)")

// Follow lists col, hands the objects to h, and watches from the list's
// resource version, handing h every change, until ctx is done; it returns
// ctx's error. A watch that ends is started again from the last version
// seen (bookmarks advance it), a 410 Gone lists again, and a failure
// tries again; each after the backoff of backoff.go unless the watch
// that ended had lived stableWatch. log receives the failures; nil
// discards them.
func (c *Client) Follow(ctx context.Context, col Collection, h Handler, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b backoff
	var rv string
	listed := false
	for ctx.Err() == nil {
		var err error
		if !listed {
			if rv, err = c.list(ctx, col, h); err == nil {
				listed = true
				continue
			}
		} else {
			start := c.now()
			rv, err = c.watch(ctx, col, rv, h)
			if err == nil && c.now().Sub(start) >= stableWatch {
				b.reset()
				continue
			}
			listed = !errors.Is(err, errGone)
		}
		if ctx.Err() != nil || !c.pause(ctx, &b, col, err, log) {
			break
		}
	}
	return ctx.Err()
}

// pause waits out b (or the server's Retry-After) after err: a failure,
// a 410, or nil for a watch that ended early.
func (c *Client) pause(ctx context.Context, b *backoff, col Collection, err error, log *slog.Logger) bool {
	var ra time.Duration
	var se *StatusError
	if errors.As(err, &se) {
		ra = se.RetryAfter
	}
	d := b.wait(ra, c.jitter())
	level, msg := slog.LevelWarn, "kubernetes watch failed; retrying"
	switch {
	case err == nil:
		level, msg = slog.LevelDebug, "kubernetes watch ended early; watching again"
	case errors.Is(err, errGone):
		level, msg = slog.LevelInfo, "kubernetes watch expired (410 Gone); listing again"
	case IsStatus(err, http.StatusNotFound): // a CRD not installed (an optional one): no alarm
		level = slog.LevelDebug
	}
	log.Log(ctx, level, msg, "path", col.Path, "err", err, "in", d)
	return c.sleep(ctx, d)
}

// list reads the whole collection, hands it to h, and returns its
// resource version.
func (c *Client) list(ctx context.Context, col Collection, h Handler) (string, error) {
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := c.do(ctx, http.MethodGet, col.Path, col.query(), nil, &l); err != nil {
		return "", err
	}
	objs := make([]Object, 0, len(l.Items))
	for _, raw := range l.Items {
		o, err := objectOf(raw)
		if err != nil {
			return "", fmt.Errorf("kube list %s: %w", col.Path, err)
		}
		objs = append(objs, o)
	}
	h.Replace(objs)
	return l.Metadata.ResourceVersion, nil
}

func (col Collection) query() url.Values {
	q := url.Values{}
	if col.LabelSelector != "" {
		q.Set("labelSelector", col.LabelSelector)
	}
	if col.FieldSelector != "" {
		q.Set("fieldSelector", col.FieldSelector)
	}
	return q
}

// watch streams col's changes after rv to h until the stream ends, and
// returns the last resource version seen.
func (c *Client) watch(ctx context.Context, col Collection, rv string, h Handler) (string, error) {
	q := col.query()
	q.Set("watch", "true")
	q.Set("resourceVersion", rv)
	q.Set("allowWatchBookmarks", "true")
	q.Set("timeoutSeconds", strconv.Itoa(int(watchTimeout/time.Second)))
	wctx, cancel := context.WithTimeout(ctx, watchTimeout+30*time.Second)
	defer cancel()
	req, err := c.request(wctx, http.MethodGet, col.Path, q, nil)
	if err != nil {
		return rv, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return rv, fmt.Errorf("kube watch %s: %w", col.Path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode == http.StatusGone {
			return rv, errGone
		}
		return rv, fmt.Errorf("kube watch %s: %w", col.Path, statusError(resp, b))
	}
	return c.events(resp.Body, col, rv, h)
}

// events reads a watch stream: one JSON event per line.
func (c *Client) events(body io.Reader, col Collection, rv string, h Handler) (string, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), c.cfg.MaxEventBytes)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return rv, fmt.Errorf("kube watch %s: event: %w", col.Path, err)
		}
		if ev.Type == Error {
			se := &StatusError{}
			_ = json.Unmarshal(ev.Object, se)
			se.RetryAfter = time.Duration(min(max(se.Details.RetryAfterSeconds, 0), int(maxRetryAfter/time.Second))) * time.Second
			if se.Code == http.StatusGone {
				return rv, errGone
			}
			return rv, fmt.Errorf("kube watch %s: %w", col.Path, se)
		}
		o, err := objectOf(ev.Object)
		if err != nil {
			return rv, fmt.Errorf("kube watch %s: %w", col.Path, err)
		}
		if o.Meta.ResourceVersion != "" {
			rv = o.Meta.ResourceVersion
		}
		switch ev.Type {
		case Added, Modified, Deleted:
			h.Apply(ev.Type, o)
		case Bookmark:
		default:
			return rv, fmt.Errorf("kube watch %s: unknown event type %q", col.Path, ev.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return rv, fmt.Errorf("kube watch %s: %w", col.Path, err)
	}
	return rv, nil // the server ended the watch (its timeout)
}

func objectOf(raw json.RawMessage) (Object, error) {
	var o struct {
		Metadata Meta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return Object{}, fmt.Errorf("object: %w", err)
	}
	return Object{Meta: o.Metadata, Raw: raw}, nil
}
