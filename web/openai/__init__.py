"""The OpenAI-compatible endpoints, every one a job in the same queue: chat and completions (chat.py), the Responses
API (responses.py), files (files.py) and batches (batches.py, run by batch_runner.py, which the app starts).

Each subject keeps its request models (*_schemas.py), its wire formats (bodies.py, response_body.py) and the same
answers as pydantic models for /openapi.json (*answers.py) beside its views. Nothing here is imported by the core
views; create_app (web/__init__.py) registers the blueprints.
"""
