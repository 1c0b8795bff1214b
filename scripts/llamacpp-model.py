"""Writes a small random-weight llama-architecture model for llama-server.

Run by scripts/llamacpp.sh with the gguf-py of the llama.cpp release it
builds. The model: 2 layers, hidden 128, 4 heads, F16, random weights
(seeded), the tokenizer of the release's vocab-only ggml-vocab-phi-3.gguf,
and a Phi-3.5-style chat template (Phi-3's own template drops system
messages; this one keeps them, as the Phi-3.5 form of the same markup does).

Random weights can sample any token, and llama-server ends a stream with an
in-band error when a sampled token is markup or a lone byte. So the model is
built never to sample them: every token embedding carries a constant 1.0 in
dimension 0, which the residual stream keeps (the layers' weights are small),
so after the final RMS norm dimension 0 is about +11; the output row of every
token that is not a NORMAL token has -4 there, a logit near -45, which
llama-server's default top-k never keeps. Normal tokens share the rest almost
uniformly, so the model babbles and never ends a reply before max_tokens.
"""

import argparse
import sys

import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and message['content'] %}"
    "{{ '<|system|>\n' + message['content'] + '<|end|>\n' }}"
    "{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\n' + message['content'] + '<|end|>\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

N_LAYER = 2
N_EMBD = 128
N_HEAD = 4
N_FF = 256
N_CTX = 8192


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", required=True, help="the release's gguf-py directory")
    ap.add_argument("--vocab", required=True, help="the release's models/ggml-vocab-phi-3.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=43)
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # the release's own

    reader = gguf.GGUFReader(args.vocab)
    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("kvrouter-test-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    types = None
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or name == "tokenizer.chat_template":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(name, value, vtype, sub)
        if name == "tokenizer.ggml.token_type":
            types = np.array(value)
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if types is None or n_vocab == 0:
        sys.exit(f"{args.vocab}: no tokenizer.ggml.tokens or token_type")
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(args.seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    embd = rand(n_vocab, N_EMBD)
    embd[:, 0] = 1.0
    out = rand(n_vocab, N_EMBD)
    out[:, 0] = 0.0
    out[types != int(gguf.TokenType.NORMAL), 0] = -4.0
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", out)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + t + ".weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", rand(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    banned = int((types != int(gguf.TokenType.NORMAL)).sum())
    print(f"{args.out}: {n_vocab} tokens ({banned} never sampled), {N_LAYER} layers, hidden {N_EMBD}")


if __name__ == "__main__":
    main()
