"""Makes the tiny random-weight Llama that `make test-vllm` serves with vLLM (no model hub is
reachable, and none is needed): a byte-level BPE tokenizer trained on a few sentences, a chat
template, and `LlamaForCausalLM` with random weights. Run with the vLLM venv's Python:

    .venv-vllm/bin/python tests/vllm/make_model.py .venv-vllm/tiny-llama

Does nothing when the folder already holds this version of the model. The shape is the smallest
vLLM's CPU attention takes: head dimension 64 (2 heads of a 128 hidden size; 16 is refused), one
KV head. Its answers are random bytes: sometimes invalid UTF-8, sometimes U+2028, never sense.

The build is deterministic (a fixed seed; the same files byte for byte on every run), but what
vLLM samples from it is not: the end-of-sequence token can come at any step, so a test that needs
a length asks for it with `ignore_eos`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

VERSION = "2"
"""Bump to rebuild every cached copy (2: positions for a 32,768-token context)."""

MAX_POSITIONS = 32768
"""The longest context it is served with (tests/vllm/upstreams.py's MAX_MODEL_LEN): vLLM refuses a
`--max-model-len` beyond it."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Each message between its role's marker and `<|end|>`. vLLM's `continue_final_message` cuts the
rendered prompt after the last message's text, so the model continues it."""

SENTENCES = [
    "Backfill runs batch lines in the spare capacity of a model server.",
    "The quick brown fox jumps over the lazy dog.",
    "A batch is a file of requests, one JSON object a line.",
    "Live traffic first: a batch line waits for a free seat.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation: ; , . ! ? ( ) [ ] { }",
]


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<s>", "</s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(SENTENCES * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "backfill-tiny-model.json").write_text(json.dumps({"version": VERSION}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ".venv-vllm/tiny-llama").resolve()
    stamp = out / "backfill-tiny-model.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("version") == VERSION:
        return 0
    print(f"make_model: building the tiny random-weight Llama in {out}", flush=True)
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
