package emulator

import (
	"fmt"
	"net/http"

	"github.com/cespare/xxhash/v2"
)

// Served names and LoRA adapters, after vLLM's OpenAIServingModels
// (vllm/entrypoints/openai/serving_models.py): every served name is the
// same base model on one engine, and each adapter is a model of its own
// whose parent is the first served name.

// servedModel says how to serve a request that names a model.
type servedModel struct {
	// name is the model responses carry: the first served name for the
	// base model and its aliases (vLLM's models.model_name(None)), the
	// adapter's name for an adapter.
	name string
	// lora is the adapter's name, "" for the base model.
	lora string
}

// servedModels maps every name a request may give to how it is served. It
// rejects empty and repeated names; cfg.Model is already defaulted.
func servedModels(cfg Config) (map[string]servedModel, error) {
	m := map[string]servedModel{}
	add := func(name string, sm servedModel) error {
		if name == "" {
			return fmt.Errorf("emulator: empty served model or adapter name")
		}
		if _, dup := m[name]; dup {
			return fmt.Errorf("emulator: model name %q given twice", name)
		}
		m[name] = sm
		return nil
	}
	for _, name := range append([]string{cfg.Model}, cfg.Aliases...) {
		if err := add(name, servedModel{name: cfg.Model}); err != nil {
			return nil, err
		}
	}
	for _, name := range cfg.LoRAs {
		if err := add(name, servedModel{name: name, lora: name}); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// resolve returns how to serve a request naming model; empty means the
// base model, as in vLLM. Any other name gets vLLM's 404.
func (s *Server) resolve(model string) (servedModel, error) {
	if model == "" {
		return servedModel{name: s.cfg.Model}, nil
	}
	if sm, ok := s.served[model]; ok {
		return sm, nil
	}
	return servedModel{}, &httpError{status: http.StatusNotFound, param: "model",
		msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// modelCard is one entry of GET /v1/models (vLLM's ModelCard).
type modelCard struct {
	ID          string       `json:"id"`
	Object      string       `json:"object"`
	Created     int64        `json:"created"`
	OwnedBy     string       `json:"owned_by"`
	Root        string       `json:"root"`
	Parent      *string      `json:"parent"`
	MaxModelLen *int         `json:"max_model_len"`
	Permission  []permission `json:"permission"`
}

// permission is vLLM's ModelPermission, with its default values.
type permission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// loraRoot is the root (vLLM: the adapter's local path) of adapter name.
func loraRoot(name string) string { return "/lora/" + name }

// modelCards lists the served names, then the adapters, as vLLM's
// show_available_models does: a served name's root is the base model (here
// the first served name) and its max_model_len is set; an adapter's parent
// is the first served name and its max_model_len is null.
func (s *Server) modelCards() []modelCard {
	base := s.cfg.Model
	mml := s.ecfg.MaxModelLen
	var cards []modelCard
	for _, name := range s.Models() {
		cards = append(cards, s.card(name, base, nil, &mml))
	}
	for _, name := range s.cfg.LoRAs {
		cards = append(cards, s.card(name, loraRoot(name), &base, nil))
	}
	return cards
}

func (s *Server) card(id, root string, parent *string, maxModelLen *int) modelCard {
	perm := permission{
		ID:     fmt.Sprintf("modelperm-%016x", xxhash.Sum64String(id)),
		Object: "model_permission", Created: s.created,
		AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
	}
	return modelCard{ID: id, Object: "model", Created: s.created, OwnedBy: "vllm",
		Root: root, Parent: parent, MaxModelLen: maxModelLen, Permission: []permission{perm}}
}

// models answers GET /v1/models.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": s.cards})
}
