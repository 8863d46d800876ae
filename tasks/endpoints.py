"""The endpoints a batch's lines may address (OpenAI's Batch API): each a request model in the web's batch reader
(web/openai/batches/input.py), each offered by `onelane batch`. Nothing here imports redis: the command line reads it
(`onelane web` must let gevent patch ssl before redis is imported)."""

from __future__ import annotations

from typing import Literal, get_args

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
ENDPOINTS: tuple[Endpoint, ...] = get_args(Endpoint)
