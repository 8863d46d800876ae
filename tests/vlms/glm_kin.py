"""Tiny random-weight folders of GLM-4V's kin (M-RoPE: positions that depend on the image), built offline as
tests/vlms/glm.py builds GLM-4.1V (read its docstring: the same added tokens, chat template, image processor, tower
of patch 14, merge 2, and text model's sizes), with the hub's key names (`model.language_model.*`, `model.visual.*`,
`lm_head.*`: mlx-vlm's sanitize maps them back; a routed MoE's experts stacked as mlx-vlm's conversions hold them).

- `glm4v_moe` (GLM-4.5V / GLM-4.6V, zai-org/GLM-4.5V's layout): the text model's second layer a mixture of 4 routed
  experts (2 a token, sigmoid scores) and a shared one. mlx-vlm initialises the router's weight to zeros (a
  placeholder for the checkpoint's), which would tie every expert's score: it is drawn from a seeded normal.
- `glm_ocr` (zai-org/GLM-OCR's layout): the tower's merger and a dense text model whose whole head rotates in three
  sections; mlx-vlm's own GlmOcrProcessor with its numpy Glm46VImageProcessor.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, write_folder
from tests.vlms.glm import EOS, GLM4V, IMAGE_PROCESSOR, TEMPLATE, TEXT, TOKENS, VISION


def hub_key(name: str) -> str:
    """A GLM-4V kin's weight as the hub names it."""
    for mine, hub in (("language_model.model.", "model.language_model."), ("vision_tower.", "model.visual.")):
        if name.startswith(mine):
            return hub + name.removeprefix(mine)
    return name.removeprefix("language_model.")  # (lm_head)


def drawn(suffix: str) -> Callable[[dict[str, Any]], None]:
    """A weights hook drawing every weight whose name ends with `suffix` from a seeded normal (a placeholder mlx-vlm
    initialises to a constant)."""

    def draw(weights: dict[str, Any]) -> None:
        import mlx.core as mx

        for n, name in enumerate(sorted(k for k in weights if k.endswith(suffix))):
            shape = weights[name].shape
            weights[name] = mx.random.normal(shape, key=mx.random.key(n)) * shape[-1] ** -0.5

    return draw


def _glm(module: str, config: dict[str, Any], processor: str, **over: Any) -> Callable[[Path], Path]:
    """A builder of a GLM-4V kin's folder: `config` with GLM-4.1V's tokens, template and image processor."""

    def build(folder: Path) -> Path:
        settings = dict(processor_class=processor, image_token="<|image|>", video_token="<|video|>")
        family = Family(
            module=module, config=config, tokens=TOKENS, template=TEMPLATE, eos=EOS, tokenizer=settings,
            processor=dict(processor_class=processor), image_processor=dict(IMAGE_PROCESSOR, processor_class=processor),
            prepend_bos=False, hub_key=hub_key, **over,
        )  # fmt: skip
        return write_folder(folder, family)

    return build


GLM4V_MOE: dict[str, Any] = dict(
    GLM4V, architectures=["Glm4vMoeForConditionalGeneration"], model_type="glm4v_moe",
    text_config=dict(
        TEXT, model_type="glm4v_moe_text", head_dim=16, moe_intermediate_size=32, norm_topk_prob=True, n_group=1,
        topk_group=1, n_shared_experts=1, n_routed_experts=4, routed_scaling_factor=1.0, num_experts_per_tok=2,
        first_k_dense_replace=1, use_qk_norm=False, tie_word_embeddings=False,
    ),
    vision_config=dict(VISION, model_type="glm4v_moe"),
)  # fmt: skip
GLM_OCR: dict[str, Any] = dict(
    GLM4V, architectures=["GlmOcrForConditionalGeneration"], model_type="glm_ocr",
    image_start_token_id=GLM4V["vision_start_token_id"], image_end_token_id=GLM4V["vision_end_token_id"],
    text_config=dict(
        model_type="glm_ocr_text", vocab_size=TEXT["vocab_size"], hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
        rms_norm_eps=1e-5, eos_token_id=EOS, pad_token_id=TEXT["pad_token_id"], rope_parameters=dict(
            rope_type="default", mrope_section=[2, 3, 3], partial_rotary_factor=1.0, rope_theta=10000.0,
        ),
    ),
    vision_config=dict(
        {k: v for k, v in VISION.items() if k != "torch_dtype"}, model_type="glm_ocr_vision", attention_bias=True
    ),
)  # fmt: skip

ARCHS: dict[str, Callable[[Path], Path]] = {
    "glm4v_moe": _glm("glm4v_moe", GLM4V_MOE, "Glm46VMoEProcessor", weights=drawn("mlp.gate.weight")),
    "glm_ocr": _glm("glm_ocr", GLM_OCR, "GlmOcrProcessor"),
}
