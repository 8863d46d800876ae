"""Embeddings and rerank on the queue: `POST /v1/embeddings` (OpenAI's shape), `POST /v1/rerank` and
`POST /v2/rerank` (the shape vLLM, llama.cpp, Jina and Cohere clients send), blueprint `pooling`. One module,
routes.py, holds their requests, their answers (and their pydantic models, and the embeddings body a batch's result
line takes) and their routes."""
