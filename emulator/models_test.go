package emulator

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAliasesShareCache(t *testing.T) {
	s := start(t, Config{Model: "a", Aliases: []string{"b", "c"}})
	prompt := words("al", 300)
	body := func(model string) map[string]any {
		return map[string]any{"model": model, "prompt": prompt, "max_tokens": 2, "stream": true,
			"stream_options": map[string]any{"include_usage": true}}
	}
	var cached []int
	for _, model := range []string{"b", "a", "c"} {
		st := streamPost(t, s.URL()+"/v1/completions", body(model))
		for _, e := range st.events[:len(st.events)-1] {
			var r testResponse
			if err := json.Unmarshal([]byte(e), &r); err != nil {
				t.Fatal(err)
			}
			if r.Model != "a" { // vLLM answers with the first served name
				t.Errorf("request for %q: chunk model %q, want a", model, r.Model)
			}
		}
		u := decodeResponse(t, []byte(st.events[len(st.events)-2]))
		cached = append(cached, u.Usage.PromptTokensDetails.CachedTokens)
	}
	p := CountTokens(prompt)
	if cached[0] != 0 || cached[1] < p/16*16-16 || cached[2] < p/16*16-16 {
		t.Errorf("cached_tokens under b, a, c: %v, want 0 then >= %d twice (prompt %d tokens)", cached, p/16*16-16, p)
	}
}

// loraWorkload sends prompts of 3 blocks and 3 tokens, each under a model,
// and returns the cached tokens and response model of each.
func loraWorkload(t *testing.T, s *Server, steps []loraStep) (cached []int, models []string) {
	t.Helper()
	for _, st := range steps {
		ids := make([]uint32, 3*16+3)
		for i := range ids {
			ids[i] = uint32(st.prompt*1000 + i)
		}
		code, b := post(t, s.URL()+"/v1/completions", map[string]any{"model": st.model, "prompt": ids, "max_tokens": 1})
		if code != 200 {
			t.Fatalf("%+v: status %d: %s", st, code, b)
		}
		r := decodeResponse(t, b)
		cached, models = append(cached, r.Usage.PromptTokensDetails.CachedTokens), append(models, r.Model)
	}
	return cached, models
}

type loraStep struct {
	model  string
	prompt int // 1 or 2
}

func TestLoRAHasItsOwnCache(t *testing.T) {
	steps := []loraStep{{"m", 1}, {"sql", 1}, {"sql", 1}, {"sql", 2}, {"m", 2}, {"m", 1}}
	wantCached := []int{0, 0, 48, 0, 0, 48}
	wantModels := []string{"m", "sql", "sql", "sql", "m", "m"}
	tests := []struct {
		name, format string
		kvFullStatus int // hashes computed by the emulator instead of the engine
	}{
		{"map", FormatMap, 0},
		{"array", FormatArray, 0},
		{"map with kv full status", FormatMap, 500},
	}
	// chains are each run's stored block hashes by adapter and prompt.
	type key struct {
		lora   string
		prompt uint64
	}
	var first map[key][]uint64
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := zmqConfig(tt.format)
			cfg.LoRAs, cfg.KVFullStatus = []string{"chat", "sql"}, tt.kvFullStatus
			s := start(t, cfg)
			c := subscribe(t, s)
			cached, models := loraWorkload(t, s, steps)
			if !slices.Equal(cached, wantCached) || !slices.Equal(models, wantModels) {
				t.Errorf("cached_tokens %v, models %v; want %v, %v", cached, models, wantCached, wantModels)
			}
			_, evs := collect(t, c, tt.format, func(e []kvEvent) bool { return count(e, "BlockStored") >= 4*3 })
			chains := map[key][]uint64{}
			for _, e := range evs {
				k := key{prompt: e.Tokens[0] / 1000}
				switch {
				case e.LoRAName == nil && e.LoRAID == nil:
				case e.LoRAName != nil && *e.LoRAName == "sql" && e.LoRAID != nil && *e.LoRAID == 2:
					k.lora = "sql"
				default:
					t.Fatalf("BlockStored with lora_name %v, lora_id %v; want sql and 2, or nil", e.LoRAName, e.LoRAID)
				}
				chains[k] = append(chains[k], e.Hashes...)
			}
			want := []key{{"", 1}, {"", 2}, {"sql", 1}, {"sql", 2}}
			if len(chains) != len(want) {
				t.Fatalf("stored chains %v, want %v", chains, want)
			}
			for _, k := range want {
				if len(chains[k]) != 3 {
					t.Errorf("%+v: %d blocks stored, want 3", k, len(chains[k]))
				}
			}
			for _, h := range chains[key{"sql", 1}] {
				if slices.Contains(chains[key{"", 1}], h) {
					t.Errorf("block %d stored for both the base model and the adapter", h)
				}
			}
			if first == nil {
				first = chains
			} else if diff := cmp.Diff(first, chains); diff != "" {
				t.Errorf("block hashes differ from the first run's (-first +this):\n%s", diff)
			}
		})
	}
}

func TestModelsListsNamesAndAdapters(t *testing.T) {
	s := start(t, Config{Model: "a", Aliases: []string{"b"}, LoRAs: []string{"sql", "chat"}})
	resp, err := http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	type card struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
		Permission  []struct {
			Object        string `json:"object"`
			AllowSampling bool   `json:"allow_sampling"`
		} `json:"permission"`
	}
	var got []card
	for i, raw := range list.Data {
		var keys map[string]json.RawMessage
		json.Unmarshal(raw, &keys)
		for _, k := range []string{"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} {
			if _, ok := keys[k]; !ok {
				t.Errorf("card %d has no %q: %s", i, k, raw)
			}
		}
		var c card
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Permission) != 1 || c.Permission[0].Object != "model_permission" || !c.Permission[0].AllowSampling {
			t.Errorf("card %s: permission %+v", c.ID, c.Permission)
		}
		c.Permission = nil
		got = append(got, c)
	}
	a, mml := "a", s.EngineConfig().MaxModelLen
	want := []card{
		{ID: "a", Object: "model", OwnedBy: "vllm", Root: "a", MaxModelLen: &mml},
		{ID: "b", Object: "model", OwnedBy: "vllm", Root: "a", MaxModelLen: &mml},
		{ID: "sql", Object: "model", OwnedBy: "vllm", Root: "/lora/sql", Parent: &a},
		{ID: "chat", Object: "model", OwnedBy: "vllm", Root: "/lora/chat", Parent: &a},
	}
	if list.Object != "list" {
		t.Errorf("object %q, want list", list.Object)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("/v1/models (-want +got):\n%s", diff)
	}
}

func TestUnknownModel(t *testing.T) {
	s := start(t, Config{Model: "a", Aliases: []string{"b"}, LoRAs: []string{"sql"}})
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	tests := []struct {
		path, model string
		status      int
	}{
		{"/v1/completions", "x", 404},
		{"/v1/chat/completions", "sql2", 404},
		{"/tokenize", "m", 404},
		{"/v1/chat/completions", "sql", 200},
		{"/tokenize", "b", 200},
		{"/tokenize", "sql", 200},
	}
	for _, tt := range tests {
		t.Run(tt.path+" "+tt.model, func(t *testing.T) {
			code, b := post(t, s.URL()+tt.path, map[string]any{"model": tt.model, "prompt": "hi", "messages": msgs, "max_tokens": 1})
			if code != tt.status {
				t.Fatalf("status %d, want %d: %s", code, tt.status, b)
			}
			if code == 200 {
				return
			}
			e := decodeError(t, b)
			want := "The model `" + tt.model + "` does not exist."
			if e.Message != want || e.Type != "NotFoundError" || e.Code != 404 || e.Param == nil || *e.Param != "model" {
				t.Errorf("error %s, want vLLM's: message %q, type NotFoundError, param model, code 404", b, want)
			}
		})
	}
}

func TestServedNamesValidated(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"alias repeats the model", Config{Model: "a", Aliases: []string{"a"}}},
		{"adapter repeats an alias", Config{Model: "a", Aliases: []string{"b"}, LoRAs: []string{"b"}}},
		{"empty alias", Config{Model: "a", Aliases: []string{""}}},
		{"empty adapter", Config{LoRAs: []string{""}}},
		{"kv full status 200", Config{KVFullStatus: 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Errorf("New(%+v): no error", tt.cfg)
			}
		})
	}
}
