"""The architectures onelane imports from GGUF, each as a record: which tensors a layer holds under llama.cpp's names
(`blk.N.attn_q.weight`), what mlx-lm calls them, their shapes in the metadata's sizes, and what llama.cpp's converter
did to them that the import undoes (convert_hf_to_gguf.py: LlamaModel permutes Q and K rows for its rope; Gemma's
norms are stored as 1 + w; Phi-3 keeps Q, K, V and gate, up fused, as mlx-lm does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from worker.gguf.header import GgufError, described

#: A part: (mlx-lm's name under `model.layers.N.`, its dims in GGUF's order, as names of the sizes in `sizes()`).
Part = tuple[str, tuple[str, ...]]

ATTENTION: dict[str, Part] = {
    "attn_q.weight": ("self_attn.q_proj.weight", ("hidden", "q")),
    "attn_k.weight": ("self_attn.k_proj.weight", ("hidden", "kv")),
    "attn_v.weight": ("self_attn.v_proj.weight", ("hidden", "kv")),
    "attn_output.weight": ("self_attn.o_proj.weight", ("q", "hidden")),
}
MLP: dict[str, Part] = {
    "ffn_gate.weight": ("mlp.gate_proj.weight", ("hidden", "ff")),
    "ffn_up.weight": ("mlp.up_proj.weight", ("hidden", "ff")),
    "ffn_down.weight": ("mlp.down_proj.weight", ("ff", "hidden")),
}
NORMS: dict[str, Part] = {
    "attn_norm.weight": ("input_layernorm.weight", ("hidden",)),
    "ffn_norm.weight": ("post_attention_layernorm.weight", ("hidden",)),
}
LLAMA = {**NORMS, **ATTENTION, **MLP}
QKV_BIASES: dict[str, Part] = {
    "attn_q.bias": ("self_attn.q_proj.bias", ("q",)),
    "attn_k.bias": ("self_attn.k_proj.bias", ("kv",)),
    "attn_v.bias": ("self_attn.v_proj.bias", ("kv",)),
}
QK_NORMS: dict[str, Part] = {
    "attn_q_norm.weight": ("self_attn.q_norm.weight", ("head",)),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", ("head",)),
}
GEMMA2_NORMS: dict[str, Part] = {  # Gemma 2 normalizes before and after both attention and the MLP
    "attn_norm.weight": ("input_layernorm.weight", ("hidden",)),
    "post_attention_norm.weight": ("post_attention_layernorm.weight", ("hidden",)),
    "ffn_norm.weight": ("pre_feedforward_layernorm.weight", ("hidden",)),
    "post_ffw_norm.weight": ("post_feedforward_layernorm.weight", ("hidden",)),
}
PHI3: dict[str, Part] = {
    **NORMS,
    "attn_qkv.weight": ("self_attn.qkv_proj.weight", ("hidden", "qkv")),
    "attn_output.weight": ("self_attn.o_proj.weight", ("q", "hidden")),
    "ffn_up.weight": ("mlp.gate_up_proj.weight", ("hidden", "ff2")),  # gate rows first, then up: as mlx-lm splits
    "ffn_down.weight": ("mlp.down_proj.weight", ("ff", "hidden")),
}
TOP: dict[str, Part] = {
    "token_embd.weight": ("model.embed_tokens.weight", ("hidden", "vocab")),
    "output_norm.weight": ("model.norm.weight", ("hidden",)),
    "output.weight": ("lm_head.weight", ("hidden", "vocab")),  # absent when tied to the embedding
}
SKIPPED = ("rope_freqs.weight",)  # Llama 3's rope divisors: config.json's rope_scaling instead (worker/gguf/rope.py)


@dataclass(frozen=True)
class Arch:
    """What an architecture's GGUF holds, and how it becomes mlx-lm's."""

    name: str  # general.architecture, and the prefix of its metadata keys
    model_type: str  # mlx-lm's
    layer: dict[str, Part]
    permuted: bool = False  # Q and K rows in llama.cpp's interleaved rope order: put back in halves
    norm_offset: float = 0.0  # stored norm weights are this plus mlx-lm's
    untied: bool = True  # may hold an output tensor of its own (Gemma never does: mlx-lm's has no lm_head)
    width_heads: bool = False  # mlx-lm's model takes head_dim as width / heads, whatever the file says
    defaults: dict[str, Any] = field(default_factory=dict)  # config values the metadata may leave out

    @property
    def top(self) -> dict[str, Part]:
        return TOP if self.untied else {k: v for k, v in TOP.items() if k != "output.weight"}


ARCHS = {
    arch.name: arch
    for arch in (
        Arch("llama", "llama", LLAMA, permuted=True),
        Arch("mistral", "llama", LLAMA, permuted=True),  # (most Mistral files say `llama`: the same model)
        Arch("qwen2", "qwen2", {**LLAMA, **QKV_BIASES}, defaults={"rope_theta": 1000000.0}),
        Arch("qwen3", "qwen3", {**LLAMA, **QK_NORMS}, defaults={"rope_theta": 1000000.0}),
        Arch("gemma", "gemma", LLAMA, norm_offset=1.0, untied=False),
        Arch("gemma2", "gemma2", {**GEMMA2_NORMS, **ATTENTION, **MLP}, norm_offset=1.0, untied=False),
        Arch("phi3", "phi3", PHI3, width_heads=True),
    )
}


def sizes(config: dict[str, Any]) -> dict[str, int]:
    """The sizes a part's dims are named by, from mlx-lm's config."""
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    ff = config["intermediate_size"]
    return {"hidden": config["hidden_size"], "vocab": config["vocab_size"], "head": config["head_dim"], "q": q,
            "kv": kv, "qkv": q + 2 * kv, "ff": ff, "ff2": 2 * ff}  # fmt: skip


def extras(arch: Arch, meta: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The config values one architecture's mlx-lm model reads beyond the common ones."""
    key = arch.name
    if arch.name == "gemma2":
        # GGUF has no query_pre_attn_scalar: llama.cpp scales queries by head_dim, but by width / heads for the
        # 27B (46 layers), as Google's reference does
        wide = config["num_hidden_layers"] == 46
        return {
            "attn_logit_softcapping": positive(meta, f"{key}.attn_logit_softcapping", 50.0),
            "final_logit_softcapping": positive(meta, f"{key}.final_logit_softcapping", 30.0),
            "query_pre_attn_scalar": config["hidden_size"] // config["num_attention_heads"]
            if wide
            else config["head_dim"],
        }
    if arch.name == "phi3":
        rope = whole(meta, f"{key}.rope.dimension_count", config["head_dim"])
        if rope > config["head_dim"] or rope % 2:
            raise GgufError(f"its {key}.rope.dimension_count is {rope}, for heads of {config['head_dim']}")
        return {
            "partial_rotary_factor": rope / config["head_dim"],
            "original_max_position_embeddings": whole(
                meta, f"{key}.rope.scaling.original_context_length", config["max_position_embeddings"]
            ),
        }
    return {}


def whole(meta: dict[str, Any], key: str, default: int | None = None, least: int = 1) -> int:
    """A whole-number metadata value, at least `least` (a GgufError naming the key when not)."""
    value = meta.get(key, default)
    if value is None:
        raise GgufError(f"its metadata has no {key}")
    if type(value) is not int:
        raise GgufError(f"its {key} is {described(value)}, not a whole number")
    if value < least:
        owner = key.partition(".")[0]
        raise GgufError(
            f"its {key} is {value}; {f'a {owner} model' if owner in ARCHS else 'a model'}'s is at least {least}"
        )
    return value


def positive(meta: dict[str, Any], key: str, default: float) -> float:
    """A positive, finite metadata number."""
    value = meta.get(key, default)
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise GgufError(f"its {key} is {described(value)}, not a positive number")
    return float(value)
