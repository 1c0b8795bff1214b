package sse

import "bytes"

// facts are what a Tap and a Splice read from one event, found in one
// pass over it (scan). Every key they look for starts with a quote, so
// the pass visits each quote of the event once and compares the bytes
// there with the keys that start with the next byte. Each fact means
// exactly what the byte search it replaces meant (finished, HasValue,
// StringField, bytes.Contains), for occurrences inside strings and
// malformed JSON too: as those searches do, after an occurrence of a key
// the next one counts only from the key's end.
type facts struct {
	// ev[ds:de] is the payload of the first data line (Data).
	ds, de int
	// finished: a "finish_reason" in ev whose value is a string (finished).
	finished bool
	// usage: "prompt_tokens" is in ev.
	usage bool
	// reasoning, toolCalls: the data has a "reasoning_content" or
	// "reasoning" member, or a "tool_calls" one, with a value (HasValue).
	reasoning, toolCalls bool
	// content, text: where in ev the value of the data's first "content"
	// or "text" member whose value is a string opens its quote
	// (StringField), -1 without one; hasContent, hasText: the key is in
	// the data at all.
	content, text       int
	hasContent, hasText bool
	// emptyChoices: `"choices":[]` is in the data.
	emptyChoices bool
}

// keyStart are the bytes that follow the opening quote of a key scan
// looks for.
var keyStart = [256]bool{'c': true, 't': true, 'r': true, 'f': true, 'p': true}

// scan reads ev once for its facts.
func scan(ev []byte) facts {
	f := facts{content: -1, text: -1}
	f.ds, f.de = dataSpan(ev)
	data := ev[:f.de] // the data's members are read up to its end
	// from*: where the next occurrence of a key counts from.
	var fromContent, fromText, fromTools, fromReasoning, fromReason, fromFinish int
	for off := 0; off+1 < len(ev); off++ {
		if ev[off] != '"' || !keyStart[ev[off+1]] {
			continue
		}
		inData := off >= f.ds && off < f.de
		switch {
		case ev[off+1] == 'c' && inData:
			if off >= fromContent && bytes.HasPrefix(data[off:], contentKey) {
				f.hasContent, fromContent = true, off+len(contentKey)
				if f.content < 0 {
					f.content = stringAfter(data, fromContent)
				}
			}
			f.emptyChoices = f.emptyChoices || bytes.HasPrefix(data[off:], emptyChoices)
		case ev[off+1] == 't' && inData:
			if off >= fromText && bytes.HasPrefix(data[off:], textKey) {
				f.hasText, fromText = true, off+len(textKey)
				if f.text < 0 {
					f.text = stringAfter(data, fromText)
				}
			}
			if !f.toolCalls && off >= fromTools && bytes.HasPrefix(data[off:], toolCallsKey) {
				fromTools = off + len(toolCallsKey)
				f.toolCalls = valueAfter(data, fromTools)
			}
		case ev[off+1] == 'r' && inData && !f.reasoning:
			if off >= fromReasoning && bytes.HasPrefix(data[off:], reasoningKey) {
				fromReasoning = off + len(reasoningKey)
				f.reasoning = valueAfter(data, fromReasoning)
			}
			if !f.reasoning && off >= fromReason && bytes.HasPrefix(data[off:], reasonKey) {
				fromReason = off + len(reasonKey)
				f.reasoning = valueAfter(data, fromReason)
			}
		case ev[off+1] == 'f':
			if !f.finished && off >= fromFinish && bytes.HasPrefix(ev[off:], finishReasonKey) {
				fromFinish = off + len(finishReasonKey)
				f.finished = stringNext(ev, fromFinish)
			}
		case ev[off+1] == 'p':
			f.usage = f.usage || bytes.HasPrefix(ev[off:], promptTokensKey)
		}
	}
	return f
}
