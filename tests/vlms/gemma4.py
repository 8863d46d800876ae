"""A tiny Gemma 4 (`gemma4`, as google/gemma-4-E2B-it ships it, without its audio tower): its vision encoder (native
aspect ratio in 8x8 patches pooled 2x2, at most 4 soft tokens an image: hidden 32, 2 layers, 2-D RoPE) and its text
model as tests/tiny_archs.py builds Gemma 4's for mlx-lm (hidden 128, 10 layers, sliding windows of 8 with a global
layer in 5, the last 4 sharing KV, per-layer inputs of 32). mlx-vlm's Gemma4Processor resizes an image to whole
16-pixel blocks within its 16 patches, so images of other shapes give prompts of other lengths: an image part renders
<|image|>, which the processor expands to <|image>, its soft tokens, <image|>. Added tokens: <|turn> 2048, <turn|>
(its answers' end), <|image>, <image|>, <|image|> (the image token), <|audio>, <audio|>, <|audio|>, <|video|>; the
tokenizer prepends <|im_start|> as Gemma's prepends <bos>; vocab_size_per_layer_input is the tokenizer's length (a
smaller one makes mlx-vlm read past its per-layer table). Keys as mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_archs import GEMMA4_TEXT
from tests.vlms.folder import DEMO_VOCAB, Family, added_ids, write_folder

TOKENS = ["<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>"]
IDS = added_ids(TOKENS)
EOS = IDS["<turn|>"]
VOCAB = DEMO_VOCAB + len(TOKENS)
PATCH, POOL, SOFT = 8, 2, 4
TEXT: dict[str, Any] = dict(
    GEMMA4_TEXT, model_type="gemma4_text", vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, tie_word_embeddings=True,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Gemma4ForConditionalGeneration"], model_type="gemma4", text_config=TEXT,
    vision_config=dict(
        model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, global_head_dim=16, patch_size=PATCH, position_embedding_size=64,
        pooling_kernel_size=POOL, default_output_length=SOFT,
    ),
    audio_config=None, vocab_size=VOCAB, image_token_id=IDS["<|image|>"], audio_token_id=IDS["<|audio|>"],
    video_token_id=IDS["<|video|>"], boi_token_id=IDS["<|image>"], eoi_token_id=IDS["<image|>"],
    boa_token_id=IDS["<|audio>"], eoa_token_id=IDS["<audio|>"], hidden_size=TEXT["hidden_size"], pad_token_id=0,
    vision_soft_tokens_per_image=SOFT, eos_token_id=[EOS], tie_word_embeddings=True, torch_dtype="float32",
)  # fmt: skip
#: Gemma 4's template's turns
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\n' }}{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<turn|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}"
)
NAMED = dict(
    image_token="<|image|>", boi_token="<|image>", eoi_token="<image|>", audio_token="<|audio|>",
    boa_token="<|audio>", eoa_token="<audio|>",
)  # fmt: skip
PROCESSOR: dict[str, Any] = dict(
    processor_class="Gemma4Processor", image_seq_length=SOFT,
    image_processor=dict(
        image_processor_type="Gemma4ImageProcessor", patch_size=PATCH, max_soft_tokens=SOFT,
        pooling_kernel_size=POOL, do_resize=True, do_rescale=True, do_normalize=False, rescale_factor=1 / 255,
    ),
)  # fmt: skip


def build_gemma4(folder: Path) -> Path:
    """A tiny Gemma 4 (gemma-4-E2B-it's layout, without audio)."""
    return write_folder(
        folder,
        Family(
            module="gemma4",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=[EOS],
            tokenizer=dict(NAMED, extra_special_tokens=NAMED, eos_token="<turn|>", processor_class="Gemma4Processor"),
            processor=PROCESSOR,
            image_processor=dict(PROCESSOR["image_processor"], processor_class="Gemma4Processor"),
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"gemma4": build_gemma4}
