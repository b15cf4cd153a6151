"""Make the tiny Llama model the real-engine tier serves: random weights, a tokenizer trained here, a chat
template. Nothing is downloaded; the same seed gives the same files.

    python scripts/make-tiny-model.py DIR      # needs numpy and tokenizers (the real-engine venvs have both)

The weights are written as a bf16 safetensors file by hand (the format is a JSON header and raw bytes), so no
torch is needed. Shapes follow transformers' LlamaForCausalLM; ~0.8M parameters. DIR/.stamp records the
generator's hash: an unchanged DIR is left as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB, MAX_POS = 128, 2, 4, 2, 32, 256, 2048, 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = ("the model serves tokens from a cache on every box while the engine loads weights and the router "
         "sends requests to replicas that answer with text about gpus memory ports and logs").split()


def corpus(rng: np.random.Generator, lines: int = 4000) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 30)))) + "." for _ in range(lines)]


def tokenizer(rng: np.random.Generator) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    return tok


def bf16(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 bytes, rounded to nearest even."""
    bits = a.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16).tobytes()


def tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    out = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "model.norm.weight": np.ones(HIDDEN, np.float32),
           "lm_head.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": w(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": w(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, INTERMEDIATE),
        })
    return out


def write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(arrays):
        data = bf16(arrays[name])
        header[name] = {"dtype": "BF16", "shape": list(arrays[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for blob in blobs:
            f.write(blob)


def config(tok: Tokenizer) -> dict[str, object]:
    eos = tok.token_to_id("<|im_end|>")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "torch_dtype": "bfloat16", "bos_token_id": tok.token_to_id("<|endoftext|>"), "eos_token_id": eos,
    }


def tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE, "model_max_length": MAX_POS,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }


def make(dest: Path) -> None:
    rng = np.random.default_rng(20261201)
    tok = tokenizer(rng)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))
    cfg = config(tok)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    (dest / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}, indent=2))
    write_safetensors(dest / "model.safetensors", tensors(rng))


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: make-tiny-model.py DIR", file=sys.stderr)
        return 2
    dest = Path(sys.argv[1]).expanduser()
    stamp = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    if (dest / ".stamp").is_file() and (dest / ".stamp").read_text() == stamp:
        print(f"tiny model up to date: {dest}")
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tiny-model-"))
    make(work)
    (work / ".stamp").write_text(stamp)
    if dest.exists():
        for child in dest.iterdir():
            child.unlink()
        dest.rmdir()
    os.rename(work, dest)
    print(f"made tiny model in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
