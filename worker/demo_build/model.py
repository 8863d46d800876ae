"""Build a tiny, real llama-architecture model with random weights, offline; and the parts every demo model shares
(its BPE tokenizer with the ChatML template, its config, how it is saved).

A random model's output is noise, but it loads through the normal `mlx_lm.load` path and generates on the CPU in
milliseconds: the tests use it, and the worker builds one when the shipped, trained demo model (worker/demo/,
made by worker/demo_build/train.py) is missing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the functions below import them when called: slow imports)
    import mlx.nn as nn
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Sizes: "tiny" for tests (~0.1 M parameters), "mini" (~0.7 M) as a second, bigger model for the tests of several
# models, "small" (~25 M) to measure realistic CPU generation.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4},
    "mini": {"hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 256, "num_attention_heads": 4},
    "small": {"hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1408, "num_attention_heads": 8},
}

_CORPUS = """\
One request at a time. The queue keeps the GPU busy and the users informed.
A job waits in line, starts, streams its tokens, and ends completed, failed, cancelled or expired.
Users see their position in the queue and how long they will wait. The worker never works for nobody.
The quick brown fox jumps over the lazy dog while the model writes a short story about a patient robot.
Hello! How are you today? I am fine, thank you. What can I help you with? Tell me a joke about queues.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: , . ; : ! ? ( ) [ ] { } " ' - _ / \\ @ # $ % & *
"""


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `vocab_size` tokens learnt from `texts`, with the ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )


def llama_config(size: dict[str, int], tokenizer: PreTrainedTokenizerFast) -> dict[str, object]:
    """The config.json of a llama model of `size` over `tokenizer`'s vocabulary."""
    return {
        "model_type": "llama",
        **size,
        "rms_norm_eps": 1e-5,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }


def save(path: Path, model: nn.Module, tokenizer: PreTrainedTokenizerFast, config: dict[str, object]) -> Path:
    """Write the model's weights, its config and its tokenizer to `path`, as `mlx_lm.load` reads them."""
    from mlx_lm.utils import save_config, save_model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    # transformers 5 writes "TokenizersBackend", which older loaders do not know.
    config_file = path / "tokenizer_config.json"
    tok_config = json.loads(config_file.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config.setdefault("chat_template", CHATML)
    config_file.write_text(json.dumps(tok_config, indent=2))
    save_model(path, model)
    save_config(config, config_path=path / "config.json")
    return path


def make_demo_model(path: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write config.json, model.safetensors and tokenizer files for a random llama model to `path`."""
    import mlx.core as mx
    from mlx_lm.models import llama

    tokenizer = train_tokenizer([_CORPUS] * 4, vocab_size=512)
    config = llama_config(SIZES[size], tokenizer)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    save(path, model, tokenizer, config)
    logger.info("demo model (%s, random weights) written to %s", size, path)
    return Path(path)
