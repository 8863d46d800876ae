"""A tiny nanoLLaVA (`llava_bunny`: mlx-vlm's model_type "llava-qwen2", as qnguyenvan/nanoLLaVA ships it, Bunny's
layout): a SigLIP tower (hidden 32, 2 layers; mlx-vlm's own image processor resizes every image to 384x384, and its
model asserts the tower's 729 patches of 14x14), the two-layer projector and a Qwen2 text model (hidden 64, 2 layers,
tied embeddings). There is no processor of its own: mlx-vlm tokenizes the text around the template's `<image>` and
writes ONE token -200 (the config's image_token_index, outside the vocabulary) in its place, and
`get_input_embeddings` puts the image's 729 features there: its embeddings outnumber its prompt's ids (an
"expanding" model, worker/vision_reading.py). The template is ChatML (Qwen's), the image's `<image>\\n` before the
text; <|im_end|> ends an answer. Keys as the hub's: `model.*` (the text model), `model.vision_tower.*`,
`model.mm_projector.0/2.*`, `lm_head.weight`. Its config's `auto_map` is empty: the hub's names remote code,
which transformers would offer to run (mlx-vlm's config class needs the field)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, write_folder

TEXT: dict[str, Any] = dict(
    model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=DEMO_VOCAB, rope_theta=1000000.0,
    max_position_embeddings=4096, tie_word_embeddings=True, attention_bias=True,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    TEXT, architectures=["LlavaQwen2ForCausalLM"], model_type="llava-qwen2", text_config=TEXT,
    auto_map={}, mm_hidden_size=32,
    mm_projector_type="mlp2x_gelu", mm_vision_tower="google/siglip-so400m-patch14-384", image_token_index=-200,
    vision_config=dict(
        model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, image_size=384, patch_size=14, layer_norm_eps=1e-6,
    ),
    eos_token_id=DEMO_IDS[END], torch_dtype="float32",
)  # fmt: skip
#: ChatML, as nanoLLaVA's tokenizer has it
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _hub_key(name: str) -> str:
    if name == "language_model.model.lm_head.weight":  # (mlx-vlm's model keeps one, tied or not)
        return "lm_head.weight"
    if name.startswith("language_model.model."):
        return "model." + name.removeprefix("language_model.model.")
    return "model." + name.replace("mm_projector.linear_1", "mm_projector.0").replace("linear_2", "2")


def build_llava_bunny(folder: Path) -> Path:
    """A tiny nanoLLaVA (see the module's docstring)."""
    return write_folder(
        folder,
        Family(
            module="llava_bunny",
            config=CONFIG,
            tokens=[],
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"llava_bunny": build_llava_bunny}
