"""Tiny random-weight models of every architecture the installed mlx-lm has, to serve through onelane and compare.

Each config is small, in the spirit of mlx-lm's own tests/test_models.py (its configs, made smaller where they are
large, and written for the architectures it has none for), with the vocabulary of the demo model's tokenizer
(worker/demo, 2,048 tokens), which every folder gets. `build(arch, folder)` writes a float32 folder whose weights
are the model class's own initialisation under a fixed seed (tuned to show a wrong cache: see _tuned); `alone(...)`
is mlx-lm's own greedy answer to a prompt; `Sweep` serves the folders through onelane's real worker and compares.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tasks.catalogue import SHIPPED_DEMO_MODEL

VOCAB = 2048  # the demo tokenizer's
SEED = 48
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# the shapes most configs share: two or four small layers, grouped-query attention
DENSE: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=1024,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
MOE: dict[str, Any] = dict(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
MLA: dict[str, Any] = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
DEEPSEEK: dict[str, Any] = dict(
    MOE, **MLA, n_routed_experts=4, n_shared_experts=1, n_group=2, topk_group=1, num_hidden_layers=3,
    first_k_dense_replace=1, routed_scaling_factor=1.0, norm_topk_prob=True,
)  # fmt: skip
ROPE_YARN = dict(
    type="yarn", beta_fast=32, beta_slow=1, factor=4, mscale=1.0, mscale_all_dim=1.0,
    original_max_position_embeddings=256,
)  # fmt: skip
GEMMA4_TEXT: dict[str, Any] = dict(
    hidden_size=128, num_hidden_layers=10, intermediate_size=128, num_attention_heads=4, head_dim=32,
    global_head_dim=64, rms_norm_eps=1e-6, vocab_size_per_layer_input=VOCAB, num_key_value_heads=1,
    num_kv_shared_layers=4, hidden_size_per_layer_input=32, sliding_window=8, sliding_window_pattern=5,
    final_logit_softcapping=30.0,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
    rope_parameters={
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_theta": 10000.0},
    },
)  # fmt: skip
QWEN3_NEXT: dict[str, Any] = dict(
    DENSE, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32, linear_num_value_heads=4,
    linear_num_key_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=3,
    partial_rotary_factor=0.5, full_attention_interval=4,
)  # fmt: skip
LLAMA4_SCALED = dict(
    rope_type="default", rope_theta=10000.0, llama_4_scaling_beta=0.1, original_max_position_embeddings=256
)
MAMBA: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, state_size=16, num_hidden_layers=2, conv_kernel=4, use_bias=False,
    use_conv_bias=True, time_step_rank=8,
)  # fmt: skip

#: model_type -> config (vocab_size is added, at the top and in a text_config): one per architecture module
CONFIGS: dict[str, dict[str, Any]] = {
    "Klear": dict(
        MOE, attention_bias=False, mlp_only_layers=[0], decoder_sparse_step=2, n_shared_experts=1,
        norm_topk_prob=True, num_key_value_heads=4,
    ),
    "afm7": dict(hidden_dim=64, num_layers=4, num_hidden_layers=4, num_kv_reuse_layers=2, num_heads=4, num_kv_heads=2),
    "afmoe": dict(
        MOE, num_hidden_layers=4, head_dim=16,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"], sliding_window=8,
    ),
    "apertus": dict(DENSE, mlp_bias=True, attention_bias=False, post_norm=True, qk_norm=True),
    "baichuan_m1": dict(DENSE, num_hidden_layers=4, sliding_window=8, sliding_window_layers=[0, 2], conv_window=2),
    "bailing_hybrid": dict(
        MOE, **MLA, num_hidden_layers=4, num_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
        layer_group_size=2, group_norm_size=1, routed_scaling_factor=1.0, head_dim=16,
    ),
    "bailing_moe": dict(MOE, num_hidden_layers=4, num_shared_experts=1, norm_topk_prob=True, first_k_dense_replace=2),
    "bailing_moe_linear": dict(
        MOE, num_hidden_layers=4, num_shared_experts=2, norm_topk_prob=True, num_key_value_heads=4,
        first_k_dense_replace=0, layer_group_size=2, group_norm_size=1,
    ),
    "bailing_moe_v3": dict(
        MOE, **MLA, num_hidden_layers=4, moe_shared_expert_intermediate_size=64, num_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, layer_group_size=2, head_dim=16,
    ),
    "bitnet": dict(DENSE),
    "cohere": dict(DENSE, layer_norm_eps=1e-5),
    "cohere2": dict(DENSE, num_hidden_layers=4, head_dim=16, sliding_window=8, sliding_window_pattern=4),
    "dbrx": dict(
        d_model=64, n_layers=2, n_heads=4,
        ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
        attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000},
    ),
    "deepseek": dict(MOE, n_routed_experts=4, n_shared_experts=1, num_attention_heads=8, num_key_value_heads=4),
    "deepseek_v2": dict(DEEPSEEK, rope_scaling=ROPE_YARN),
    "deepseek_v3": dict(DEEPSEEK, rope_scaling=ROPE_YARN),
    "deepseek_v32": dict(DEEPSEEK, rope_scaling=ROPE_YARN, index_n_heads=4, index_head_dim=32, index_topk=8),
    "deepseek_v41": dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=32, q_lora_rank=16, qk_rope_head_dim=8,
        o_groups=2, o_lora_rank=16, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
        rms_norm_eps=1e-6, sliding_window=8, index_n_heads=2, index_head_dim=16, index_topk=4, hc_mult=2,
        hc_sinkhorn_iters=4, max_position_embeddings=1024,
    ),
    "dots1": dict(
        MOE, num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1,
        norm_topk_prob=True, num_experts_per_tok=1, routed_scaling_factor=1.0,
    ),
    "ernie4_5": dict(DENSE, head_dim=None, use_bias=False, tie_word_embeddings=True),
    "ernie4_5_moe": dict(MOE, use_bias=False, moe_num_experts=4, moe_k=2),
    "exaone": dict(DENSE, num_layers=2, layer_norm_epsilon=1e-5),
    "exaone4": dict(
        DENSE, num_hidden_layers=4, head_dim=16, rope_scaling=None, sliding_window=8, sliding_window_pattern="LLGL",
        layer_types=["sliding_attention"] * 2 + ["full_attention", "sliding_attention"],
    ),
    "exaone_moe": dict(
        MOE, num_hidden_layers=4, head_dim=16, num_shared_experts=1, n_group=1, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"], is_moe_layer=[False, True, True, True],
    ),
    "falcon_h1": dict(
        hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_d_conv=4,
        mamba_n_groups=1, max_position_embeddings=1024,
    ),
    "falcon_mamba": dict(MAMBA),
    # (gear's conv_mixer layers are left out: transformers 5's config check, run as the tokenizer loads, refuses them)
    "gear": dict(
        DENSE, num_hidden_layers=3, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    ),
    "gemma": dict(DENSE, head_dim=16),
    "gemma2": dict(DENSE, head_dim=16, num_hidden_layers=4, sliding_window=8),
    "gemma3": dict(
        text_config=dict(
            hidden_size=64, num_hidden_layers=6, intermediate_size=128, head_dim=16, num_attention_heads=4,
            num_key_value_heads=1, sliding_window=8, sliding_window_pattern=3,
        ),
    ),
    "gemma3_text": dict(
        hidden_size=64, num_hidden_layers=6, intermediate_size=128, num_attention_heads=4, head_dim=16,
        rms_norm_eps=1e-4, num_key_value_heads=1, sliding_window=8, sliding_window_pattern=3,
    ),
    "gemma3n": dict(
        text_config=dict(
            model_type="gemma3n", hidden_size=128, num_hidden_layers=4, intermediate_size=128, num_attention_heads=4,
            head_dim=32, rms_norm_eps=1e-5, num_key_value_heads=2, num_kv_shared_layers=2,
            vocab_size_per_layer_input=VOCAB, sliding_window=8, max_position_embeddings=1024,
            rope_local_base_freq=10000.0, rope_theta=1000000.0, final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention"] * 2, activation_sparsity_pattern=[0.5, 0.5, 0.0, 0.0],
            hidden_size_per_layer_input=32, altup_num_inputs=4, altup_coef_clip=120.0, altup_correct_scale=True,
            altup_active_idx=0, laurel_rank=8,
        ),
    ),
    "gemma4": dict(text_config=dict(GEMMA4_TEXT, model_type="gemma4_text")),
    "gemma4_text": dict(GEMMA4_TEXT),
    "glm": dict(DENSE, head_dim=16),
    "glm4": dict(DENSE, attention_bias=False, head_dim=16, partial_rotary_factor=0.5),
    "glm4_moe": dict(
        MOE, num_hidden_layers=3, norm_topk_prob=True, n_group=2, head_dim=16, topk_group=1, n_shared_experts=1,
        n_routed_experts=4, routed_scaling_factor=1.0, first_k_dense_replace=1, rope_scaling=None, use_qk_norm=True,
        attention_bias=False, partial_rotary_factor=0.5,
    ),
    "glm4_moe_lite": dict(
        DEEPSEEK, num_key_value_heads=4, topk_method="noaux_tc", scoring_func="sigmoid", n_group=1,
        moe_layer_freq=1, partial_rotary_factor=1.0, attention_bias=False, rope_scaling=None,
        num_nextn_predict_layers=0,
    ),
    "glm_moe_dsa": dict(
        DEEPSEEK, index_head_dim=32, index_n_heads=4, index_topk=8, topk_method="noaux_tc", scoring_func="sigmoid",
        n_group=1, moe_layer_freq=1, attention_bias=False, rope_parameters={"rope_theta": 10000.0, "type": "default"},
    ),
    "gpt2": dict(n_ctx=1024, n_embd=64, n_head=4, n_layer=2, n_positions=1024, layer_norm_epsilon=1e-5),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_inner=128, n_head=4, n_positions=1024, layer_norm_epsilon=1e-5),
    "gpt_neox": dict(
        max_position_embeddings=1024, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, layer_norm_eps=1e-5,
        rotary_emb_base=10000, rotary_pct=0.25,
    ),
    "gpt_oss": dict(
        MOE, num_hidden_layers=4, num_local_experts=4, sliding_window=8, head_dim=16,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
    "gptj": dict(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=1024),
    "granite": dict(
        DENSE, logits_scaling=1.0, attention_multiplier=1.0, embedding_multiplier=1.0, residual_multiplier=1.0,
        attention_bias=False, mlp_bias=False,
    ),
    "granitemoe": dict(
        DENSE, logits_scaling=1.0, attention_multiplier=1.0, embedding_multiplier=1.0, residual_multiplier=1.0,
        attention_bias=False, num_local_experts=4, num_experts_per_tok=2,
    ),
    "granitemoehybrid": dict(
        DENSE, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, attention_bias=False,
        embedding_multiplier=1.0, attention_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=128, mamba_n_heads=8, mamba_d_head=16,
        mamba_proj_bias=False, mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1, mamba_conv_bias=False,
        layer_types=["mamba", "attention"] * 2,
    ),
    "helium": dict(DENSE, attention_bias=False, head_dim=16, mlp_bias=False),
    "hunyuan": dict(
        DENSE, num_hidden_layers=4, attention_bias=False, moe_topk=2, num_experts=2, num_shared_expert=1,
        use_mixed_mlp_moe=True, use_qk_norm=True, rope_scaling={"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
        use_cla=True, cla_share_factor=2,
    ),
    "hunyuan_v1_dense": dict(
        DENSE, use_qk_norm=True, rope_scaling={"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
    ),
    "internlm2": dict(DENSE),
    "internlm3": dict(DENSE),
    "iquestloopcoder": dict(DENSE, head_dim=16, loop_num=2, loop_window_size=8),
    "jamba": dict(
        DENSE, num_hidden_layers=4, attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1,
        expert_layer_period=2, mamba_d_conv=4, mamba_d_state=16, mamba_expand=2, num_experts=4,
        num_experts_per_tok=2,
    ),
    "kimi_k25": dict(text_config=dict(DEEPSEEK, model_type="deepseek_v3", rope_scaling=ROPE_YARN)),
    "kimi_k3": dict(
        text_config=dict(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
            linear_attn_config={"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4, "kda_layers": [1]},
            q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            num_experts=4, num_experts_per_token=2, moe_intermediate_size=64, first_k_dense_replace=1,
        ),
    ),
    "kimi_linear": dict(
        MOE, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
        linear_attn_config={"num_heads": 4, "head_dim": 16, "kda_layers": [1, 3]}, model_max_length=1024,
        num_experts=2, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    ),
    "kimi_vl": dict(
        text_config=dict(
            MOE, **MLA, num_hidden_layers=2, n_shared_experts=1, n_routed_experts=4, model_type="deepseek_v3",
        ),
    ),
    "laguna": dict(
        MOE, num_hidden_layers=4, head_dim=16, sliding_window=8, partial_rotary_factor=0.5,
        shared_expert_intermediate_size=64, moe_routed_scaling_factor=2.5, moe_router_score_func="sqrtsoftplus",
        layer_types=["full_attention"] + ["sliding_attention"] * 3, mlp_layer_types=["dense"] + ["sparse"] * 3,
        num_attention_heads_per_layer=[4, 4, 4, 4],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        },
    ),
    "lfm2": dict(
        DENSE, num_hidden_layers=4, norm_eps=1e-5, conv_bias=True, conv_L_cache=3, block_dim=64,
        block_ff_dim=128, block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
        full_attn_idxs=[1, 3],
    ),
    "lfm2-vl": dict(
        text_config=dict(
            DENSE, model_type="lfm2", num_hidden_layers=4, norm_eps=1e-5, conv_bias=False, conv_L_cache=3,
            block_dim=64, block_ff_dim=128, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=True, layer_types=["full_attention", "conv"] * 2,
        ),
    ),
    "lfm2_moe": dict(
        MOE, num_hidden_layers=4, norm_eps=1e-5, full_attn_idxs=[1, 3], conv_bias=True, conv_L_cache=3,
        num_dense_layers=1, norm_topk_prob=True, use_expert_bias=True,
    ),
    "lille-130m": dict(
        block_size=1024, n_layer=2, n_head=4, n_kv_heads=2, n_embd=64, layer_norm_eps=1e-5, rope_theta=10000.0,
    ),
    "llama": dict(DENSE),
    "llama4": dict(
        text_config=dict(
            DENSE, model_type="llama4", attention_bias=False, attention_chunk_size=8, head_dim=16,
            interleave_moe_layer_step=2, intermediate_size_mlp=128, num_experts_per_tok=1, num_local_experts=2,
            num_hidden_layers=4, rope_scaling=None, use_qk_norm=True,
        ),
    ),
    "llama4_text": dict(
        DENSE, num_hidden_layers=4, head_dim=16, intermediate_size_mlp=128, no_rope_layers=[0, 0, 1, 1],
        use_qk_norm=True,
    ),
    "longcat_flash": dict(
        **MLA, attention_method="MLA", zero_expert_type="identity", hidden_size=64, ffn_hidden_size=128, moe_topk=2,
        expert_ffn_hidden_size=64, n_routed_experts=2, zero_expert_num=2, num_layers=2, max_position_embeddings=1024,
        num_attention_heads=4, routed_scaling_factor=1.0, rms_norm_eps=1e-5, rope_theta=10000.0,
        mla_scale_q_lora=True, mla_scale_kv_lora=True, attention_bias=False,
    ),
    "longcat_flash_ngram": dict(
        **MLA, attention_method="MLA", zero_expert_type="identity", hidden_size=64, ffn_hidden_size=128, moe_topk=2,
        expert_ffn_hidden_size=64, n_routed_experts=2, zero_expert_num=2, num_layers=2, max_position_embeddings=1024,
        num_attention_heads=4, routed_scaling_factor=1.0, rms_norm_eps=1e-5, rope_theta=10000.0,
        mla_scale_q_lora=True, mla_scale_kv_lora=True, attention_bias=False,
    ),
    "mamba": dict(MAMBA),
    "mamba2": dict(
        num_heads=8, head_dim=16, hidden_size=64, intermediate_size=128, state_size=16, num_hidden_layers=2,
        layer_norm_epsilon=1e-5, conv_kernel=3, n_groups=2, use_bias=False, use_conv_bias=False,
        tie_word_embeddings=True, time_step_limit=[0.01, 10.0], time_step_rank="auto",
    ),
    "mellum": dict(
        MOE, num_hidden_layers=4, head_dim=16, norm_topk_prob=True, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={"full_attention": {"rope_theta": 500000.0}, "sliding_attention": {"rope_theta": 10000.0}},
    ),
    "mimo": dict(DENSE),
    "mimo_v2_flash": dict(
        MOE, num_hidden_layers=4, hybrid_layer_pattern=[0, 1, 0, 1], moe_layer_freq=[0, 1, 0, 1],
        add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False, sliding_window_size=8,
        n_shared_experts=1, n_routed_experts=4, routed_scaling_factor=None, topk_method="noaux_tc",
        scoring_func="sigmoid", norm_topk_prob=True, n_group=2, topk_group=1, layernorm_epsilon=1e-5,
        swa_rope_theta=10000.0, swa_num_attention_heads=4, swa_num_key_value_heads=2, head_dim=32, v_head_dim=16,
        swa_head_dim=32, swa_v_head_dim=16, partial_rotary_factor=0.5,
    ),
    "minicpm": dict(DENSE, dim_model_base=64, scale_depth=1.0, scale_emb=1.0),
    "minicpm3": dict(
        DENSE, **MLA, dim_model_base=64, scale_depth=1.0, scale_emb=1.0,
        rope_scaling={"original_max_position_embeddings": 1024},
    ),
    "minimax": dict(
        DENSE, num_key_value_heads=4, num_experts_per_tok=2, num_local_experts=4, shared_intermediate_size=64,
        rotary_dim=8,
    ),
    "minimax_m3_vl": dict(
        text_config=dict(
            hidden_size=64, intermediate_size=64, dense_intermediate_size=128, shared_intermediate_size=64,
            num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=1024, head_dim=16, mlp_layer_types=["dense", "sparse"],
        ),
    ),
    "ministral3": dict(DENSE, head_dim=16, rope_parameters=LLAMA4_SCALED),
    "mistral3": dict(text_config=dict(DENSE, model_type="mistral")),
    "mistral4": dict(
        DEEPSEEK, num_key_value_heads=4, rope_parameters=LLAMA4_SCALED,
    ),
    "mixtral": dict(DENSE, num_local_experts=4, num_experts_per_tok=2),
    "muse_glimmer": dict(DENSE, num_hidden_layers=4, head_dim=16, sliding_window=8),
    "muse_spark": dict(
        text_config=dict(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
            rms_norm_eps=1e-5, post_norm_eps=1e-8, rope_parameters={"rope_theta": 10000.0},
            layer_rope_theta=[10000.0, 10000.0, 10000.0, 0], layer_types=["sliding_attention"] * 3 + ["full_attention"],
            sliding_window=8, final_logit_softcapping=20.0, output_multiplier=0.2, num_local_experts=4,
            num_experts_per_tok=2, moe_hidden_size=32, moe_intermediate_size=64,
        ),
        audio_config={"out_hidden_size": 64},
    ),
    "nanbeige": dict(DENSE),
    "nanochat": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128),
    "nemotron": dict(DENSE, hidden_act="relu2", norm_eps=1e-5),
    "nemotron-nas": dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, rms_norm_eps=1e-5,
        block_configs=[
            {"attention": {"n_heads_in_group": 2, "no_op": False, "replace_with_linear": False},
             "ffn": {"ffn_mult": 1.3125, "no_op": False, "replace_with_linear": False}},
        ] * 2,
    ),
    "nemotron_h": dict(
        DENSE, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, attention_bias=False,
        mamba_num_heads=8, mamba_head_dim=16, mamba_proj_bias=False, ssm_state_size=16, conv_kernel=3, n_groups=2,
        time_step_limit=[0.0, float("inf")], mlp_bias=False, layer_norm_epsilon=1e-5, use_bias=False,
        use_conv_bias=True, residual_in_fp32=True, hybrid_override_pattern=["M", "*", "M", "-"],
    ),
    "olmo": dict(d_model=64, n_layers=2, mlp_hidden_size=128, n_heads=4, embedding_size=VOCAB),
    "olmo2": dict(DENSE),
    "olmo3": dict(DENSE, num_hidden_layers=4, head_dim=16, sliding_window=8),
    "olmo_hybrid": dict(
        DENSE, num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, linear_allow_neg_eigval=True, attention_bias=False,
    ),
    "olmoe": dict(MOE),
    "openelm": dict(
        head_dim=16, num_transformer_layers=2, model_dim=64, ffn_dim_divisor=16, num_query_heads=[4, 4],
        num_kv_heads=[2, 2], ffn_multipliers=[0.5, 1.0], normalize_qk_projections=True,
    ),
    "phi": dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.5,
        intermediate_size=128,
    ),
    "phi3": dict(DENSE),
    "phi3small": dict(
        hidden_size=64, dense_attention_every_n_layers=2, ff_intermediate_size=128, gegelu_limit=20.0,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, layer_norm_epsilon=1e-5,
    ),
    "phimoe": dict(
        DENSE, num_key_value_heads=4,
        rope_scaling={
            "long_factor": [1.0] * 8, "long_mscale": 1.0, "original_max_position_embeddings": 1024,
            "short_factor": [1.0] * 8, "short_mscale": 1.0, "type": "longrope",
        },
    ),
    "phixtral": dict(num_vocab=VOCAB, model_dim=64, num_heads=4, num_layers=2, rotary_dim=8),
    "pixtral": dict(text_config=dict(DENSE, model_type="llama")),
    "plamo": dict(DENSE, n_shared_head=2),
    "plamo2": dict(
        hidden_size=64, num_hidden_layers=4, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        hidden_size_per_head=16, mamba_d_state=16, mamba_d_conv=4, mamba_num_heads=4, mamba_step=2,
        rms_norm_eps=1e-5, max_position_embeddings=1024,
    ),
    "plamo3": dict(
        DENSE, num_hidden_layers=4, head_dim=16, window_size=8, sliding_window_pattern=2, rope_local_theta=10000.0,
    ),
    "qwen": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, kv_channels=16, intermediate_size=256),
    "qwen2": dict(DENSE),
    "qwen2_moe": dict(MOE, shared_expert_intermediate_size=128),
    "qwen2_vl": dict(text_config=dict(DENSE, model_type="qwen2")),
    "qwen3": dict(DENSE, head_dim=16),
    "qwen3_5": dict(text_config=dict(QWEN3_NEXT, model_type="qwen3_5")),
    "qwen3_5_moe": dict(
        text_config=dict(
            QWEN3_NEXT, model_type="qwen3_5_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
        ),
    ),
    "qwen3_moe": dict(
        MOE, head_dim=16, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
    ),
    "qwen3_next": dict(
        QWEN3_NEXT, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, shared_expert_intermediate_size=64,
        mlp_only_layers=[0], moe_intermediate_size=64,
    ),
    "qwen3_vl": dict(text_config=dict(DENSE, model_type="qwen3", head_dim=16)),
    "qwen3_vl_moe": dict(
        text_config=dict(
            MOE, model_type="qwen3_moe", head_dim=16, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        ),
    ),
    "recurrent_gemma": dict(
        hidden_size=64, attention_bias=False, conv1d_width=3, intermediate_size=128, logits_soft_cap=30.0,
        num_attention_heads=4, num_hidden_layers=3, num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
        attention_window_size=8, block_types=["recurrent", "recurrent", "attention"],
    ),
    "rwkv7": dict(
        hidden_size=64, intermediate_size=128, norm_eps=1e-5, head_dim=16, num_hidden_layers=2, a_low_rank_dim=8,
        v_low_rank_dim=8, gate_low_rank_dim=8, decay_low_rank_dim=8,
    ),
    "seed_oss": dict(DENSE, head_dim=16),
    "smollm3": dict(DENSE, no_rope_layer_interval=2),
    "solar_open": dict(
        MOE, num_hidden_layers=3, head_dim=16, n_shared_experts=1, n_routed_experts=4, routed_scaling_factor=1.0,
        first_k_dense_replace=1, norm_topk_prob=True, partial_rotary_factor=1.0,
    ),
    "spark2_5": dict(
        DENSE, num_hidden_layers=4, head_dim=16, sliding_window=8,
        rope_parameters={"sliding_attention": {"rope_theta": 10000.0}, "full_attention": {"rope_theta": 500000.0}},
    ),
    "stablelm": dict(DENSE, partial_rotary_factor=0.25, use_qkv_bias=True, layer_norm_eps=1e-5),
    "starcoder2": dict(DENSE),
    "step3p5": dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_attention_groups=2, head_dim=16,
        intermediate_size=128, rms_norm_eps=1e-5, rope_theta=[10000.0] * 4, sliding_window=8,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
        attention_other_setting={"num_attention_heads": 8, "num_attention_groups": 2},
        use_head_wise_attn_gate=True, moe_num_experts=4, moe_top_k=2, moe_intermediate_size=64,
        share_expert_dim=64, moe_layers_enum="1,2,3",
    ),
    "talkie": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16, intermediate_size=128),
    "telechat3": dict(DENSE),
    "youtu_llm": dict(DENSE, **MLA),
}  # fmt: skip

#: architectures whose tiny config cannot build on this machine's CPU, and why
SKIPPED: dict[str, str] = {
    "bitnet": "its BitLinear layers run a Metal kernel (mx.fast.metal_kernel): no Metal back-end on the CPU",
    "muse_spark": "its attention's fused q/k norm and RoPE (mlx_lm.kernels.qk_norm_rope) is a Metal kernel: no Metal "
    "back-end on the CPU",
    "phi3small": "mlx-lm alone crashes the process on the CPU (heap corruption: 'corrupted size vs. prev_size', "
    "'double free', a segfault) decoding after most prompt lengths (its block-sparse attention)",
    "olmo": "mlx_lm.models.olmo exits at import without the ai2-olmo package (hf_olmo), which onelane does not install",
    "prism_hadamard_qwen35": "a Hadamard pack: its config demands 2-bit affine weights and a manifest of packed "
    "modules, so there is no float32 random-weight form of it",
}


def architectures() -> list[str]:
    """Every architecture with a tiny config that is not skipped, sorted."""
    return sorted(set(CONFIGS) - set(SKIPPED))


def config(arch: str) -> dict[str, Any]:
    """The config.json of `arch`'s tiny model: its table entry with the demo vocabulary."""
    entry = json.loads(json.dumps(CONFIGS[arch]))  # a deep copy
    entry.update(model_type=arch, vocab_size=VOCAB, eos_token_id=2)
    if "text_config" in entry:
        entry["text_config"] = {"model_type": arch, **entry["text_config"], "vocab_size": VOCAB}
    return entry


def build(arch: str, folder: Path) -> Path:
    """Write `arch`'s tiny float32 model (config.json, model.safetensors: the class's own init under SEED, tuned) and
    the demo model's tokenizer into `folder`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    folder.mkdir(parents=True, exist_ok=True)
    settings = config(arch)
    model_class, args_class = _get_classes(settings)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(json.loads(json.dumps(settings))))
    model.set_dtype(mx.float32)
    weights = {name: _tuned(w) for name, w in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(settings, indent=1))
    for name in TOKENIZER_FILES:
        shutil.copy(SHIPPED_DEMO_MODEL / name, folder / name)
    return folder


def _tuned(weight: Any) -> Any:
    """The class's initial weight, made to show a wrong cache: one it sets to all zeros (MoE routers, convolutions,
    token-shift mixes, talkie's output head) is drawn at random instead, since zeros make its layer a no-op (or
    every answer token 0); and the token embeddings and output heads (VOCAB rows) are scaled by 0.1, since at their
    initial size the last token's own embedding outweighs what the layers add, so that many tiny models answer that
    token again whatever came before it (mamba then passes in a batch, where it is wrong). (Vectors stay: zero
    biases are the usual start.)"""
    import mlx.core as mx

    if not mx.issubdtype(weight.dtype, mx.floating):  # (bitnet's packed ternary weights)
        return weight
    if weight.ndim >= 2 and not mx.any(weight).item():
        weight = 0.1 * mx.random.normal(weight.shape, dtype=weight.dtype)
    if weight.ndim == 2 and weight.shape[0] == VOCAB:
        weight = 0.1 * weight
    return weight


@dataclass(frozen=True)
class Answer:
    """A greedy answer: its token ids and its text (through the tokenizer's streaming detokenizer)."""

    tokens: tuple[int, ...]
    text: str


def alone(model: Any, tokenizer: Any, prompt: list[int], max_tokens: int, prefill_step: int = 2048) -> Answer:
    """mlx-lm's own greedy answer to `prompt` alone (generate_step, its prompt read in chunks of `prefill_step`
    tokens: its default), every one of `max_tokens` tokens (no EOS)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    tokens = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens, prefill_step_size=prefill_step):
        tokens.append(int(token))
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in tokens:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return Answer(tuple(tokens), detokenizer.text)


def first_difference(expected: Answer, text: str, tokenizer: Any) -> int | None:
    """The first of `expected`'s tokens the served `text` departs from (None: it is the same text)."""
    if text == expected.text:
        return None
    for n in range(len(expected.tokens) + 1):
        if not text.startswith(tokenizer.decode(list(expected.tokens[: n + 1]))):
            return n
    return len(expected.tokens)


# --- serving them all through onelane, and comparing ---------------------------------------------------------

#: three prompts of different lengths, sent at once: a batch pads them, a sliding window (8 tokens) turns over
PROMPTS = (
    "hi",
    "the queue keeps the gpu busy and users informed",
    "a job waits, starts, streams its tokens, then ends. " * 4,
)
MAX_TOKENS = 12


@dataclass(frozen=True)
class Served:
    """One job's end, as onelane tells it."""

    status: str
    text: str
    error: str | None
    started_at: float | None
    finished_at: float | None
    accepted: int = 0  # proposed tokens its steps kept (speculation, worker/batch/speculation.py)


@dataclass(frozen=True)
class Row:
    """One architecture through onelane: its cache types, the three jobs' ends, and mlx-lm's answers alone."""

    arch: str
    caches: tuple[str, ...]
    served: tuple[Served, ...]
    expected: tuple[Answer, ...]
    first_wrong: tuple[int | None, ...]  # per prompt: the first of mlx-lm's tokens its answer departs from

    @property
    def mode(self) -> str:
        """What onelane did with the model: `batched` (the jobs ran together), `alone` (one after another) or
        `refused` (no job ran)."""
        runs = sorted((s.started_at, s.finished_at) for s in self.served if s.started_at and s.finished_at)
        if not runs:
            return "refused"
        overlapped = any(later[0] < earlier[1] for earlier, later in zip(runs, runs[1:]))
        return "batched" if overlapped else "alone"

    @property
    def equal(self) -> bool:
        return all(s.status == "completed" for s in self.served) and not any(n is not None for n in self.first_wrong)

    def failure(self) -> str:
        """What went wrong, prompt by prompt (empty when every answer is mlx-lm's); one line for errors alike."""
        errors = {f"{s.status}: {s.error}" for s in self.served if s.status != "completed"}
        if len(errors) == 1 and all(s.status != "completed" for s in self.served):
            return f"all {len(self.served)} jobs {errors.pop()}"
        parts = []
        for prompt, served, wrong in zip(PROMPTS, self.served, self.first_wrong):
            if served.status != "completed":
                parts.append(f"{len(prompt.split())}-word prompt {served.status}: {served.error}")
            elif wrong is not None:
                parts.append(f"{len(prompt.split())}-word prompt wrong from token {wrong}")
        return "; ".join(parts)


def build_all(root: Path, archs: list[str]) -> dict[str, Path]:
    """Every architecture's tiny folder under `root`, built once (a folder already there is kept)."""
    folders = {}
    for arch in archs:
        folder = root / arch
        if not (folder / "model.safetensors").exists():
            build(arch, folder)
        folders[arch] = folder
    return folders


class Sweep:
    """onelane's real worker (in this process) serving every tiny model from one catalog, one architecture at a
    time: three prompts at once, greedy, MAX_TOKENS past EOS; and mlx-lm's own answers alone, to compare."""

    def __init__(self, settings: Any, folders: dict[str, Path], stall_s: float) -> None:
        from tasks.catalogue import ModelConfig
        from tasks.store import Store

        catalog = tuple(ModelConfig(name=arch, path=str(folder)) for arch, folder in folders.items())
        self.settings = settings.model_copy(update={"model": None, "models": catalog, "stall_s": stall_s})
        self.folders = folders
        self.store = Store.connect(self.settings)
        self.fatal: list[str] = []
        self.worker: Any = None
        self.rows: dict[str, Row] = {}  # the architectures run so far

    def start(self) -> Sweep:
        from worker.main import GpuWorker

        self.worker = GpuWorker(self.settings, None, self.fatal.append, idle_wait_ms=50)
        assert self.worker.start(), "the worker did not start"
        return self

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def run(self, arch: str, timeout_s: float = 60.0) -> Row:
        """Serve `arch`'s three prompts at once, then answer them with mlx-lm alone; the row of the two."""
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import load_model

        served = self.serve(arch, timeout_s)
        model = load_model(self.folders[arch])[0]
        caches = tuple(sorted({type(c).__name__ for c in make_prompt_cache(model)}))
        tokenizer = self.tokenizer
        expected = tuple(alone(model, tokenizer, tokenizer.encode(p), MAX_TOKENS) for p in PROMPTS)
        wrong = tuple(first_difference(e, s.text, tokenizer) for e, s in zip(expected, served))
        row = Row(arch, caches, served, expected, wrong)
        self.rows[arch] = row
        return row

    @cached_property
    def tokenizer(self) -> Any:
        """mlx-lm's tokenizer of the demo model, which every tiny folder has (loaded once: it takes longer than
        a tiny model)."""
        from mlx_lm.utils import load_tokenizer

        return load_tokenizer(SHIPPED_DEMO_MODEL, eos_token_ids=2)

    def serve(self, arch: str, timeout_s: float) -> tuple[Served, ...]:
        """The three jobs, admitted together as one request's are, awaited (with the supervisor's stall watch:
        a job that makes no progress for stall_s is ended failed, as the supervisor ends it)."""
        import time

        from tasks.broker import Doorbell
        from tasks.job import JobSpec, SamplingParams, new_job_id

        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        jobs = [(new_job_id(), JobSpec(owner="sweep", model=arch, prompt=p, params=params)) for p in PROMPTS]
        self.store.admit_all(jobs, 600, doorbell=Doorbell.ring(self.worker.broker, jobs[0][0]))
        ids = [job_id for job_id, _ in jobs]
        deadline = time.monotonic() + timeout_s
        while not all(self.store.get(i).status.ended for i in ids):
            assert time.monotonic() < deadline, f"{arch}: jobs not ended within {timeout_s:.0f} s"
            self.store.upkeep.watch_device()  # (what the supervisor does, every round)
            time.sleep(0.02)  # a poll: the three jobs' ends, and the stall watch, have no one event to wait on
        return tuple(self._served(self.store.get(i)) for i in ids)

    @staticmethod
    def _served(job: Any) -> Served:
        t = job.timings
        error = f"{job.error.type}: {job.error.message}" if job.error else None
        return Served(job.status.value, job.output, error, t.started_at, t.finished_at, t.accepted_tokens)
