package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/ardanlabs/jinja"
)

// chatTemplate is a model's Jinja chat template with the variables its
// tokenizer_config.json defines (bos_token, eos_token, ...).
type chatTemplate struct {
	tmpl *jinja.Template
	vars map[string]jinja.Value
}

func parseChatTemplate(data []byte) (*chatTemplate, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	raw, ok := cfg["chat_template"]
	if !ok {
		return nil, nil
	}
	var src string
	if err := json.Unmarshal(raw, &src); err != nil {
		return nil, fmt.Errorf("chat_template: want a string: %w", err)
	}
	tmpl, err := jinja.Compile(splitConcats(src))
	if err != nil {
		return nil, fmt.Errorf("chat_template: %w", err)
	}
	ct := &chatTemplate{tmpl: tmpl, vars: map[string]jinja.Value{}}
	for _, k := range []string{"bos_token", "eos_token", "pad_token", "unk_token"} {
		var s string
		if json.Unmarshal(cfg[k], &s) == nil {
			ct.vars[k] = jinja.NewString(s)
		}
	}
	return ct, nil
}

// ErrNoTemplate is returned by RenderChat for a tokenizer without a chat
// template.
var ErrNoTemplate = errors.New("tokenizer has no chat template")

// RenderChat renders an OpenAI chat request's messages (and tools, may be
// nil) through the model's chat template with add_generation_prompt, as
// vLLM does before tokenizing. The JSON keeps its key order, so tools render
// exactly as the engine renders them.
func (t *Tokenizer) RenderChat(messages, tools json.RawMessage) (string, error) {
	if t.template == nil {
		return "", ErrNoTemplate
	}
	vars := make(map[string]jinja.Value, len(t.template.vars)+3)
	for k, v := range t.template.vars {
		vars[k] = v
	}
	msgs, err := t.messageValues(messages)
	if err != nil {
		return "", fmt.Errorf("messages: %w", err)
	}
	vars["messages"] = msgs
	if len(tools) > 0 && string(tools) != "null" {
		tv, err := orderedValue(tools)
		if err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
		vars["tools"] = tv
	}
	vars["add_generation_prompt"] = jinja.NewBool(true)
	return t.template.tmpl.RenderValues(vars)
}

// Chat renders messages and tools through the chat template and appends
// their token ids to out.
func (t *Tokenizer) Chat(messages, tools json.RawMessage, out []uint32) ([]uint32, error) {
	text, err := t.RenderChat(messages, tools)
	if err != nil {
		return out, err
	}
	// About 3-4 bytes a token for English, code and CJK: one allocation
	// instead of a dozen growing ones.
	out = slices.Grow(out, len(text)/3+16)
	return t.Encode(text, out), nil
}

// orderedValue decodes JSON into jinja values, keeping object key order
// (jinja.FromGoValue would sort keys and change `tools | tojson`).
func orderedValue(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch tok := tok.(type) {
	case json.Delim:
		switch tok {
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token() // ]
			return jinja.NewList(items), err
		case '{':
			d := jinja.NewDict()
			dict := d.AsDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				dict.Set(k.(string), v)
			}
			_, err := dec.Token() // }
			return d, err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", tok)
	default:
		return jinja.FromGoValue(tok), nil
	}
}

// messageValues decodes a messages array, memoising each message's value by
// its bytes: a conversation's next turn decodes only its new messages.
func (t *Tokenizer) messageValues(data []byte) (jinja.Value, error) {
	elems, err := splitArray(data)
	if err != nil {
		return jinja.Undefined(), err
	}
	items := make([]jinja.Value, len(elems))
	for i, e := range elems {
		t.mu.Lock()
		v, ok := t.msgs[string(e)]
		t.mu.Unlock()
		if !ok {
			if v, err = orderedValue(e); err != nil {
				return jinja.Undefined(), err
			}
			t.mu.Lock()
			if len(t.msgs) >= maxMemo {
				clear(t.msgs)
			}
			t.msgs[string(e)] = v
			t.mu.Unlock()
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

// splitArray cuts a JSON array into its elements' bytes without decoding
// them (orderedValue validates each one it decodes).
func splitArray(data []byte) ([][]byte, error) {
	data = bytes.TrimSpace(data)
	if len(data) < 2 || data[0] != '[' || data[len(data)-1] != ']' {
		return nil, errors.New("want a JSON array")
	}
	var out [][]byte
	depth, start, inStr := 0, -1, false
	for i := 1; i < len(data)-1; i++ {
		c := data[i]
		if inStr {
			// Jump to the closing quote, one not escaped by an odd run of
			// backslashes: strings are most of the bytes of a
			// conversation, and IndexByte scans them fastest.
			j := bytes.IndexByte(data[i:len(data)-1], '"')
			if j < 0 {
				return nil, errors.New("unterminated string in JSON array")
			}
			i += j
			k := i
			for k > 0 && data[k-1] == '\\' {
				k--
			}
			if (i-k)%2 == 0 {
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return nil, errors.New("unbalanced JSON array")
			}
		case ',':
			if depth == 0 {
				if start < 0 {
					return nil, errors.New("empty array element")
				}
				out = append(out, bytes.TrimSpace(data[start:i]))
				start = -1
			}
			continue
		case ' ', '\t', '\n', '\r':
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if inStr || depth != 0 {
		return nil, errors.New("unbalanced JSON array")
	}
	if start >= 0 {
		out = append(out, bytes.TrimSpace(data[start:len(data)-1]))
	} else if len(out) > 0 {
		return nil, errors.New("trailing comma in array")
	}
	return out, nil
}
