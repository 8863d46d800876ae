"""A tiny Jina VLM (`jina_vlm`: mlx-vlm's model_type for "jvlm", as jinaai/jina-vlm ships it): a SigLIP-style tower
(14x14 patches, hidden 32, 2 layers, the features of both its layers), the attention-pooling connector (2x2 patches)
and MLP projector, and a Qwen3-style text model (hidden 64, 2 layers, q/k norms; the image tokens in its 128-token
additional vocabulary). mlx-vlm's JinaVLMProcessor builds its image processor with the hub's constants whatever the
folder says: 378x378 crops (up to 12, and the whole image), and the image tokens' ids Qwen's (<im_patch> 151665,
<im_start>, <im_end>, <im_col> 151668), so the text model's vocabulary is Qwen's size here too (151,665 ids and the
additional 128; the demo tokenizer's vocabulary is padded to as many with pieces no text tokenizes to, so that
every id the text model draws decodes, and the image tokens added there as Qwen's tokenizer has them). It writes, where the template's <|image|> is, each crop's
rows of <im_patch> ended by <im_col> between <im_start> and <im_end>, and gives the model the places of the patches'
features (`image_input_idx`), which `get_input_embeddings` ADDS to those tokens' embeddings: its config's image
token (<|image|>) is never in the prompt. The template is Qwen's ChatML; <|im_end|> ends an answer. Its config.json
holds the sizes under the names mlx-vlm reads them by (the hub's nest them in block configs, which mlx-vlm's load
replaces with its defaults when a text_config is present). Keys as the hub's: `vision_model.*`, `vl_connector.*`,
`language_model.*`, `lm_head.weight`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, END, Family, write_folder

QWEN_IMAGE_IDS = 151665  # the first of the image tokens' ids, constants of mlx-vlm's image processor for it
IMAGE_TOKENS = ["<im_patch>", "<im_start>", "<im_end>", "<im_col>"]  # (151665 on, as Qwen's tokenizer has them)
TEXT: dict[str, Any] = dict(
    model_type="jina_vlm", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=QWEN_IMAGE_IDS, additional_vocab_size=128, intermediate_size=128, rms_norm_eps=1e-6,
    rope_theta=1000000.0, max_position_embeddings=4096, use_qk_norm=True, tie_word_embeddings=False,
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="jina_vlm", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16, patch_size=14,
    image_size=378, intermediate_size=64, layer_norm_eps=1e-6, vit_layers=[-1, -2], output_size=64,
    pooling_h=2, pooling_w=2, connector_hidden_size=128,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["JinaVLMForConditionalGeneration"], model_type="jvlm", text_config=TEXT, vision_config=VISION,
    vocab_size=QWEN_IMAGE_IDS, bos_token_id=DEMO_IDS[END], eos_token_id=DEMO_IDS[END], pad_token_id=0,
    image_token_index=QWEN_IMAGE_IDS + 4 + 271, torch_dtype="float32",
)  # fmt: skip
#: Qwen's ChatML (the message's content a string: mlx-vlm writes <|image|> into it)
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _hub_key(name: str) -> str:
    return name.removeprefix("language_model.") if name.startswith("language_model.lm_head") else name


def build_jina_vlm(folder: Path) -> Path:
    """A tiny Jina VLM (see the module's docstring)."""
    built = _build(folder)
    path = built / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"<unused_{i}>": i for i in range(len(vocab), QWEN_IMAGE_IDS)})
    for token_id, token in enumerate(IMAGE_TOKENS, start=QWEN_IMAGE_IDS):
        vocab[token] = token_id
        entry = dict(id=token_id, content=token, single_word=False, lstrip=False, rstrip=False, normalized=False)
        tokenizer["added_tokens"].append(dict(entry, special=True))
    path.write_text(json.dumps(tokenizer, ensure_ascii=False))
    return built


def _build(folder: Path) -> Path:
    return write_folder(
        folder,
        Family(
            module="jina_vlm",
            config=CONFIG,
            tokens=[],
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"jina_vlm": build_jina_vlm}
