package prefix

import (
	"errors"
	"fmt"
	"math"
)

// Limits bound what Parse accepts, so that a request's memory is a small
// multiple of its body, whatever its shape. Each is checked while the body
// is read, before the structure it bounds is built: a body past a limit is
// rejected when the first element too many is reached.
//
// A zero field means its default (Default…); a negative one means no limit
// (nesting is then still bounded by HardMaxDepth, as in encoding/json).
// The YAML keys are kvrouter serve's flag names.
type Limits struct {
	// Messages is the most chat messages a request may carry; zero means
	// DefaultMaxMessages.
	Messages int `yaml:"max-messages"`
	// Parts is the most content parts (the elements of array contents) of
	// all the messages together; zero means DefaultMaxParts.
	Parts int `yaml:"max-content-parts"`
	// Depth is the deepest nesting of objects and arrays in the body, the
	// body's own object counting as 1 (so a chat with content parts needs
	// 5, a tool's JSON schema more); zero means DefaultMaxDepth.
	Depth int `yaml:"max-json-depth"`
	// Tools is the most entries of the "tools" array; zero means
	// DefaultMaxTools.
	Tools int `yaml:"max-tools"`
	// Prompts is the most prompts of a completions batch (an array of
	// strings or of token-id arrays); zero means DefaultMaxPrompts.
	Prompts int `yaml:"max-prompts"`
}

// Defaults of Limits. Messages and Tools are OpenAI's own limits on
// messages and tools (2,048 messages there; more here, for long agent
// traces).
const (
	DefaultMaxMessages = 4096
	DefaultMaxParts    = 8192
	DefaultMaxDepth    = 64
	DefaultMaxTools    = 128
	DefaultMaxPrompts  = 1024
	// HardMaxDepth bounds nesting even when Limits.Depth is negative.
	HardMaxDepth = 10000
)

// DefaultLimits returns the limits that zero values stand for.
func DefaultLimits() Limits {
	return Limits{Messages: DefaultMaxMessages, Parts: DefaultMaxParts, Depth: DefaultMaxDepth,
		Tools: DefaultMaxTools, Prompts: DefaultMaxPrompts}
}

// NoLimits returns Limits with every limit off (nesting still bounded by
// HardMaxDepth).
func NoLimits() Limits { return Limits{Messages: -1, Parts: -1, Depth: -1, Tools: -1, Prompts: -1} }

// ErrLimit is matched (errors.Is) by every limit error; each limit has
// its own sentinel as well.
var ErrLimit = errors.New("request exceeds a parse limit")

// Limit errors Limits.Parse returns (wrapped, with the offset and the
// limit), each matching ErrLimit.
var (
	// ErrTooManyMessages: more messages than Limits.Messages.
	ErrTooManyMessages error = limitError("too many messages")
	// ErrTooManyParts: more content parts than Limits.Parts.
	ErrTooManyParts error = limitError("too many content parts")
	// ErrTooDeep: objects and arrays nested deeper than Limits.Depth.
	ErrTooDeep error = limitError("nested too deep")
	// ErrTooManyTools: more tools than Limits.Tools.
	ErrTooManyTools error = limitError("too many tools")
	// ErrTooManyPrompts: a completions batch of more than Limits.Prompts.
	ErrTooManyPrompts error = limitError("too many prompts")
)

// limitError is a limit's sentinel: its message, matching ErrLimit.
type limitError string

func (e limitError) Error() string { return string(e) }

// Is reports whether target is ErrLimit.
func (e limitError) Is(target error) bool { return target == ErrLimit }

// resolved returns l with defaults in place of zeros and math.MaxInt (or
// HardMaxDepth) in place of negatives.
func (l Limits) resolved() Limits {
	depth := or(l.Depth, DefaultMaxDepth)
	return Limits{
		Messages: or(l.Messages, DefaultMaxMessages),
		Parts:    or(l.Parts, DefaultMaxParts),
		Depth:    min(depth, HardMaxDepth),
		Tools:    or(l.Tools, DefaultMaxTools),
		Prompts:  or(l.Prompts, DefaultMaxPrompts),
	}
}

// or is v, def for zero, math.MaxInt for a negative v.
func or(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return math.MaxInt
	}
	return v
}

// Parse is the package Parse under limits l: it returns an error wrapping
// one of the ErrLimit errors as soon as the body is found past a limit,
// else what Parse returns.
func (l Limits) Parse(body []byte) (*Prompt, error) {
	return parse(body, l.resolved())
}

// limitErr reports that the body has more than limit of what sentinel counts.
func (s *scanner) limitErr(sentinel error, limit int) error {
	return fmt.Errorf("offset %d: %w: more than %d", s.i, sentinel, limit)
}

// down enters one level of nesting, failing past Limits.Depth; up leaves
// it.
func (s *scanner) down() error {
	if s.depth++; s.depth > s.lim.Depth {
		return s.limitErr(ErrTooDeep, s.lim.Depth)
	}
	return nil
}

func (s *scanner) up() { s.depth-- }

// tools reads "tools": any value (kept raw), an array counted against
// Limits.Tools as it is read.
func (s *scanner) tools() ([]byte, error) {
	if null, err := s.null(); null || err != nil {
		return nil, err
	}
	if s.ws() != '[' {
		return s.raw()
	}
	from := s.i
	if err := s.down(); err != nil {
		return nil, err
	}
	defer s.up()
	s.i++
	for n := 0; ; n++ {
		more, err := s.more(']', n)
		if err != nil {
			return nil, err
		}
		if !more {
			break
		}
		if n >= s.lim.Tools {
			return nil, s.limitErr(ErrTooManyTools, s.lim.Tools)
		}
		if err := s.skip(); err != nil {
			return nil, err
		}
	}
	return append([]byte(nil), s.b[from:s.i]...), nil
}
