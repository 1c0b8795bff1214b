package loadgen

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/trace"
)

// emulatedPromptTokens is the prompt the emulator tokenizes for msgs: its
// chat template's rendering, counted by its tokenizer.
func emulatedPromptTokens(msgs []Message) int {
	em := make([]emulator.Message, len(msgs))
	for i, m := range msgs {
		em[i] = emulator.Message{Role: m.Role, Content: m.Content}
	}
	return emulator.CountTokens(emulator.RenderChat(em, true))
}

// TestTextTokens: a replayed request reaches the emulator with about the
// tokens it stands for (a real engine's BPE counts each synthesised word
// as one token too): a recording's request (blocks of 16 tokens, as a
// text-mode router records them, sent as one message) and a built-in
// workload's conversations, within the chat template's few tokens.
// Replaying a recording once sent 1.74 times its tokens: words the
// emulator cut in two, and a message per block.
func TestTextTokens(t *testing.T) {
	var ids []string
	for i := range 30 {
		ids = append(ids, fmt.Sprint(1000+i))
	}
	line := fmt.Sprintf(`{"timestamp":0,"start_unix_ms":1,"input_length":490,"output_length":8,"hash_ids":[%s],"block_size":16,"session":"s"}`, strings.Join(ids, ","))
	var reqs []trace.Request
	for r, err := range trace.ReadMooncake(strings.NewReader(line + "\n")) {
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Requests: 20})
	if err != nil {
		t.Fatal(err)
	}
	reqs = append(reqs, w.Requests...)
	for _, r := range reqs {
		got := emulatedPromptTokens(Messages(&r, 1))
		if ratio := float64(got) / float64(r.Prompt); ratio < 1 || ratio > 1.1 && got-r.Prompt > 40 {
			t.Errorf("request %s (recorded %v, %d segments): %d tokens stand for %d in the emulator (%.2f times)", r.ID, r.Recorded, len(r.Segments), got, r.Prompt, ratio)
		}
	}
}
