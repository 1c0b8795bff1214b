package emulator

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"

	"github.com/cespare/xxhash/v2"
)

// Embeddings (POST /v1/embeddings), as vLLM serves them for an embedding
// model: each input is prefilled by the engine (one output token, its
// prefill being the cost) and answered with a deterministic unit vector
// of the input's tokens, of "dimensions" floats (DefaultEmbeddingDims
// without), as floats or base64 little-endian float32s.

// DefaultEmbeddingDims is the length of an embedding when the request
// does not say.
const DefaultEmbeddingDims = 32

// Limits of an embeddings request: OpenAI's 2,048 inputs, and a vector of
// at most 4,096 floats.
const (
	maxEmbeddingInputs = 2048
	maxEmbeddingDims   = 4096
)

// embeddingsRequest is the body of POST /v1/embeddings.
type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// embeddingInputs turns "input" (a string, strings, token ids, or arrays
// of token ids) into token lists.
func embeddingInputs(raw json.RawMessage) ([][]uint32, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]uint32{Tokenize(one)}, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		out := make([][]uint32, len(many))
		for i, s := range many {
			out[i] = Tokenize(s)
		}
		return out, nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return [][]uint32{ids}, nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil {
		return idss, nil
	}
	return nil, errors.New("input must be a string, an array of strings, an array of token ids, or an array of arrays of token ids")
}

// embedding is the unit vector of tokens, dims floats.
func embedding(tokens []uint32, dims int) []float32 {
	v := make([]float32, dims)
	var b [8]byte
	norm := 0.0
	for i := range v {
		d := xxhash.New()
		binary.LittleEndian.PutUint64(b[:], uint64(i))
		d.Write(b[:])
		for _, t := range tokens {
			binary.LittleEndian.PutUint32(b[:4], t)
			d.Write(b[:4])
		}
		x := float64(d.Sum64()%2001)/1000 - 1
		v[i] = float32(x)
		norm += x * x
	}
	if norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / math.Sqrt(norm))
		}
	}
	return v
}

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingsRequest
	sm, ok := s.request(w, r, &req, &req.Model)
	if !ok {
		return
	}
	inputs, err := embeddingInputs(req.Input)
	switch {
	case err != nil:
		fail(w, badRequest("%v", err))
		return
	case len(inputs) == 0 || len(inputs) > maxEmbeddingInputs:
		fail(w, badRequest("input must hold 1 to %d inputs, got %d", maxEmbeddingInputs, len(inputs)))
		return
	}
	dims := DefaultEmbeddingDims
	if req.Dimensions != nil {
		if dims = *req.Dimensions; dims < 1 || dims > maxEmbeddingDims {
			fail(w, badRequest("dimensions must be 1 to %d, got %d", maxEmbeddingDims, dims))
			return
		}
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		fail(w, badRequest("encoding_format must be float or base64, got %q", req.EncodingFormat))
		return
	}
	jobs := make([]*job, len(inputs))
	for i, toks := range inputs {
		jobs[i] = &job{id: s.newID("embd-"), model: sm.name, lora: sm.lora, tokens: toks}
		one := 1
		if err := s.limits(jobs[i], &one, nil); err != nil {
			fail(w, err)
			return
		}
	}
	flights := make([]*flight, len(jobs))
	for i, j := range jobs {
		f, ok := s.start(w, r, j)
		if !ok {
			return
		}
		flights[i] = f
	}
	data := make([]map[string]any, len(jobs))
	prompt := 0
	for i, f := range flights {
		if _, err := s.wait(r.Context(), f, nil); err != nil {
			if r.Context().Err() == nil {
				writeError(w, http.StatusServiceUnavailable, err.Error())
			}
			return
		}
		prompt += len(inputs[i])
		v := embedding(inputs[i], dims)
		var e any = v
		if req.EncodingFormat == "base64" {
			b := make([]byte, 0, 4*len(v))
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
			e = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": e}
	}
	writeJSON(w, map[string]any{"object": "list", "data": data, "model": sm.name,
		"usage": map[string]int{"prompt_tokens": prompt, "total_tokens": prompt}})
}
