"""A tiny GLM-5-Next (`glm5_next`), with GLM-4.1V's added tokens and chat template (tests/vlms/glm.py: its image part
<|begin_of_image|><|image|><|end_of_image|>, which mlx-vlm's own Glm5NextProcessor expands to the grid / 4 <|image|>s;
its Glm5NextImageProcessor reads processor_config.json's `image_processor`, patch 14, merge 2, at least 16 tokens an
image): a vision tower (hidden 32, 2 layers) and a text model without positions (NoPE) of hidden 64: a linear
attention layer, then a DeepSeek sparse-attention one (MLA, 2 heads; an indexer of 2 heads choosing 16 keys in pools
of 4), the second's MLP a mixture of 4 routed experts (2 a token) and a shared one, the residual stream kept as 2
hyper-connection copies. Keys as the hub names them (`model.language_model.*`, `model.visual.*`, `lm_head.*`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, write_folder
from tests.vlms.glm import EOS, IDS, MERGE, PATCH, TEMPLATE, TOKENS
from tests.vlms.glm_kin import hub_key

TEXT: dict[str, Any] = dict(
    model_type="glm5_next_text", vocab_size=max(IDS.values()) + 1, hidden_size=64, intermediate_size=128,
    moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
    n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=0,
    qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_kpool=4, index_head_dim=16, index_n_heads=2,
    layer_types=["linear_attention", "full_attention"], linear_head_dim=16, linear_num_heads=2, hc_mult=2,
    first_k_dense_replace=1, eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False,
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="glm5_next_vision", depth=2, hidden_size=32, num_heads=2, intermediate_size=64, image_size=56,
    patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=64,
    projection_intermediate_size=64,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Glm5NextForConditionalGeneration"], model_type="glm5_next", text_config=TEXT,
    vision_config=VISION, image_token_id=IDS["<|image|>"], video_token_id=IDS["<|video|>"],
    image_start_token_id=IDS["<|begin_of_image|>"], image_end_token_id=IDS["<|end_of_image|>"],
    video_start_token_id=IDS["<|begin_of_video|>"], video_end_token_id=IDS["<|end_of_video|>"],
    tie_word_embeddings=False, eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip
IMAGE_PROCESSOR: dict[str, Any] = dict(patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE, max_image_tokens=64)


def build_glm5_next(folder: Path) -> Path:
    """A tiny GLM-5-Next (see the module's docstring)."""
    settings = dict(processor_class="Glm5NextProcessor", image_token="<|image|>", video_token="<|video|>")
    write_folder(
        folder,
        Family(
            module="glm5_next", config=CONFIG, tokens=TOKENS, template=TEMPLATE, eos=EOS, tokenizer=settings,
            processor=dict(processor_class="Glm5NextProcessor", image_processor=IMAGE_PROCESSOR), prepend_bos=False,
            hub_key=hub_key,
        ),
    )  # fmt: skip
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"glm5_next": build_glm5_next}
