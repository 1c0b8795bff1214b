package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Limits on a model list; a server that exceeds one gets an error wrapping
// ErrLimit, never an unbounded allocation.
const (
	// MaxModelsBody is the largest /v1/models body read, in bytes (4 MiB;
	// vLLM's entry for one model is about 500 bytes).
	MaxModelsBody = 4 << 20
	// MaxModels is the most entries a model list may have.
	MaxModels = 4096
	// MaxModelID is the longest model id or parent accepted, in bytes.
	MaxModelID = 512
	// ModelsTimeout bounds one ListModels call (5 s).
	ModelsTimeout = 5 * time.Second
)

// ErrLimit is wrapped by the errors of a model list over one of the limits.
var ErrLimit = errors.New("over limit")

// Model is one entry of a server's model list.
type Model struct {
	// ID is the model's served name, the "model" field of requests for it.
	ID string
	// Parent is, for a LoRA adapter, the ID of the base model it applies to
	// (vLLM lists each loaded adapter with its base as parent); empty for a
	// base model.
	Parent string
}

// ListModels GETs base+"/v1/models" (base is a replica base URL such as
// "http://10.0.0.1:8000") with client (nil means http.DefaultClient) and
// returns its entries in the server's order, an empty slice for an empty
// list. The call is bounded by ctx and by ModelsTimeout; the body by
// MaxModelsBody, the list by MaxModels and ids by MaxModelID. The shape is
// OpenAI's, {"object":"list","data":[{"id":..,"parent":..},..]}; other
// fields are ignored. Errors read "scrape URL: ...".
//
// vLLM builds the list in show_available_models
// (vllm/entrypoints/openai/serving_models.py, models/serving.py in newer
// releases).
func ListModels(ctx context.Context, client *http.Client, base string) ([]Model, error) {
	ctx, cancel := context.WithTimeout(ctx, ModelsTimeout)
	defer cancel()
	url := strings.TrimSuffix(base, "/") + "/v1/models"
	resp, err := get(ctx, client, url, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.ContentLength > MaxModelsBody {
		return nil, fmt.Errorf("scrape %s: %w: body of %d bytes, more than %d", url, ErrLimit, resp.ContentLength, MaxModelsBody)
	}
	models, err := decodeModels(&limitReader{r: resp.Body, max: MaxModelsBody, n: MaxModelsBody})
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return models, nil
}

// entry is the part of an OpenAI model card that ListModels keeps.
type entry struct {
	ID     string `json:"id"`
	Parent string `json:"parent"` // null for a base model
}

// decodeModels reads a model list from r as a stream of tokens, so that it
// can stop at MaxModels entries without decoding the rest.
func decodeModels(r io.Reader) ([]Model, error) {
	dec := json.NewDecoder(r)
	if err := expect(dec, '{'); err != nil {
		return nil, err
	}
	var models []Model
	seen := false
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, truncated(err)
		}
		if key != "data" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, fmt.Errorf("%v: %w", key, truncated(err))
			}
			continue
		}
		if seen {
			return nil, errors.New(`two "data" fields`)
		}
		seen = true
		if models, err = decodeData(dec); err != nil {
			return nil, err
		}
	}
	if err := expect(dec, '}'); err != nil {
		return nil, err
	}
	if !seen {
		return nil, errors.New(`no "data" field`)
	}
	return models, nil
}

// decodeData reads the "data" array of a model list.
func decodeData(dec *json.Decoder) ([]Model, error) {
	if err := expect(dec, '['); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	models := []Model{}
	for dec.More() {
		if len(models) == MaxModels {
			return nil, fmt.Errorf("%w: more than %d models", ErrLimit, MaxModels)
		}
		var e entry
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("model %d: %w", len(models), truncated(err))
		}
		if err := e.check(); err != nil {
			return nil, fmt.Errorf("model %d: %w", len(models), err)
		}
		models = append(models, Model(e))
	}
	if err := expect(dec, ']'); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return models, nil
}

// check validates one entry against the limits.
func (e entry) check() error {
	switch {
	case e.ID == "":
		return errors.New("no id")
	case len(e.ID) > MaxModelID:
		return fmt.Errorf("%w: id of %d bytes, more than %d", ErrLimit, len(e.ID), MaxModelID)
	case len(e.Parent) > MaxModelID:
		return fmt.Errorf("%w: parent of %d bytes, more than %d", ErrLimit, len(e.Parent), MaxModelID)
	}
	return nil
}

// expect reads the next token and fails unless it is the delimiter d.
func expect(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return truncated(err)
	}
	if tok != d {
		return fmt.Errorf("got %v, want %v", tok, d)
	}
	return nil
}

// truncated turns the io.EOF of a body that ends inside the list into
// io.ErrUnexpectedEOF.
func truncated(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// limitReader reads from r and fails with an error wrapping ErrLimit once
// more than max bytes have come (io.LimitReader would end them in a
// silent EOF, which the decoder reports as truncated JSON).
type limitReader struct {
	r   io.Reader
	max int64 // bytes allowed in all
	n   int64 // bytes still allowed; negative once over
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, l.over()
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1] // one byte past the limit tells that there is more
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, l.over()
	}
	return n, err
}

func (l *limitReader) over() error { return fmt.Errorf("%w: body over %d bytes", ErrLimit, l.max) }

var _ io.Reader = (*limitReader)(nil)
