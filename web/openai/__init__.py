"""The OpenAI-compatible endpoints, every one a job in the same queue, one room per API: chat/ (chat and completions,
/v1/models), responses/ (the Responses API), batches/ (the Files and Batch APIs, and the batch runner, which the app
starts) and pooling/ (embeddings and rerank).

Each room names its modules by their layer, alike in every room that has the layer: routes.py (its views),
schemas.py (its request models), body.py (its wire format for a job's answer), answers.py (the same answers as
pydantic models for /openapi.json), and where the API has them input.py and stream.py. What several rooms share
stays here: schemas.py (strict models, unsupported fields refused by name, service tiers, tools and formats as a
grammar), choices.py (one job per answer, admitted and followed together) and logprobs.py (log probabilities as
OpenAI shows them). Nothing here is imported by the core views; create_app (web/__init__.py) registers the blueprints.
"""
