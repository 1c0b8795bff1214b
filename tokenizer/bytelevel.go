package tokenizer

// byteRunes maps each byte to the printable rune GPT-2's byte-level BPE uses
// for it (bytes_to_unicode in openai/gpt-2 encoder.py): printable Latin-1
// bytes map to themselves, the rest to U+0100 upwards in byte order.
var byteRunes = func() (m [256]rune) {
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
			continue
		}
		m[b] = rune(256 + n)
		n++
	}
	return m
}()
