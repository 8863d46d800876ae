"""A tokenizer llguidance cannot read (it panics on a token over 1,024 bytes, a BaseException that would end the
worker's thread) fails the grammar's job with a clear error, and only that: found by the agent model's first draft."""

from __future__ import annotations

import pytest


def test_a_tokenizer_llguidance_cannot_read_is_a_grammar_error_every_time():
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from worker.demo_build.model import train_tokenizer
    from worker.grammar import GrammarError, Grammars

    # Given a model's tokenizer holding one token of 1,100 bytes
    tokenizer = train_tokenizer(["hello world, and goodbye"] * 10, vocab_size=300)
    tokenizer.add_tokens(["x" * 1100])
    grammars = Grammars(TokenizerWrapper(tokenizer), frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")}))

    # When a grammar is compiled for it, twice, Then each is a GrammarError naming the cause (not a panic)
    for _ in range(2):
        with pytest.raises(GrammarError, match="cannot be read by the grammar engine"):
            grammars.matcher('start: "yes" | "no"')
