// Package prefix turns prompts into ordered lists of chained block hashes,
// so that equal hashes mean equal prefixes.
//
// Text mode cuts a canonical rendering of the request into fixed-size chunks
// of characters; token mode hashes fixed-size blocks of token ids. Either way
// block i's hash covers blocks 0..i: Hash(parent, block). The model and LoRA
// name fold into the root, so different models never share a hash.
package prefix

// Hash identifies a block and, through its chain, the whole prefix before it.
type Hash uint64
